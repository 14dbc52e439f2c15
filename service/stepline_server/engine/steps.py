"""Step rules: what a step update reported by the SDK does to the step and the history."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from stepline.protocol import (
    Action,
    LogLine,
    StepKind,
    StepStatus,
    StepUpdate,
    patch_step_name,
)
from stepline_server.engine import error_codes, ids
from stepline_server.engine import logs as run_logs
from stepline_server.engine import state as run_state
from stepline_server.engine.events import EventType

_NS = uuid.UUID("6f1f3c1e-3b1a-4d5e-9f51-5a3d1f0b7c42")

# What each action means for the step row and which history event it appends.
_ACTIONS: dict[Action, tuple[StepStatus, str, set[StepKind]]] = {
    Action.START: (StepStatus.RUNNING, EventType.STEP_STARTED, {StepKind.RUN}),
    Action.COMPLETE: (
        StepStatus.COMPLETED,
        EventType.STEP_COMPLETED,
        {StepKind.RUN, StepKind.VALUE, StepKind.STATE},
    ),
    Action.FAIL: (StepStatus.FAILED, EventType.STEP_FAILED, {StepKind.RUN}),
    Action.RETRY: (StepStatus.RETRYING, EventType.STEP_RETRYING, {StepKind.RUN}),
    Action.SLEEP: (StepStatus.SLEEPING, EventType.STEP_SLEEPING, {StepKind.SLEEP}),
    Action.CALLBACK: (StepStatus.WAITING, EventType.STEP_WAITING, {StepKind.CALLBACK}),
    Action.EVENT: (StepStatus.WAITING, EventType.STEP_WAITING, {StepKind.EVENT}),
    Action.INVOKE: (StepStatus.WAITING, EventType.STEP_WAITING, {StepKind.INVOKE}),
}

ENDED_STEP = frozenset({StepStatus.COMPLETED, StepStatus.FAILED, StepStatus.CANCELLED})


class InvalidUpdate(ValueError):
    """A step update that breaks the protocol (wrong kind for the action, missing fields)."""


def child_run_id(run_id: str, step_name: str, generation: int = 1) -> str:
    """The id of the child run a step starts: derived, so the child starts exactly once."""
    name = f"child:{_scope(run_id, generation)}:{step_name}"
    return str(ids.derived_id(uuid.UUID(run_id), name, _NS))


def callback_id(run_id: str, step_name: str, generation: int = 1) -> str:
    """The id of the callback a step creates: derived, so it is the same on every replay."""
    name = f"callback:{_scope(run_id, generation)}:{step_name}"
    return str(ids.derived_id(uuid.UUID(run_id), name, _NS))


def _scope(run_id: str, generation: int) -> str:
    """What derived ids are unique in: the run, and past its first generation the generation
    too (``ctx.continue_as_new``), so a later generation never meets an earlier one's."""
    return run_id if generation <= 1 else f"{run_id}/{generation}"


@dataclass(slots=True)
class StepChange:
    """One step row to write (insert, or update when not already ended)."""

    name: str
    kind: str
    status: str
    attempt: int
    output: Any = None
    error: dict[str, Any] | None = None
    delay_ms: int | None = None
    timeout_ms: int | None = None
    at_ms: int | None = None  # a sleep's start on the app's clock (the store bounds it)
    ended: bool = False
    callback_id: str | None = None
    child_run_id: str | None = None
    event_name: str | None = None
    match: dict[str, Any] | None = None

    def row(self) -> dict[str, Any]:
        """The change as the store's JSON record."""
        return {
            "name": self.name,
            "kind": self.kind,
            "status": self.status,
            "attempt": self.attempt,
            "output": self.output,
            "error": self.error,
            "delay_ms": self.delay_ms,
            "timeout_ms": self.timeout_ms,
            "at_ms": self.at_ms,
            "ended": self.ended,
            "callback_id": self.callback_id,
            "child_run_id": self.child_run_id,
            "event_name": self.event_name,
            "match": self.match,
        }


