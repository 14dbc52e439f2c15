"""Run rules: statuses, what may happen to a run in each, and how delivery failures retry."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from stepline_server.engine.events import EventType


class RunStatus(StrEnum):
    """Where a run stands (openapi.yaml's RunStatus)."""

    RUNNING = "running"
    CANCELLING = "cancelling"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timedOut"


ACTIVE = frozenset({RunStatus.RUNNING, RunStatus.CANCELLING})
ENDED = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.TIMED_OUT})
RETRYABLE = frozenset({RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.TIMED_OUT})

MIN_PRIORITY, MAX_PRIORITY = -100, 100  # a run's priority: among due runs, higher goes first

END_EVENT = {
    RunStatus.COMPLETED: EventType.RUN_COMPLETED,
    RunStatus.FAILED: EventType.RUN_FAILED,
    RunStatus.CANCELLED: EventType.RUN_CANCELLED,
    RunStatus.TIMED_OUT: EventType.RUN_TIMED_OUT,
}


class RuleError(Exception):
    """An action the run's state does not allow; ``code`` is the error code of openapi.yaml."""

    def __init__(self, message: str, code: str = "invalid_state") -> None:
        super().__init__(message)
        self.code = code


def check_cancel(status: str) -> bool:
    """True when a cancel request changes the run; raise when the run has ended."""
    if status in ENDED:
        raise RuleError(f"the run has already ended ({status}); it cannot be cancelled")
    return status == RunStatus.RUNNING


def cancels_at_once(started_at: datetime | None, lease_token: str | None) -> bool:
    """Whether a cancel request ends the run at once: it was never invoked (it waits for a rate
    limit's window, a concurrency slot or a dispatcher), so no cleanup step can run."""
    return started_at is None and lease_token is None


def check_retry(status: str, from_step: str | None = None) -> None:
    """Raise unless the run is failed, cancelled or timed out, or completed with ``from_step``
    given (a reset: that step and those after it run again, the earlier ones replay)."""
    if status == RunStatus.COMPLETED and from_step is not None:
        return
    if status == RunStatus.COMPLETED:
        raise RuleError(
            "a completed run can only be retried from a step (fromStep): its steps from there"
            " on run again"
        )
    if status not in RETRYABLE:
        raise RuleError(
            "only a failed, cancelled or timed-out run can be retried (a completed one from a"
            f" step); this run is {status}"
        )


def singleton_taken(holder: object) -> str:
    """Why a run cannot go again: run ``holder``, not ended, has its singleton key."""
    return (
        f"run {holder} of the same workflow holds this run's singleton key and has not ended;"
        " retry this run once it has"
    )


DELIVERY_BACKOFF_MS = 1000
DELIVERY_BACKOFF_CAP_MS = 5 * 60 * 1000


@dataclass(frozen=True)
class DeliveryFailure:
    """What to do after an invocation could not be delivered: try again after ``delay_ms``,
    or (the delivery window spent) fail the run with ``error``."""

    retry: bool
    delay_ms: int
    error: dict[str, Any] | None = None


def on_delivery_failure(
    *,
    failures_so_far: int,
    failing_since: datetime | None,
    now: datetime,
    window_seconds: float,
    reason: str,
    http_status: int | None,
    retry_after_seconds: float | None = None,
    jitter: bool = True,
    cap_ms: int = DELIVERY_BACKOFF_CAP_MS,
) -> DeliveryFailure:
    """Decide after the ``failures_so_far + 1``-th delivery failure in a row, the first of
    which happened at ``failing_since`` (None: this one). Delivery failures never use the
    workflow's retries: they are tried again with backoff (1 s doubling, capped at ``cap_ms``,
    5 min by default, ``Retry-After`` honoured) until the delivery window has passed since the
    first of them."""
    attempts = failures_so_far + 1
    spent = (now - (failing_since or now)).total_seconds()
    remaining = window_seconds - spent
    if remaining <= 0:
        error: dict[str, Any] = {
            "type": "AppUnreachable",
            "code": "app_unreachable",
            "message": (
                f"the app could not be invoked for {_span(window_seconds)}: {reason} "
                f"(after {attempts} attempts)"
            ),
        }
        if http_status is not None:
            error["httpStatus"] = http_status
        return DeliveryFailure(False, 0, error)
    delay = min(float(cap_ms), DELIVERY_BACKOFF_MS * 2.0 ** min(attempts - 1, 40))
    if jitter:
        delay *= random.uniform(0.8, 1.0)
    if retry_after_seconds is not None and retry_after_seconds >= 0:
        delay = retry_after_seconds * 1000
    # The last try is made when the window ends, not after.
    return DeliveryFailure(True, max(0, int(min(delay, remaining * 1000))))


def delivery_window(options: dict[str, Any] | None, default_seconds: float) -> float:
    """The delivery window of a workflow's runs, in seconds (its own, or the default)."""
    raw = (options or {}).get("deliveryWindowMs")
    if isinstance(raw, int | float) and not isinstance(raw, bool) and raw >= 0:
        return raw / 1000
    return default_seconds


def _span(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def child_outcome(
    child_id: str, status: str, output: Any, error: dict[str, Any] | None
) -> tuple[str, Any, dict[str, Any] | None]:
    """How a child run's end resolves the parent's invoke step: (step status, output, error)."""
    if status == RunStatus.COMPLETED:
        return "completed", output, None
    inner = error or {}
    message = inner.get("message") or f"the child run ended {status}"
    return (
        "failed",
        None,
        {
            "type": "ChildWorkflowFailed",
            "code": inner.get("code") or f"child_{status}",
            "message": f"child run {child_id} ended {status}: {message}",
            "childRunId": child_id,
            "childStatus": status,
        },
    )
