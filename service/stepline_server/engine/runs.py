"""Run rules: statuses, what may happen to a run in each, and how invocation failures retry."""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from stepline.protocol import RetryPolicy


class RunStatus(StrEnum):
    """Where a run stands (API.md's run statuses)."""

    RUNNING = "running"
    CANCELLING = "cancelling"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timedOut"


ACTIVE = frozenset({RunStatus.RUNNING, RunStatus.CANCELLING})
ENDED = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.TIMED_OUT})
RETRYABLE = frozenset({RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.TIMED_OUT})

END_EVENT = {
    RunStatus.COMPLETED: "run.completed",
    RunStatus.FAILED: "run.failed",
    RunStatus.CANCELLED: "run.cancelled",
    RunStatus.TIMED_OUT: "run.timedOut",
}


class RuleError(Exception):
    """An action the run's state does not allow; ``code`` is API.md's error code."""

    def __init__(self, message: str, code: str = "invalid_state") -> None:
        super().__init__(message)
        self.code = code


def check_cancel(status: str) -> bool:
    """True when a cancel request changes the run; raise when the run has ended."""
    if status in ENDED:
        raise RuleError(f"the run has already ended ({status}); it cannot be cancelled")
    return status == RunStatus.RUNNING


def check_retry(status: str) -> None:
    """Raise unless the run is failed, cancelled or timed out."""
    if status not in RETRYABLE:
        raise RuleError(
            f"only a failed, cancelled or timed-out run can be retried; this run is {status}"
        )


def backoff_ms(policy: RetryPolicy, attempt: int, *, jitter: bool = True) -> int:
    """The delay before try ``attempt + 1`` after try ``attempt`` failed (capped, jittered)."""
    base = policy.initial_delay_ms * policy.factor ** max(0, attempt - 1)
    delay = min(float(policy.max_delay_ms), base)
    if jitter:
        delay *= random.uniform(0.8, 1.0)
    return max(0, int(delay))


@dataclass(frozen=True)
class InvokeFailure:
    """What to do after an invocation failed: retry after ``delay_ms``, or fail the run."""

    retry: bool
    delay_ms: int
    error: dict[str, Any]


def on_invoke_failure(
    policy: RetryPolicy, failures_so_far: int, reason: str, http_status: int | None
) -> InvokeFailure:
    """Decide after the ``failures_so_far + 1``-th failed invocation in a row."""
    attempt = failures_so_far + 1
    error: dict[str, Any] = {
        "type": "InvocationFailed",
        "code": "invocation_failed",
        "message": f"the app could not be invoked: {reason} (after {attempt} attempts)",
    }
    if http_status is not None:
        error["httpStatus"] = http_status
    if attempt >= max(1, policy.attempts):
        return InvokeFailure(False, 0, error)
    return InvokeFailure(True, backoff_ms(policy, attempt), error)


def policy_of(options: dict[str, Any] | None, default_attempts: int) -> RetryPolicy:
    """The retry policy stored with a workflow's options."""
    raw = (options or {}).get("retries")
    if isinstance(raw, dict):
        return RetryPolicy.model_validate(raw)
    return RetryPolicy(attempts=default_attempts)


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
