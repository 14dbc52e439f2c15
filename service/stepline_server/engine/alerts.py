"""Alert rules as plain functions: the notification types, when a delivery is tried again, and
what a webhook or a Slack destination is sent.

A notification is delivered at least once under one id: a failed attempt (no answer, or any
answer but 2xx) is tried again after :func:`retry_delay` (1 s doubling to 5 min) until
:data:`DELIVERY_WINDOW_SECONDS` have passed since it was recorded; then it is ``failed``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any


class NotificationType(enum.StrEnum):
    """What an alert can be about (``alert.test`` is only ever sent by the test route)."""

    RUN_FAILED = "run.failed"
    RUN_TIMED_OUT = "run.timedOut"
    RUN_STUCK = "run.stuck"
    APP_UNREACHABLE = "app.unreachable"  # a run failed with error code app_unreachable
    SCHEDULE_DISABLED = "schedule.disabled"  # auto-disabled after consecutive failures
    SCHEDULE_SLA_BREACHED = "schedule.slaBreached"
    ALERT_TEST = "alert.test"


SUBSCRIBABLE: tuple[str, ...] = tuple(t.value for t in NotificationType if t.value != "alert.test")
"""The types an alert's ``on`` may list."""


class DestinationType(enum.StrEnum):
    WEBHOOK = "webhook"  # the notification's JSON, signed with the alert's secret
    SLACK = "slack"  # Slack's incoming-webhook JSON, {"text": ...}


class DeliveryStatus(enum.StrEnum):
    PENDING = "pending"  # to be sent (again)
    DELIVERED = "delivered"  # a 2xx answer
    FAILED = "failed"  # not delivered within the delivery window


DELIVERY_WINDOW_SECONDS = 24 * 3600.0
FIRST_DELAY_SECONDS = 1.0
MAX_DELAY_SECONDS = 300.0
SEND_TIMEOUT_SECONDS = 10.0
"""How long one attempt waits for the receiver's answer."""


def retry_delay(attempts: int, cap: float = MAX_DELAY_SECONDS) -> float:
    """Seconds before the next attempt, after ``attempts`` failed ones (1, 2, 4, … up to
    ``cap``)."""
    if attempts <= 1:
        return min(FIRST_DELAY_SECONDS, cap)
    return min(cap, FIRST_DELAY_SECONDS * 2.0 ** min(attempts - 1, 32))


@dataclass(frozen=True)
class AttemptOutcome:
    """What the store records after one attempt."""

    status: DeliveryStatus
    retry_in_seconds: float | None  # pending: the next attempt's delay


def after_attempt(
    delivered: bool,
    attempts: int,
    created_at: datetime,
    now: datetime,
    window_seconds: float = DELIVERY_WINDOW_SECONDS,
) -> AttemptOutcome:
    """The notification's state after its ``attempts``-th attempt (counting this one)."""
    if delivered:
        return AttemptOutcome(DeliveryStatus.DELIVERED, None)
    delay = retry_delay(attempts)
    if now + timedelta(seconds=delay) - created_at > timedelta(seconds=window_seconds):
        return AttemptOutcome(DeliveryStatus.FAILED, None)
    return AttemptOutcome(DeliveryStatus.PENDING, delay)


def run_link(base_url: str, run_id: str) -> str:
    """The run's page in the dashboard."""
    return f"{base_url.rstrip('/')}/ui/runs/{run_id}"


def _ts(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


def _ref(ident: Any, name: Any) -> dict[str, Any]:
    return {"id": str(ident), "name": name}


def notification_body(n: Mapping[str, Any], base_url: str) -> dict[str, Any]:
    """The JSON a webhook receives for a claimed notification ``n`` (its row, joined with its
    alert, environment, project, schedule and app): the same on every attempt."""
    data = n["data"] or {}
    body: dict[str, Any] = {
        "id": str(n["id"]),
        "type": n["type"],
        "at": _ts(n["created_at"]),
        "alert": _ref(n["alert_id"], n["alert_name"]),
        "project": _ref(n["project_id"], n["project_name"]),
        "environment": _ref(n["environment_id"], n["environment_name"]),
    }
    if n["run_id"] is not None:
        run_id = str(n["run_id"])
        body["run"] = {
            "id": run_id,
            "workflow": data.get("workflow"),
            "status": data.get("status"),
            "error": data.get("error"),
            "url": run_link(base_url, run_id),
        }
    if n["schedule_id"] is not None:
        body["schedule"] = {
            "id": n["schedule_id"],
            "workflow": n["schedule_workflow"] or data.get("workflow"),
            "cron": n["schedule_cron"],
        }
    if n["app_id"] is not None:
        body["app"] = _ref(n["app_id"], n["app_name"])
    return body


def slack_text(body: dict[str, Any]) -> str:
    """One line naming the type, the workflow, the run's status and its dashboard link."""
    kind = body["type"]
    run = body.get("run")
    schedule = body.get("schedule")
    workflow = (run or schedule or {}).get("workflow")
    parts = [f"Stepline {kind}", f"alert {body['alert']['name']}"]
    if workflow:
        parts.append(f"workflow {workflow}")
    if schedule:
        parts.append(f"schedule {schedule['id']} ({schedule['cron']})")
    if run:
        status = f"run {run['id']} {run['status']}"
        error = run.get("error") or {}
        if error.get("code"):
            status += f" ({error['code']}: {str(error.get('message', ''))[:200]})"
        parts.append(status)
        parts.append(f"<{run['url']}|open the run>")
    elif kind == NotificationType.ALERT_TEST:
        parts.append("a test notification")
    return " · ".join(parts)


def slack_body(body: dict[str, Any]) -> dict[str, Any]:
    """What a Slack incoming webhook is sent for the notification ``body``."""
    return {"text": slack_text(body)}


def attempt_error(http_status: int | None, reason: str) -> str:
    """The ``lastError`` of a failed attempt: short, never the receiver's answer."""
    if http_status is not None:
        return f"the receiver answered HTTP {http_status}"
    return reason[:200]
