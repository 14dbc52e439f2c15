"""Long-poll waiters: an end notified after watching began is never lost."""

from __future__ import annotations

from stepline_server.loops.waiters import RunWaiters


async def test_an_end_between_the_read_and_the_wait_is_kept() -> None:
    """The route watches before it reads the run, so an end that arrives while it reads (or
    before it waits) is already set when it waits."""
    waiters = RunWaiters()
    with waiters.watch("run-1") as ended, waiters.watch("run-2") as other:
        waiters.ended("run-1")
        assert ended.is_set()
        assert not other.is_set()
    waiters.ended("run-1")  # nobody watches any more: nothing to wake, nothing kept
    with waiters.watch("run-1") as again:
        assert not again.is_set()


async def test_wake_all_has_every_watcher_look_again() -> None:
    """After the listener reconnects (ends may have been missed), every watcher wakes."""
    waiters = RunWaiters()
    with waiters.watch("a") as a, waiters.watch("b") as b:
        waiters.wake_all()
        assert a.is_set() and b.is_set()
    with waiters.watch("a") as fresh:
        assert not fresh.is_set()
