"""Rules pinned at their real defaults and bounds, so a change to any of them fails a test: the
delivery backoff's jitter, Retry-After (0 included), the replay guard's window and cap, the
history cache's byte accounting, and a child's own error code reaching its parent."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from stepline import protocol
from stepline._history import HistoryCache, size_of
from stepline._signing import DEFAULT_MAX_AGE, ReplayGuard
from stepline_server.engine import runs as rules
from stepline_server.invoke.client import parse_retry_after

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def _delay(failures: int, retry_after: float | None = None, jitter: bool = True) -> int:
    decision = rules.on_delivery_failure(
        failures_so_far=failures,
        failing_since=NOW - timedelta(seconds=1),
        now=NOW,
        window_seconds=24 * 3600,
        reason="refused",
        http_status=503,
        retry_after_seconds=retry_after,
        jitter=jitter,
    )
    assert decision.retry
    return decision.delay_ms


def test_the_delivery_backoff_keeps_its_size_under_jitter() -> None:
    """With the default jitter, the n-th failure waits 80% to 100% of 1 s doubling (never a
    few milliseconds): jitter scales the delay, it does not replace it; the cap is 5 min."""
    random.seed(7)
    for failures in range(0, 12):
        base = min(rules.DELIVERY_BACKOFF_CAP_MS, 1000 * 2**failures)
        seen = [_delay(failures) for _ in range(200)]
        assert min(seen) >= 0.8 * base - 1, (failures, min(seen))
        assert max(seen) <= base
        assert max(seen) - min(seen) > 0.05 * base  # it does vary
    assert _delay(30, jitter=False) == rules.DELIVERY_BACKOFF_CAP_MS == 5 * 60 * 1000


def test_retry_after_is_honoured_zero_included() -> None:
    """An app's Retry-After sets the next try: 0 means now, 7 means seven seconds, whatever
    the backoff would have been."""
    assert parse_retry_after("0") == 0.0
    assert _delay(5, retry_after=parse_retry_after("0")) == 0
    assert _delay(0, retry_after=parse_retry_after("7")) == 7000
    assert parse_retry_after("soon") is None
    assert _delay(3, retry_after=None, jitter=False) == 8000


def test_the_replay_guard_refuses_a_body_for_twice_its_window_and_keeps_its_cap() -> None:
    """A signed body seen once is refused again for twice the signature window (a timestamp
    may be that far either side of now): a second later, a minute later, just before the end;
    after it, it is new again. Past 100,000 remembered bodies the oldest expired go first, and
    the guard never holds more than its cap."""
    assert DEFAULT_MAX_AGE == 300
    guard = ReplayGuard()
    assert guard.max_entries == 100_000
    assert guard.first_time(b"invocation", now=1000.0)
    for later in (1.0, 60.0, 2 * DEFAULT_MAX_AGE - 0.5):
        assert not guard.first_time(b"invocation", now=1000.0 + later), later
    assert guard.first_time(b"invocation", now=1000.0 + 2 * DEFAULT_MAX_AGE + 0.5)

    small = ReplayGuard(max_age=10, max_entries=3)
    for n in range(3):
        assert small.first_time(b"body-%d" % n, now=0.0)
    assert small.first_time(b"body-3", now=1.0)  # full: the oldest goes, the new one is kept
    assert len(small._seen) == 3
    assert not small.first_time(b"body-3", now=2.0)


def _record(name: str, output: object, position: int) -> protocol.StepRecord:
    return protocol.StepRecord(
        name=name, kind="run", status="completed", position=position, attempt=1, output=output
    )


async def test_the_history_cache_counts_the_bytes_it_keeps() -> None:
    """The cache counts each kept history's bytes once: keeping adds them, forgetting and
    replacing take them away, and past its budget the oldest runs go first."""
    records = [_record("a", "x" * 1000, 0), _record("b", "y" * 2000, 1)]
    whole = sum(size_of(r) for r in records)
    cache = HistoryCache(max_bytes=3 * whole)

    async def no_fetch(request: protocol.InvokeRequest) -> list[protocol.StepRecord]:
        raise AssertionError("nothing to fetch")

    def request(run: str, inv: str) -> protocol.InvokeRequest:
        return protocol.InvokeRequest(
            runId=run, workflow="w", invocationId=inv, token="t", apiUrl="http://127.0.0.1/",
            attempt=1, steps=records,
        )  # fmt: skip

    await cache.complete(request("r1", "i1"), no_fetch)
    assert cache.size == whole
    await cache.complete(request("r1", "i2"), no_fetch)  # the same run again: replaced
    assert cache.size == whole
    for run in ("r2", "r3"):
        await cache.complete(request(run, "i1"), no_fetch)
    assert cache.size == 3 * whole and len(cache) == 3
    await cache.complete(request("r4", "i1"), no_fetch)  # over budget: r1, the oldest, goes
    assert cache.size == 3 * whole and len(cache) == 3
    cache.forget("r4")
    assert cache.size == 2 * whole
    cache.forget("r4")  # forgetting twice takes nothing more
    assert cache.size == 2 * whole


def test_a_childs_own_error_code_reaches_its_parent() -> None:
    """A child that failed with its own code hands that code to the parent's invoke step;
    only a child that ended without one gets ``child_<status>``."""
    _, _, error = rules.child_outcome(
        "c1", "failed", None, {"code": "card_declined", "message": "no"}
    )
    assert error is not None and error["code"] == "card_declined"
    assert error["childStatus"] == "failed" and "no" in error["message"]
    _, _, bare = rules.child_outcome("c2", "timedOut", None, None)
    assert bare is not None and bare["code"] == "child_timedOut"
    status, output, none = rules.child_outcome("c3", "completed", {"ok": 1}, None)
    assert (status, output, none) == ("completed", {"ok": 1}, None)
