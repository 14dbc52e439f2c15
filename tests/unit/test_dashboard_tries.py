"""A step's tries read from a run's history, for its timeline on the dashboard."""

from __future__ import annotations

from typing import Any

from stepline_server.ui.timeline import Try, tries

ERROR = {"type": "ValueError", "message": "boom", "code": "step_failed"}


def event(seq: int, kind: str, step: str | None = "pay", **data: Any) -> dict[str, Any]:
    return {
        "seq": seq,
        "at": f"2026-12-03T10:00:{seq:02d}Z",
        "type": kind,
        "stepName": step,
        "data": {"kind": "run", **data},
    }


def test_a_step_that_failed_then_succeeded_has_two_tries() -> None:
    """Each try has its start, end and outcome; the failed one its error and backoff."""
    found = tries(
        [
            event(1, "run.started", None),
            event(2, "step.started", attempt=1),
            event(3, "step.retrying", attempt=1, error=ERROR, delayMs=500),
            event(4, "step.started", attempt=2),
            event(5, "step.completed", attempt=2),
        ]
    )
    assert found == {
        "pay": [
            Try(1, "2026-12-03T10:00:02Z", "2026-12-03T10:00:03Z", "retried", ERROR, 500),
            Try(2, "2026-12-03T10:00:04Z", "2026-12-03T10:00:05Z", "completed"),
        ]
    }


def test_a_try_started_again_under_its_number_counts_once() -> None:
    """A try whose outcome was never recorded runs again as the same attempt: one try."""
    found = tries(
        [
            event(1, "step.started", attempt=1),
            event(2, "step.started", attempt=1),
            event(3, "step.failed", attempt=1, error=ERROR),
        ]
    )
    assert found["pay"] == [
        Try(1, "2026-12-03T10:00:02Z", "2026-12-03T10:00:03Z", "failed", ERROR),
    ]


def test_a_step_started_over_by_a_retry_of_its_run_keeps_its_new_tries() -> None:
    """Retrying the run from the step starts it at try 1 again: the earlier tries go."""
    found = tries(
        [
            event(1, "step.started", attempt=1),
            event(2, "step.retrying", attempt=1, error=ERROR, delayMs=10),
            event(3, "step.started", attempt=2),
            event(4, "step.failed", attempt=2, error=ERROR),
            event(5, "run.retried", None),
            event(6, "step.started", attempt=1),
        ]
    )
    assert found["pay"] == [Try(1, "2026-12-03T10:00:06Z")]


def test_a_new_generation_starts_without_tries_and_other_steps_have_none() -> None:
    """Tries are this generation's; sleeps and values have none."""
    found = tries(
        [
            event(1, "step.started", attempt=1),
            event(2, "step.completed", attempt=1),
            event(3, "run.continuedAsNew", None),
            {**event(4, "step.sleeping", "nap"), "data": {"kind": "sleep", "attempt": 1}},
            event(5, "step.started", "ship", attempt=1),
        ]
    )
    assert found == {"ship": [Try(1, "2026-12-03T10:00:05Z")]}
