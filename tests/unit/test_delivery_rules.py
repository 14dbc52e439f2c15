"""The delivery rules: backoff, Retry-After and the delivery window, as plain functions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from stepline_server.engine import runs as rules

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def decide(failures: int, since: datetime | None, **kw: object) -> rules.DeliveryFailure:
    args: dict = {"reason": "could not reach the app", "http_status": None, "jitter": False}
    args.update(kw)
    return rules.on_delivery_failure(
        failures_so_far=failures, failing_since=since, now=NOW, window_seconds=86400, **args
    )


def test_backoff_doubles_from_one_second_to_five_minutes() -> None:
    """The first failure waits 1 s, then 2, 4, ...; never more than 5 minutes."""
    delays = [decide(n, NOW).delay_ms for n in range(12)]
    assert delays[:4] == [1000, 2000, 4000, 8000]
    assert max(delays) == 300_000 and all(d.__class__ is int for d in delays)


def test_retry_after_is_honoured() -> None:
    """An app that says Retry-After: 30 is invoked again in 30 s."""
    assert decide(0, None, retry_after_seconds=30.0).delay_ms == 30_000


def test_within_the_window_a_failure_is_tried_again_and_after_it_the_run_fails() -> None:
    """The window counts from the first failure of the streak, whatever the number of tries;
    the last try falls on the window's end; past it the run fails with app_unreachable."""
    near = decide(40, NOW - timedelta(seconds=86399), http_status=503)
    assert near.retry and near.delay_ms == 1000
    spent = decide(3, NOW - timedelta(days=1), http_status=503)
    assert not spent.retry and spent.error is not None
    assert spent.error["code"] == "app_unreachable" and spent.error["httpStatus"] == 503
    assert "for 1d" in spent.error["message"] and "(after 4 attempts)" in spent.error["message"]


def test_a_workflow_may_set_its_own_window() -> None:
    """deliveryWindowMs in a workflow's options wins over the default."""
    assert rules.delivery_window({"deliveryWindowMs": 2500}, 86400) == 2.5
    assert rules.delivery_window({}, 86400) == 86400
    assert rules.delivery_window({"deliveryWindowMs": True}, 60) == 60
