"""The table of transitions an invocation's outcome moves its run by."""

from __future__ import annotations

import pytest

from stepline_server.engine.runs import ENDED, RunStatus
from stepline_server.engine.transitions import (
    InvocationStatus,
    Outcome,
    Transition,
    ends_run,
    run_status_of,
    transition_of,
)

TABLE = [
    ("completed", Transition.END, RunStatus.COMPLETED),
    ("failed", Transition.END, RunStatus.FAILED),
    ("cancelled", Transition.END, RunStatus.CANCELLED),
    ("suspended", Transition.SUSPEND, None),
    ("continued", Transition.NEXT_GENERATION, None),
    ("delivery_failed", Transition.RETRY_DELIVERY, None),
    ("stale", Transition.NONE, None),
]


@pytest.mark.parametrize(("status", "transition", "ended"), TABLE)
def test_each_outcome_moves_its_run_by_one_transition(
    status: str, transition: Transition, ended: RunStatus | None
) -> None:
    assert transition_of(status) is transition
    assert ends_run(status) is (ended is not None)
    if ended is None:
        with pytest.raises(ValueError, match="does not end its run"):
            run_status_of(status)
    else:
        assert run_status_of(status) is ended and ended in ENDED


def test_the_table_covers_every_status_and_nothing_else() -> None:
    assert {InvocationStatus(s) for s, _, _ in TABLE} == set(InvocationStatus)
    with pytest.raises(ValueError):
        transition_of("timedOut")  # a time limit ends a run without an invocation's outcome


def test_an_outcome_takes_its_status_as_text_and_says_its_history_event() -> None:
    outcome = Outcome("delivery_failed", http_status=503, duration_ms=12, reason="refused")
    assert outcome.status is InvocationStatus.DELIVERY_FAILED
    assert outcome.ended_event() == {
        "type": "invocation.ended",
        "deployment_id": None,
        "http_status": 503,
        "duration_ms": 12,
        "data": {"outcome": "delivery_failed", "error": "refused"},
    }
    with pytest.raises(ValueError):
        Outcome("finished")
