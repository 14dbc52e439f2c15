"""Step rules: what each step update the SDK reports writes (the step's row, its history event,
callbacks, child runs, event waits and log lines), field by field."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from stepline.protocol import Action, ErrorInfo, LogLevel, LogLine, StepKind, StepUpdate
from stepline_server.engine import error_codes
from stepline_server.engine.steps import (
    ChildStart,
    InvalidUpdate,
    StepChange,
    callback_id,
    child_run_id,
    plan_updates,
)

RUN = str(uuid.UUID(int=7))


def _update(name: str, kind: StepKind, action: Action, **fields: Any) -> StepUpdate:
    return StepUpdate(name=name, kind=kind, action=action, **fields)


def _row(**fields: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "name": "s", "kind": "run", "status": "running", "attempt": 1, "output": None,
        "error": None, "delay_ms": None, "timeout_ms": None, "at_ms": None, "ended": False,
        "callback_id": None, "child_run_id": None, "event_name": None, "match": None,
    }  # fmt: skip
    row.update(fields)
    return row


def test_a_start_and_a_completion_write_the_short_rows() -> None:
    """A start is a running step of its attempt (at least 1); a completion ends the step with
    its output; each appends its event with the kind and the attempt."""
    plan = plan_updates(
        RUN,
        [
            _update("a", StepKind.RUN, Action.START, attempt=0),
            _update("b", StepKind.RUN, Action.START, attempt=2),
            _update("c", StepKind.RUN, Action.COMPLETE, attempt=3, output={"n": 1}),
            _update("d", StepKind.VALUE, Action.COMPLETE, output=False),
        ],
    )
    assert [c.row() for c in plan.changes] == [
        _row(name="a"),
        _row(name="b", attempt=2),
        _row(name="c", status="completed", attempt=3, output={"n": 1}, ended=True),
        _row(name="d", kind="value", status="completed", output=False, ended=True),
    ]
    assert plan.events == [
        {"type": "step.started", "step_name": "a", "data": {"kind": "run", "attempt": 1}},
        {"type": "step.started", "step_name": "b", "data": {"kind": "run", "attempt": 2}},
        {"type": "step.completed", "step_name": "c", "data": {"kind": "run", "attempt": 3}},
        {"type": "step.completed", "step_name": "d", "data": {"kind": "value", "attempt": 1}},
    ]
    assert plan.callbacks == plan.children == plan.event_waits == plan.logs == []
    assert plan.logs_dropped == 0
    assert not plan.needs_transaction


def test_a_failure_and_a_retry_keep_the_error_with_a_code() -> None:
    """A failure ends the step with the app's error (its code kept, step_failed when it has
    none, a plain error when it sent nothing); a retry keeps the error and the delay (never
    negative) and does not end the step."""
    own = ErrorInfo(type="KeyError", message="no such key", code="no_key")
    plan = plan_updates(
        RUN,
        [
            _update("own", StepKind.RUN, Action.FAIL, attempt=0, error=own),
            _update("plain", StepKind.RUN, Action.FAIL, attempt=2),
            _update("later", StepKind.RUN, Action.RETRY, error=ErrorInfo(message="busy"),
                    delayMs=-5, timeoutMs=-1),
        ],
    )  # fmt: skip
    own_error = {"type": "KeyError", "message": "no such key", "code": "no_key"}
    plain_error = {"type": "Error", "message": "step failed", "code": "step_failed"}
    retry_error = {"type": "Error", "message": "busy", "code": "step_failed"}
    assert [c.row() for c in plan.changes] == [
        _row(name="own", status="failed", error=own_error, ended=True),
        _row(name="plain", status="failed", attempt=2, error=plain_error, ended=True),
        _row(name="later", status="retrying", error=retry_error, delay_ms=0, timeout_ms=0),
    ]
    assert plan.events == [
        {"type": "step.failed", "step_name": "own",
         "data": {"kind": "run", "attempt": 1, "error": own_error}},
        {"type": "step.failed", "step_name": "plain",
         "data": {"kind": "run", "attempt": 2, "error": plain_error}},
        {"type": "step.retrying", "step_name": "later",
         "data": {"kind": "run", "attempt": 1, "error": retry_error, "delayMs": 0,
                  "timeoutMs": 0}},
    ]  # fmt: skip


def test_waits_write_their_callbacks_children_and_event_waits() -> None:
    """A sleep keeps its delay and its start; a callback gets its derived id (and its
    timeout); an event wait its name and match; an invoke its derived child, which the plan
    starts with the workflow and the input. An error sent with a wait is not kept."""
    stray = ErrorInfo(message="ignored")
    plan = plan_updates(
        RUN,
        [
            _update("nap", StepKind.SLEEP, Action.SLEEP, delayMs=1500, atMs=42, error=stray),
            _update("cb", StepKind.CALLBACK, Action.CALLBACK, timeoutMs=9000),
            _update("ev", StepKind.EVENT, Action.EVENT, event="paid", match={"id": 3}),
            _update("bare", StepKind.EVENT, Action.EVENT, event="seen", match={}),
            _update("kid", StepKind.INVOKE, Action.INVOKE, workflow="child", input=[1, 2]),
        ],
        generation=2,
    )
    cb = callback_id(RUN, "cb", 2)
    kid = child_run_id(RUN, "kid", 2)
    assert cb != callback_id(RUN, "cb") and kid != child_run_id(RUN, "kid")
    rows = [c.row() for c in plan.changes]
    assert rows == [
        _row(name="nap", kind="sleep", status="sleeping", delay_ms=1500, at_ms=42),
        _row(name="cb", kind="callback", status="waiting", timeout_ms=9000, callback_id=cb),
        _row(name="ev", kind="event", status="waiting", event_name="paid", match={"id": 3}),
        _row(name="bare", kind="event", status="waiting", event_name="seen", match={}),
        _row(name="kid", kind="invoke", status="waiting", child_run_id=kid),
    ]
    assert plan.events == [
        {"type": "step.sleeping", "step_name": "nap",
         "data": {"kind": "sleep", "attempt": 1, "delayMs": 1500}},
        {"type": "step.waiting", "step_name": "cb",
         "data": {"kind": "callback", "attempt": 1, "timeoutMs": 9000, "callbackId": cb}},
        {"type": "step.waiting", "step_name": "ev",
         "data": {"kind": "event", "attempt": 1, "event": "paid", "match": {"id": 3}}},
        {"type": "step.waiting", "step_name": "bare",
         "data": {"kind": "event", "attempt": 1, "event": "seen"}},
        {"type": "step.waiting", "step_name": "kid",
         "data": {"kind": "invoke", "attempt": 1, "childRunId": kid, "workflow": "child"}},
    ]  # fmt: skip
    assert plan.callbacks == [(cb, "cb", 9000)]
    assert plan.children == [ChildStart(kid, "kid", "child", [1, 2])]
    assert [w.row() for w in plan.event_waits] == rows[2:4]
    assert plan.needs_transaction


def test_the_last_update_of_a_step_wins_its_row_and_logs_come_along() -> None:
    """Updates of one step in a batch leave one row (the last), every event in order; the
    log lines are the store's rows and the count dropped is carried."""
    at = datetime(2026, 12, 1, tzinfo=UTC)
    line = LogLine(at=at, level=LogLevel.INFO, message="hé", fields={"k": 1}, stepName="s")
    plan = plan_updates(
        RUN,
        [
            _update("s", StepKind.RUN, Action.START),
            _update("s", StepKind.RUN, Action.COMPLETE, output=5),
        ],
        logs=[line],
        logs_dropped=4,
    )
    assert [c.row() for c in plan.changes] == [_row(status="completed", output=5, ended=True)]
    assert [e["type"] for e in plan.events] == ["step.started", "step.completed"]
    assert plan.logs == [
        {"ord": 1, "at": at.isoformat(), "level": "info", "message": "hé", "fields": {"k": 1},
         "step_name": "s", "size": 3 + len(b'{"k":1}')},
    ]  # fmt: skip
    assert plan.logs_dropped == 4
    assert plan_updates(RUN, []).logs_dropped == 0


