"""The alert rules: when an attempt is made again, when a notification is given up, and what
Slack is sent."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from stepline_server.engine import alerts as rules

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def test_retries_wait_one_second_doubling_to_five_minutes() -> None:
    """1 s after the first failure, then 2, 4, … and never more than 300 s."""
    assert [rules.retry_delay(n) for n in range(1, 11)] == [
        1, 2, 4, 8, 16, 32, 64, 128, 256, 300,
    ]  # fmt: skip
    assert rules.retry_delay(10_000) == 300


def test_a_notification_is_given_up_after_a_day() -> None:
    """Delivered on success; pending with the next delay within 24 h; failed once the next
    attempt would fall past them."""
    done = rules.after_attempt(True, 3, T0, T0 + timedelta(hours=30))
    assert done == rules.AttemptOutcome(rules.DeliveryStatus.DELIVERED, None)
    again = rules.after_attempt(False, 1, T0, T0 + timedelta(seconds=1))
    assert again == rules.AttemptOutcome(rules.DeliveryStatus.PENDING, 1.0)
    late = rules.after_attempt(False, 300, T0, T0 + timedelta(hours=23, minutes=58))
    assert late.status is rules.DeliveryStatus.FAILED


def _claimed(**over: object) -> dict[str, object]:
    row: dict[str, object] = {
        "id": uuid.uuid4(),
        "type": "run.failed",
        "created_at": T0,
        "data": {
            "workflow": "checkout",
            "status": "failed",
            "error": {"code": "step_failed", "message": "boom"},
        },
        "alert_id": uuid.uuid4(),
        "alert_name": "ops",
        "project_id": uuid.uuid4(),
        "project_name": "shop",
        "environment_id": uuid.uuid4(),
        "environment_name": "production",
        "run_id": uuid.uuid4(),
        "schedule_id": None,
        "schedule_workflow": None,
        "schedule_cron": None,
        "app_id": None,
        "app_name": None,
    }
    row.update(over)
    return row


def test_the_body_and_the_slack_text() -> None:
    """The webhook body names the run with its dashboard link; the Slack text names the type,
    the workflow, the run's status and the link."""
    n = _claimed()
    body = rules.notification_body(n, "https://sl.example.com/")
    link = f"https://sl.example.com/ui/runs/{n['run_id']}"
    assert body["run"] == {
        "id": str(n["run_id"]), "workflow": "checkout", "status": "failed",
        "error": {"code": "step_failed", "message": "boom"}, "url": link,
    }  # fmt: skip
    assert body["at"] == "2026-12-01T12:00:00Z" and "schedule" not in body and "app" not in body
    text = rules.slack_body(body)["text"]
    assert "run.failed" in text and "workflow checkout" in text and "failed" in text
    assert link in text and "step_failed: boom" in text
    test = rules.notification_body(_claimed(type="alert.test", run_id=None, data={}), "http://x")
    assert "run" not in test and "a test notification" in rules.slack_text(test)
