"""Parked executions: which records a parked execution can take in, and the bounds of the
store that keeps them (how many, how long, the oldest first)."""

from __future__ import annotations

import time
from typing import Any

from stepline._engine import Invocation
from stepline._parked import DEFAULT_MAX_RUNS, DEFAULT_MAX_SECONDS, ParkedRuns, adoptable
from stepline.protocol import StepRecord
from tests.unit.test_replay_check import definition_of
from tests.unit.test_sdk_engine import Recorder, record, request


async def _wf(ctx: Any, input: Any) -> Any:
    return None


def _parked() -> Invocation:
    invocation = Invocation(definition_of(_wf), request(), Recorder(), may_park=True)
    invocation.parked = True
    return invocation


def _sleep(name: str, status: str, position: int = 0) -> StepRecord:
    return record(name, "sleep", status, position)


def _reached(*names: str) -> Any:
    return lambda name: name in names


NAP = {"nap": object()}


def test_a_parked_execution_takes_in_its_ended_sleeps() -> None:
    """The sleeps that completed end (in the order of the records); one still sleeping is
    taken in as it is; a step it reached that completed or failed meanwhile is adopted."""
    sleeps = {"a": object(), "b": object(), "c": object()}
    changed = [
        _sleep("b", "completed", 1),
        _sleep("c", "sleeping", 2),
        _sleep("a", "completed", 0),
        record("cb", "callback", "completed", 3),
        record("job", "run", "failed", 4),
    ]
    assert adoptable(changed, sleeps, _reached("cb", "job"), sent=["b", "cb"]) == ["b", "a"]


def test_a_parked_execution_replays_on_anything_else() -> None:
    """None (replay) when a sleep ended any other way, a step it never reached changed, a
    step it reached has not ended, no sleep ends, or a step its answer reported is missing
    (the answer was lost)."""
    done = _sleep("nap", "completed")
    assert adoptable([done], NAP, _reached(), sent=[]) == ["nap"]
    assert adoptable([done], NAP, _reached(), sent=["nap"]) == ["nap"]
    assert adoptable([_sleep("nap", "cancelled")], NAP, _reached(), sent=[]) is None
    assert adoptable([done, record("new", "run", "completed", 1)], NAP, _reached(), []) is None
    assert adoptable([done, record("job", "run", "running", 1)], NAP, _reached("job"), []) is None
    assert adoptable([_sleep("nap", "sleeping")], NAP, _reached(), sent=[]) is None
    assert adoptable([], NAP, _reached(), sent=[]) is None
    assert adoptable([done], NAP, _reached(), sent=["nap", "lost"]) is None


def test_parked_runs_keep_their_defaults_and_count_nothing_at_first() -> None:
    """256 executions at most, none longer than 10 minutes; nothing parked or resumed."""
    parked = ParkedRuns()
    assert (DEFAULT_MAX_RUNS, DEFAULT_MAX_SECONDS) == (256, 600.0)
    assert (parked.max_runs, parked.max_seconds) == (256, 600.0)
    assert len(parked) == 0 and parked.resumed == 0


def test_a_parked_execution_is_taken_once() -> None:
    """Taking a run's execution gives it and no longer keeps it; another run's is left."""
    parked = ParkedRuns()
    one, two = _parked(), _parked()
    parked.keep("r1", one)
    parked.keep("r2", two)
    assert len(parked) == 2
    assert parked.take("r1") is one
    assert parked.take("r1") is None
    assert len(parked) == 1 and one.parked and two.parked


def test_parking_again_lets_the_earlier_execution_go() -> None:
    """A run parked again keeps the newer execution and lets the earlier one go; parking
    the same one again keeps it."""
    parked = ParkedRuns()
    first, second = _parked(), _parked()
    parked.keep("r", first)
    parked.keep("r", first)
    assert first.parked and len(parked) == 1
    parked.keep("r", second)
    assert not first.parked and second.parked
    assert parked.take("r") is second


def test_past_max_runs_the_oldest_go_first() -> None:
    """Past ``max_runs`` the oldest parked execution is let go; with no room, none is kept."""
    parked = ParkedRuns(max_runs=2)
    a, b, c = _parked(), _parked(), _parked()
    for run_id, invocation in (("a", a), ("b", b), ("c", c)):
        parked.keep(run_id, invocation)
    assert len(parked) == 2
    assert not a.parked and b.parked and c.parked
    assert parked.take("a") is None and parked.take("b") is b

    one = ParkedRuns(max_runs=1)
    kept = _parked()
    one.keep("x", kept)
    assert len(one) == 1 and kept.parked

    none = ParkedRuns(max_runs=0)
    dropped = _parked()
    none.keep("x", dropped)
    assert len(none) == 0 and not dropped.parked


def test_an_execution_parked_too_long_is_let_go() -> None:
    """One parked longer than ``max_seconds`` is let go when a run is taken; a younger one
    stays."""
    parked = ParkedRuns(max_seconds=0.05)
    old = _parked()
    parked.keep("old", old)
    time.sleep(0.1)
    young = _parked()
    parked.keep("young", young)
    assert parked.take("other") is None
    assert not old.parked and young.parked
    assert len(parked) == 1
    assert parked.take("young") is young


def test_clear_lets_every_execution_go() -> None:
    parked = ParkedRuns()
    a, b = _parked(), _parked()
    parked.keep("a", a)
    parked.keep("b", b)
    parked.clear()
    assert len(parked) == 0 and not a.parked and not b.parked
