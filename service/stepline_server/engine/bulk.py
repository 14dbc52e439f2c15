"""Bulk actions as plain rules: which runs an action acts on, what a filter means, what became
of each run, and how an operation paces itself beside the runs going on."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from stepline_server.engine import runs as rules


class Action(StrEnum):
    CANCEL = "cancel"  # request cancellation of running runs
    RETRY = "retry"  # run failed, cancelled and timed-out runs again
    RETRY_FROM_STEP = "retryFromStep"  # the same, from a named step on
    MOVE = "move"  # move runs not ended to another deployment of their app


class Outcome(StrEnum):
    SUCCEEDED = "succeeded"  # cancel requested, run retried, or run moved
    SKIPPED = "skipped"  # the run no longer qualified (it ended, it was retried, it is gone)
    FAILED = "failed"  # acting on it raised: the error is kept


class OperationStatus(StrEnum):
    RUNNING = "running"  # runs left to act on
    COMPLETED = "completed"  # every run acted on or skipped
    CANCELLED = "cancelled"  # stopped by a request; what was done stays done


TRIGGERS = ("api", "schedule", "manual", "event", "parent", "retry", "bulk")
TRIGGER = "bulk"  # what a run an operation retried says started it (and its metric's label)
SAMPLE_SIZE = 20  # run ids a dry run shows
FIRST_ERRORS = 20  # errors an operation shows
_RUN_KEY_PREFIX = re.compile(r"^[A-Za-z0-9._:-]{0,128}$")
_RUN_KEY = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class FilterError(ValueError):
    """A filter that cannot select runs; ``field`` names the filter's field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def acts_on(action: Action) -> frozenset[str]:
    """The run statuses ``action`` acts on: a run in another status does not qualify."""
    if action is Action.CANCEL:
        return frozenset({rules.RunStatus.RUNNING.value})
    if action is Action.MOVE:
        return frozenset({rules.RunStatus.RUNNING.value, rules.RunStatus.CANCELLING.value})
    return frozenset(rules.RETRYABLE)


@dataclass(frozen=True)
class Selection:
    """A filter made exact for the store: the statuses that both match and qualify (empty:
    nothing can match), the run key exact or as a prefix, the rest as given."""

    statuses: tuple[str, ...]
    workflow: str | None = None
    app: str | None = None
    deployment_id: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    run_key: str | None = None
    run_key_prefix: str | None = None
    trigger: str | None = None
    from_step: str | None = None
    run_ids: tuple[str, ...] | None = None  # only these runs (the dashboard's selection)
    on_deployment: str | None = None  # only the runs on this deployment (its id)


def statuses_of(raw: str | list[str] | None) -> list[str] | None:
    """The filter's ``status``, one or a list, as a list; FilterError for an unknown one."""
    if raw is None:
        return None
    values = [raw] if isinstance(raw, str) else list(raw)
    if not values:
        raise FilterError("status", "status must name at least one run status")
    known = {s.value for s in rules.RunStatus}
    for value in values:
        if value not in known:
            raise FilterError(
                "status", f"unknown status {value!r}; one of {', '.join(sorted(known))}"
            )
    return values


def run_key_of(raw: str | None) -> tuple[str | None, str | None]:
    """The filter's ``runKey`` as (exact key, prefix): ``signup-*`` is the prefix ``signup-``."""
    if raw is None:
        return None, None
    if raw.endswith("*"):
        prefix = raw[:-1]
        if not _RUN_KEY_PREFIX.fullmatch(prefix):
            raise FilterError("runKey", "a runKey prefix is run key characters then one '*'")
        return None, prefix
    if not _RUN_KEY.fullmatch(raw):
        raise FilterError("runKey", "runKey must be a run key, or a prefix ending with '*'")
    return raw, None


def select(
    action: Action,
    *,
    status: str | list[str] | None,
    run_key: str | None,
    trigger: str | None,
    created_after: datetime | None,
    created_before: datetime | None,
    workflow: str | None = None,
    app: str | None = None,
    deployment_id: str | None = None,
    from_step: str | None = None,
    run_ids: tuple[str, ...] | None = None,
    on_deployment: str | None = None,
) -> Selection:
    """The runs an operation of ``action`` takes: those the filter matches that the action can
    act on now (a filter's status the action cannot act on matches nothing)."""
    created_after = _utc(created_after, "createdAfter")
    created_before = _utc(created_before, "createdBefore")
    if trigger is not None and trigger not in TRIGGERS:
        raise FilterError("trigger", f"unknown trigger {trigger!r}; one of {', '.join(TRIGGERS)}")
    if created_after and created_before and created_after >= created_before:
        raise FilterError("createdBefore", "createdBefore must be later than createdAfter")
    wanted = statuses_of(status)
    qualifying = acts_on(action)
    statuses = tuple(sorted(qualifying if wanted is None else qualifying & set(wanted)))
    exact, prefix = run_key_of(run_key)
    return Selection(
        statuses=statuses,
        workflow=workflow,
        app=app,
        deployment_id=deployment_id,
        created_after=created_after,
        created_before=created_before,
        run_key=exact,
        run_key_prefix=prefix,
        trigger=trigger,
        from_step=from_step if action is Action.RETRY_FROM_STEP else None,
        run_ids=run_ids,
        on_deployment=on_deployment,
    )