@pytest.mark.parametrize(
    ("update", "says"),
    [
        (_update("s", StepKind.SLEEP, Action.START), "action start does not apply to kind"),
        (_update("s", StepKind.RUN, Action.RETRY), "retry needs delayMs"),
        (_update("s", StepKind.SLEEP, Action.SLEEP), "sleep needs delayMs"),
        (_update("s", StepKind.EVENT, Action.EVENT), "an event wait needs the event name"),
        (_update("s", StepKind.INVOKE, Action.INVOKE), "invoke needs the workflow name"),
    ],
)
def test_an_update_that_breaks_the_protocol_is_refused(update: StepUpdate, says: str) -> None:
    """The wrong kind for an action, a retry or sleep without its delay, an event wait
    without its name and an invoke without its workflow are refused, naming the step."""
    with pytest.raises(InvalidUpdate, match=f"step 's': .*{says}"):
        plan_updates(RUN, [update])


def test_a_sleep_of_zero_and_a_waits_timeout_are_kept() -> None:
    """A zero delay is a delay (not a missing one); with no timeout none is recorded."""
    plan = plan_updates(RUN, [_update("z", StepKind.SLEEP, Action.SLEEP, delayMs=0)])
    assert plan.changes[0] == StepChange(
        name="z", kind="sleep", status="sleeping", attempt=1, delay_ms=0
    )


