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


def test_the_first_retry_waits_a_second_and_the_day_is_inclusive() -> None:
    """No attempt yet or one: 1 s. A next attempt falling exactly at the end of the day is
    still made; a second later it is not."""
    assert rules.retry_delay(0) == rules.retry_delay(1) == 1.0
    assert rules.retry_delay(1, cap=0.5) == 0.5
    edge = T0 + timedelta(days=1, seconds=-300)
    assert rules.after_attempt(False, 20, T0, edge).status is rules.DeliveryStatus.PENDING
    past = edge + timedelta(seconds=1)
    assert rules.after_attempt(False, 20, T0, past).status is rules.DeliveryStatus.FAILED


def test_a_schedules_notification_names_everything_it_joins() -> None:
    """Every reference carries its id and name; a schedule's notification names the
    schedule (its workflow, else the one in the data) and the app."""
    n = _claimed(
        type="schedule.disabled", run_id=None, data={"workflow": "nightly"},
        schedule_id="wfs_1", schedule_cron="0 9 * * *", app_id=7, app_name="shop-app",
    )  # fmt: skip
    body = rules.notification_body(n, "http://x")
    assert body == {
        "id": str(n["id"]),
        "type": "schedule.disabled",
        "at": "2026-12-01T12:00:00Z",
        "alert": {"id": str(n["alert_id"]), "name": "ops"},
        "project": {"id": str(n["project_id"]), "name": "shop"},
        "environment": {"id": str(n["environment_id"]), "name": "production"},
        "schedule": {"id": "wfs_1", "workflow": "nightly", "cron": "0 9 * * *"},
        "app": {"id": "7", "name": "shop-app"},
    }
    assert rules.slack_text(body) == (
        "Stepline schedule.disabled · alert ops · workflow nightly · schedule wfs_1 (0 9 * * *)"
    )
    own = rules.notification_body(_claimed(schedule_id="wfs_2", schedule_workflow="w"), "x")
    assert own["schedule"]["workflow"] == "w"


def test_the_slack_text_of_a_failed_run_in_full() -> None:
    """The error's code and the first 200 characters of its message follow the status."""
    n = _claimed(data={"workflow": "checkout", "status": "failed",
                       "error": {"code": "card_declined", "message": "x" * 300}})  # fmt: skip
    body = rules.notification_body(n, "https://sl.example.com")
    run = f"{n['run_id']}"
    assert rules.slack_text(body) == (
        f"Stepline run.failed · alert ops · workflow checkout · run {run} failed "
        f"(card_declined: {'x' * 200}) · <https://sl.example.com/ui/runs/{run}|open the run>"
    )
    bare = rules.notification_body(_claimed(data={"status": "failed",
                                                 "error": {"code": "c"}}), "h")  # fmt: skip
    assert f"run {bare['run']['id']} failed (c: ) · <" in rules.slack_text(bare)


def test_a_failed_attempt_is_said_shortly() -> None:
    assert rules.attempt_error(503, "ignored") == "the receiver answered HTTP 503"
    assert rules.attempt_error(None, "r" * 300) == "r" * 200


def test_a_test_notification_says_so_and_links_keep_their_host() -> None:
    test = rules.notification_body(_claimed(type="alert.test", run_id=None, data={}), "http://x")
    assert rules.slack_text(test) == "Stepline alert.test · alert ops · a test notification"
    assert rules.run_link("http://hostX/", "r1") == "http://hostX/ui/runs/r1"