@dataclass(frozen=True)
class ChildStart:
    """A child run to create for an ``invoke`` update."""

    id: str
    step_name: str
    workflow: str
    input: Any


@dataclass
class Plan:
    """What a batch of updates writes: step rows, history events, callbacks and children, and
    the log lines written with them (how many the SDK dropped before them, too)."""

    changes: list[StepChange] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    callbacks: list[tuple[str, str, int | None]] = field(default_factory=list)
    children: list[ChildStart] = field(default_factory=list)
    event_waits: list[StepChange] = field(default_factory=list)
    logs: list[dict[str, Any]] = field(default_factory=list)
    logs_dropped: int = 0
    states: list[tuple[str, str]] = field(default_factory=list)
    """The state sets to record, in order: (key, step name)."""

    @property
    def needs_transaction(self) -> bool:
        """More than the one progress statement is needed to apply this plan."""
        return bool(self.children or self.event_waits or self.states)

    def refuse_states(self, keys: set[str]) -> None:
        """Record the sets of ``keys`` as failed steps (the run has too many keys already)."""
        if not keys:
            return
        refused = {name: key for key, name in self.states if key in keys}
        self.states = [(key, name) for key, name in self.states if key not in keys]
        for change in self.changes:
            if change.name in refused:
                change.status, change.output = StepStatus.FAILED.value, None
                change.error = run_state.too_many_keys(refused[change.name])
        for event in self.events:
            if event["step_name"] in refused and event["type"] == EventType.STATE_SET:
                event["type"] = EventType.STEP_FAILED
                event["data"] = {
                    **event["data"],
                    "error": run_state.too_many_keys(refused[event["step_name"]]),
                }


def plan_updates(
    run_id: str,
    updates: list[StepUpdate],
    logs: list[LogLine] | None = None,
    logs_dropped: int = 0,
    generation: int = 1,
) -> Plan:
    """Turn the SDK's updates into rows and events (a later update of a step wins its row),
    with the log lines that came with them. The ids of callbacks and children count the run's
    ``generation`` past the first, so a step of a later generation never meets one an earlier
    generation made under the same name."""
    plan = Plan(logs=run_logs.rows(logs or []), logs_dropped=logs_dropped)
    by_name: dict[str, StepChange] = {}
    for u in updates:
        status, event_type, kinds = _ACTIONS[u.action]
        if u.kind not in kinds:
            raise InvalidUpdate(
                f"step {u.name!r}: action {u.action} does not apply to kind {u.kind}"
            )
        if u.kind is StepKind.STATE:
            by_name[u.name] = _state_change(u, plan)
            continue
        change = _change(run_id, u, status, generation)
        by_name[u.name] = change
        if u.patch is not None:
            plan.events.append(_patch_event(u))
            continue
        plan.events.append(_event(event_type, u, change))
        if u.action is Action.CALLBACK:
            assert change.callback_id is not None
            plan.callbacks.append((change.callback_id, u.name, u.timeout_ms))
        elif u.action is Action.EVENT:
            plan.event_waits.append(change)
        elif u.action is Action.INVOKE:
            assert change.child_run_id is not None and u.workflow is not None
            plan.children.append(ChildStart(change.child_run_id, u.name, u.workflow, u.input))
    plan.changes = list(by_name.values())
    return plan


def _state_change(u: StepUpdate, plan: Plan) -> StepChange:
    """A ``ctx.set_state``: its step (the value as output) and a ``state.set`` event, or, when
    the rules refuse it, a failed step whose error says why (no state is recorded)."""
    refused = run_state.refusal(u)
    data: dict[str, Any] = {"kind": u.kind.value, "key": u.key}
    if refused is not None:
        failed = {
            "type": EventType.STEP_FAILED,
            "step_name": u.name,
            "data": data | {"error": refused},
        }
        plan.events.append(failed)
        return StepChange(
            u.name, u.kind.value, StepStatus.FAILED.value, 1, error=refused, ended=True
        )
    assert u.key is not None  # refusal() checked it
    plan.events.append({"type": EventType.STATE_SET, "step_name": u.name, "data": data})
    plan.states.append((u.key, u.name))
    return StepChange(
        u.name, u.kind.value, StepStatus.COMPLETED.value, 1, output=u.output, ended=True
    )