def test_error_codes_fill_in_what_an_error_lacks() -> None:
    """An error object keeps a code it has (a non-empty string) and gets the default in
    place of a missing, empty or non-string one; type and message are always there; what is
    not an error object is answered as it is."""
    full = {"type": "T", "message": "m", "code": "c"}
    assert error_codes.with_code(full, "d") is full
    assert error_codes.with_code({"code": "c"}, "d") == {
        "code": "c",
        "type": "Error",
        "message": "",
    }
    assert error_codes.with_code({"type": "T", "code": "c"}, "d") == {
        "type": "T", "code": "c", "message": ""
    }  # fmt: skip
    assert error_codes.with_code({"message": "m", "code": "c"}, "d") == {
        "message": "m", "code": "c", "type": "Error"
    }  # fmt: skip
    for bad in ("", 5, None):
        assert error_codes.with_code({"type": "T", "message": "m", "code": bad}, "d") == {
            "type": "T", "message": "m", "code": "d"
        }  # fmt: skip
    assert error_codes.with_code("boom", "d") == "boom"
    assert error_codes.with_code(None, "d") is None
    assert error_codes.STEP_FAILED == "step_failed"
    assert error_codes.WORKFLOW_FAILED == "workflow_failed"


def test_fields_an_action_does_not_take_are_not_kept() -> None:
    """A start's output, a failure's sleep start, a callback's event name and match are
    dropped: each action keeps only its own fields."""
    plan = plan_updates(
        RUN,
        [
            _update("a", StepKind.RUN, Action.START, output="early"),
            _update("b", StepKind.RUN, Action.FAIL, atMs=5, event="e", match={"k": 1}),
            _update("c", StepKind.CALLBACK, Action.CALLBACK, event="e", match={"k": 1}, atMs=5),
        ],
    )
    rows = {c.name: c.row() for c in plan.changes}
    assert rows["a"]["output"] is None
    assert (rows["b"]["at_ms"], rows["b"]["event_name"], rows["b"]["match"]) == (None, None, None)
    assert (rows["c"]["at_ms"], rows["c"]["event_name"], rows["c"]["match"]) == (None, None, None)