def _utc(value: datetime | None, field: str) -> datetime | None:
    """A filter's time in UTC; FilterError when it has none there (past year 9999)."""
    if value is None:
        return None
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise FilterError(field, f"{field} is out of range") from None


def check_from_step(action: Action, from_step: str | None) -> None:
    """``retryFromStep`` needs ``fromStep``; the other actions take none."""
    if action is Action.RETRY_FROM_STEP and from_step is None:
        raise FilterError("fromStep", "retryFromStep needs fromStep: the step to run again from")
    if action is not Action.RETRY_FROM_STEP and from_step is not None:
        raise FilterError("fromStep", f"fromStep goes with retryFromStep, not {action.value}")


def check_deployment(action: Action, deployment: str | None) -> None:
    """``move`` needs ``deployment``; the other actions take none."""
    if action is Action.MOVE and deployment is None:
        raise FilterError("deployment", "move needs deployment: the deployment to move runs to")
    if action is not Action.MOVE and deployment is not None:
        raise FilterError("deployment", f"deployment goes with move, not {action.value}")


def cancel_outcome(status: str | None) -> Outcome | None:
    """What a bulk cancel makes of a run in ``status`` (None: gone): skipped unless it is still
    running (cancelling already, or ended); None when the cancel should go ahead."""
    if status is None or status != rules.RunStatus.RUNNING:
        return Outcome.SKIPPED
    return None


def by(operation_id: object) -> str:
    """What the history of a run an operation acted on says did it (``data.by``)."""
    return f"operation:{operation_id}"


# Pacing. An operation feeds the dispatcher small batches and rests between them. It keeps at
# most one batch of its runs in the dispatcher (due and not yet taken, or being invoked): the
# next batch tops that up once it has half a batch of room, so the due queue never holds more
# than a batch of its runs ahead of other workflows' runs and its invocations do not come in
# bursts. While the dispatcher has a backlog of due runs it does not act at all.
BATCH_SIZE = 10
REST_SECONDS = 0.1  # the least rest between two batches
DUTY = 0.5  # an operation acts during at most this share of its loop's time
BACKLOG_ROOM = 20  # due runs not yet invoked above which the next batch waits
ROOM_WAIT_SECONDS = 5.0  # the longest a batch waits for that room
AHEAD_BATCHES = 5  # how many batches' worth of its latest runs an operation counts as ahead


def rest_after(batch_seconds: float, backlog: int) -> float:
    """How long to rest after a batch that took ``batch_seconds`` with ``backlog`` runs due and
    not yet invoked: at least :data:`REST_SECONDS`, enough to keep to :data:`DUTY`, longer while
    the dispatcher has a backlog."""
    rest = max(REST_SECONDS, max(0.0, batch_seconds) * (1.0 - DUTY) / DUTY)
    if backlog > BACKLOG_ROOM:
        rest = max(rest, 0.25)
    return rest


def batch_room(
    batch_size: int, *, backlog: int, waiting: int, invoking: int, held_seconds: float
) -> int:
    """How many runs the next batch acts on (0: not yet, look again after a rest).

    ``backlog``: runs due and not invoked, of any workflow; ``waiting`` and ``invoking``: the
    operation's runs already acted on that are due and not yet taken by an invocation, or
    being invoked. The batch fills what keeps the operation's runs in the dispatcher at most
    ``batch_size``, once that is at least half a batch and the dispatcher has no backlog past
    :data:`BACKLOG_ROOM`; after ``held_seconds`` of :data:`ROOM_WAIT_SECONDS` a whole batch
    goes whatever the room, so an operation always moves."""
    batch_size = max(1, batch_size)
    if held_seconds >= ROOM_WAIT_SECONDS:
        return batch_size
    if backlog > BACKLOG_ROOM:
        return 0
    room = batch_size - max(0, waiting) - max(0, invoking)
    return room if room >= (batch_size + 1) // 2 else 0