def _change(run_id: str, u: StepUpdate, status: StepStatus, generation: int) -> StepChange:
    if u.action is Action.START or u.action is Action.COMPLETE:  # most updates: the short way
        complete = u.action is Action.COMPLETE
        return StepChange(
            name=u.name,
            kind=u.kind.value,
            status=status.value,
            attempt=u.attempt if u.attempt > 1 else 1,
            output=u.output if complete else None,
            ended=complete,
        )
    error = u.error.model_dump(exclude_none=True) if u.error else None
    if u.action in (Action.FAIL, Action.RETRY) and error is None:
        error = {"type": "Error", "message": "step failed"}
    error = error_codes.with_code(error, error_codes.STEP_FAILED)
    if u.action in (Action.RETRY, Action.SLEEP) and u.delay_ms is None:
        raise InvalidUpdate(f"step {u.name!r}: {u.action} needs delayMs")
    if u.action is Action.EVENT and not u.event:
        raise InvalidUpdate(f"step {u.name!r}: an event wait needs the event name")
    if u.action is Action.INVOKE and not u.workflow:
        raise InvalidUpdate(f"step {u.name!r}: invoke needs the workflow name")
    return StepChange(
        name=u.name,
        kind=u.kind.value,
        status=status.value,
        attempt=max(1, u.attempt),
        error=error if u.action in (Action.FAIL, Action.RETRY) else None,
        delay_ms=max(0, u.delay_ms) if u.delay_ms is not None else None,
        timeout_ms=max(0, u.timeout_ms) if u.timeout_ms is not None else None,
        at_ms=u.at_ms if u.action is Action.SLEEP else None,
        ended=status in ENDED_STEP,
        callback_id=(
            callback_id(run_id, u.name, generation) if u.action is Action.CALLBACK else None
        ),
        child_run_id=(
            child_run_id(run_id, u.name, generation) if u.action is Action.INVOKE else None
        ),
        event_name=u.event if u.action is Action.EVENT else None,
        match=u.match if u.action is Action.EVENT else None,
    )


def _patch_event(u: StepUpdate) -> dict[str, Any]:
    """``patch.recorded`` for the marker of a patch (``ctx.patched``): a completed value step
    named after the patch."""
    assert u.patch is not None
    if u.kind is not StepKind.VALUE or u.action is not Action.COMPLETE:
        raise InvalidUpdate(f"step {u.name!r}: a patch marker is a completed value step")
    if u.name != patch_step_name(u.patch):
        raise InvalidUpdate(
            f"step {u.name!r}: the marker of patch {u.patch!r} is named "
            f"{patch_step_name(u.patch)!r}"
        )
    return {"type": EventType.PATCH_RECORDED, "step_name": u.name, "data": {"patch": u.patch}}


def _event(event_type: str, u: StepUpdate, change: StepChange) -> dict[str, Any]:
    data: dict[str, Any] = {"kind": u.kind.value, "attempt": change.attempt}
    if change.error is not None:
        data["error"] = change.error
    if change.delay_ms is not None:
        data["delayMs"] = change.delay_ms
    if change.timeout_ms is not None:
        data["timeoutMs"] = change.timeout_ms
    if change.event_name is not None:
        data["event"] = change.event_name
        if change.match:
            data["match"] = change.match
    if change.callback_id is not None:
        data["callbackId"] = change.callback_id
    if change.child_run_id is not None:
        data["childRunId"] = change.child_run_id
        data["workflow"] = u.workflow
    return {"type": event_type, "step_name": u.name, "data": data}
