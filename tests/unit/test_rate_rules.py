"""Rate limit rules: when the runs waiting under a sliding-window limit may start."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from stepline_server.engine.rates import RateLimit, room, start_times

T0 = datetime(2026, 1, 1, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


def s(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def in_window_ending(at: datetime, starts: list[datetime], period: timedelta) -> int:
    """How many of ``starts`` fall in the window (at - period, at]."""
    return sum(1 for x in starts if at - period < x <= at)


def test_an_empty_window_lets_limit_runs_start_now_and_spreads_the_rest() -> None:
    """Limit 3 a minute, nothing started yet, 7 waiting: 3 now, 3 a minute later, 1 after two."""
    times = start_times(RateLimit(3, MINUTE), [], s(0), 7)
    assert times == [s(0)] * 3 + [s(60)] * 3 + [s(120)]
    assert room(times, s(0)) == 3


def test_a_slot_frees_one_period_after_the_start_that_took_it() -> None:
    """Starts at 0 s and 20 s under limit 2 a minute: at 30 s the next run may start at 60 s,
    the one after at 80 s (a sliding window, not a fixed minute)."""
    times = start_times(RateLimit(2, MINUTE), [s(0), s(20)], s(30), 3)
    assert times == [s(60), s(80), s(120)]
    assert room(times, s(30)) == 0


def test_starts_older_than_the_period_do_not_count() -> None:
    """A start exactly one period ago has left the window (t - period, t]."""
    times = start_times(RateLimit(1, MINUTE), [s(0)], s(60), 2)
    assert times == [s(60), s(120)]
    assert room(times, s(60)) == 1


def test_only_the_room_left_starts_now() -> None:
    """Limit 5, two started in the window: three may start now, the fourth waits for the first
    start to leave the window."""
    times = start_times(RateLimit(5, MINUTE), [s(10), s(40)], s(50), 4)
    assert room(times, s(50)) == 3
    assert times[3] == s(70)


def test_more_starts_than_the_limit_wait_for_enough_of_them_to_leave() -> None:
    """Limit lowered to 2 while 4 runs started in the window: the next start waits until only
    one of them is left in it."""
    times = start_times(RateLimit(2, MINUTE), [s(1), s(2), s(3), s(4)], s(5), 1)
    assert times == [s(63)]


def test_nothing_waiting_gives_no_times() -> None:
    """No runs waiting: no times, no room taken."""
    assert start_times(RateLimit(2, MINUTE), [s(0)], s(1), 0) == []
    assert room([], s(1)) == 0


def test_the_times_given_never_break_the_limit_in_any_window() -> None:
    """However many wait and however the past starts fell (more than the limit among them), a
    run started at its time never finds ``limit`` runs already started in the window ending
    then, and no run is left without a time."""
    for limit in (1, 2, 3, 7):
        for past in ([], [s(0)], [s(0), s(1), s(59)], [s(x) for x in range(0, 60, 5)]):
            now = s(59.5)
            times = start_times(RateLimit(limit, MINUTE), past, now, 25)
            assert len(times) == 25 and times == sorted(times) and times[0] >= now
            everything = [*past, *times]
            for t in times:
                assert in_window_ending(t, everything, MINUTE) <= limit, (limit, past, t)
