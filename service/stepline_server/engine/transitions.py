"""How an invocation ended, and the transition of its run that follows: the one table the run
loop records outcomes by (``store.outcomes.record_outcomes``)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from enum import StrEnum
from typing import Any

from stepline_server.engine.events import EventType
from stepline_server.engine.runs import ENDED, RunStatus


class InvocationStatus(StrEnum):
    """How an invocation ended (``invocation.ended``'s ``data.outcome``)."""

    COMPLETED = "completed"  # the workflow returned: the run ends completed
    FAILED = "failed"  # the workflow raised, or the app could not be reached in time
    CANCELLED = "cancelled"  # the workflow ended on a cancel request
    SUSPENDED = "suspended"  # the workflow waits (a sleep, a callback, an event, a child)
    CONTINUED = "continued"  # continue_as_new: the run's next generation starts
    DELIVERY_FAILED = "delivery_failed"  # the app was not reached: invoked again later
    STALE = "stale"  # the invocation lost its lease: another holds the run


class Transition(StrEnum):
    """What recording an outcome does to its run."""

    END = "end"  # end the run with the outcome's status (end_runs)
    SUSPEND = "suspend"  # release the lease; due at its earliest timer (suspend_runs)
    NEXT_GENERATION = "next_generation"  # start the run over with a new input
    RETRY_DELIVERY = "retry_delivery"  # release the lease; due again after a backoff
    NONE = "none"  # nothing: the lease is another invocation's


_TRANSITIONS = {
    InvocationStatus.COMPLETED: Transition.END,
    InvocationStatus.FAILED: Transition.END,
    InvocationStatus.CANCELLED: Transition.END,
    InvocationStatus.SUSPENDED: Transition.SUSPEND,
    InvocationStatus.CONTINUED: Transition.NEXT_GENERATION,
    InvocationStatus.DELIVERY_FAILED: Transition.RETRY_DELIVERY,
    InvocationStatus.STALE: Transition.NONE,
}


def transition_of(status: InvocationStatus | str) -> Transition:
    """The transition an invocation that ended with ``status`` moves its run by."""
    return _TRANSITIONS[InvocationStatus(status)]


def run_status_of(status: InvocationStatus | str) -> RunStatus:
    """The status a run ends with when its invocation ended ``status`` (one that ends it)."""
    if transition_of(status) is not Transition.END:
        raise ValueError(f"an invocation that ended {status} does not end its run")
    ended = RunStatus(str(status))
    assert ended in ENDED
    return ended


def ends_run(status: InvocationStatus | str) -> bool:
    """Whether an invocation that ended ``status`` ends its run."""
    return transition_of(status) is Transition.END


@dataclass(frozen=True)
class Outcome:
    """How an invocation ended, as the run loop records it."""

    status: InvocationStatus
    output: Any = None  # continued: the next generation's input
    error: dict[str, Any] | None = None
    http_status: int | None = None
    duration_ms: int | None = None
    deployment_id: str | None = None
    retry_delay_ms: int | None = None  # delivery_failed: invoke again after this delay
    reason: str | None = None  # why the invocation failed, for the history
    request: str | None = None  # what was sent: "POST <url> (<n> bytes)", "poll by <worker>"
    # The answer came from an SDK that reads history deltas (it declared protocol 3 or newer):
    # the run's next invocation may carry only what changed since this one.
    reads_deltas: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", InvocationStatus(self.status))

    def ended_event(self) -> dict[str, Any]:
        """The ``invocation.ended`` event this outcome appends, with its status and duration."""
        data: dict[str, Any] = {"outcome": self.status.value}
        if self.reason:
            data["error"] = self.reason
        if self.request:
            data["request"] = self.request
        return {
            "type": EventType.INVOCATION_ENDED,
            "deployment_id": self.deployment_id,
            "http_status": self.http_status,
            "duration_ms": self.duration_ms,
            "data": data,
        }


@dataclass(frozen=True, slots=True)
class Claim:
    """A run leased to one invocation, as every lease answers it (the database's
    ``lease_claim``): its fencing token and numbers, and what invoking it needs."""

    id: uuid.UUID
    project_id: uuid.UUID
    app_id: uuid.UUID | None
    workflow: str
    status: str
    input: Any
    options: dict[str, Any]  # the workflow's options the run started with ({} when none)
    cancel_requested: bool
    past_deadline: bool  # at its time limit: to be ended, not invoked
    lease_token: str
    invocation_id: uuid.UUID
    invoke_attempts: int  # deliveries that failed in a row before this one
    undelivered_since: datetime | None
    wake_seq: int
    concurrency_key: str | None
    generation: int
    created_at: datetime | None
    pull: bool
    priority: int
    due_in: float  # seconds until it was due when claimed (0: due then)
    taken_over: bool  # another invocation's lease on it had lapsed
    app_url: str | None
    app_secrets: list[str]
    app_protocol: int | None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> Claim:
        """The claim a lease answered (a row in ``lease_claim``'s shape)."""
        values = {f.name: row[f.name] for f in fields(cls)}
        values["options"] = values["options"] or {}
        values["generation"] = values["generation"] or 1
        values["app_secrets"] = list(values["app_secrets"] or [])
        values["cancel_requested"] = bool(values["cancel_requested"])
        values["past_deadline"] = bool(values["past_deadline"])
        values["priority"] = values["priority"] or 0
        values["due_in"] = values["due_in"] or 0.0
        values["taken_over"] = bool(values["taken_over"])
        return cls(**values)

    @property
    def cap(self) -> int:
        """The workflow's concurrency cap (0: none)."""
        return int(self.options.get("concurrency") or 0)
