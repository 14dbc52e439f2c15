"""The workflows page's options in words: every option the SDK registers said as a sentence,
durations in words, anything unknown still shown."""

from __future__ import annotations

from stepline_server.ui.options import readable


def test_every_registered_option_reads_as_words() -> None:
    """Retries, time limit, rate limit, singleton, event, schedule with SLA, delivery window
    and typed input each get a line; nothing reads as milliseconds."""
    lines = dict(
        readable(
            {
                "retries": {"attempts": 5, "initialDelayMs": 500, "maxDelayMs": 60000, "factor": 3},
                "timeoutMs": 86_400_000 * 30,
                "rateLimit": {"limit": 100, "periodMs": 60000, "key": "accountId"},
                "singletonKey": "userId",
                "onEvent": "user.signed_up",
                "schedule": {"cron": "0 * * * *", "timezone": "Europe/Paris", "slaMs": 30000},
                "deliveryWindowMs": 3_600_000,
                "inputSchema": {"title": "Order", "type": "object"},
                "somethingNew": {"x": 1},
            }
        )
    )
    assert lines == {
        "retries": "5 attempts, waits 500 ms, growing 3x to at most 1 min",
        "timeout": "30 days",
        "rate limit": "100 run(s) start per 1 min per accountId",
        "singleton": "one run at a time per userId",
        "started by event": "user.signed_up",
        "schedule": "0 * * * * (Europe/Paris), SLA 30 s",
        "delivery window": "1 h",
        "input": "typed (Order)",
        "somethingNew": '{"x": 1}',
    }


def test_a_concurrency_cap_names_its_key() -> None:
    """A concurrency cap with a key says it counts per that key's value; without retries
    beyond the first attempt it says there is no retry."""
    lines = readable({"retries": {"attempts": 1}, "concurrency": 2, "concurrencyKey": "userId"})
    assert lines == [
        ("retries", "1 attempt (no retry)"),
        ("concurrency", "at most 2 at once per userId"),
    ]
