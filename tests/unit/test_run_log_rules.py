"""The orchestrator's rules for run logs (what a line weighs, how many fit) and for a scheduled
run's timing against its SLA."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from stepline.protocol import LogLine
from stepline_server.engine import logs, timing

T0 = datetime(2026, 1, 1, 9, 0, tzinfo=UTC)


def test_a_line_weighs_its_message_in_utf8_and_its_fields_as_json() -> None:
    """The byte cap counts the message's UTF-8 bytes plus the fields' JSON."""
    assert logs.line_size("héllo", None) == 6
    assert logs.line_size("a", {"k": 1}) == 1 + len('{"k":1}')


def test_rows_number_the_lines_in_order_with_their_size() -> None:
    """Lines become the store's records, numbered from 1 in the order the app wrote them."""
    lines = [
        LogLine(at=T0, level="info", message="one"),
        LogLine(at=T0, level="error", message="two", fields={"x": True}, stepName="s"),
    ]
    rows = logs.rows(lines)
    assert [(r["ord"], r["level"], r["message"], r["step_name"]) for r in rows] == [
        (1, "info", "one", None),
        (2, "error", "two", "s"),
    ]
    assert rows[1]["size"] == 3 + len('{"x":true}')


def test_lines_fit_until_the_first_that_does_not() -> None:
    """Lines are kept in order while the run has room in lines and bytes; a run that dropped
    one keeps no newer line, even one that would fit."""
    assert logs.kept(0, 0, 0, [10, 10]) == 2
    assert logs.kept(logs.MAX_LINES - 1, 0, 0, [1, 1, 1]) == 1
    assert logs.kept(0, logs.MAX_BYTES - 15, 0, [10, 10, 1]) == 1
    assert logs.kept(10, 10, 1, [1]) == 0
    assert logs.kept(logs.MAX_LINES, 0, 0, []) == 0


def test_start_lag_and_end_to_end_count_from_the_scheduled_time() -> None:
    """startLagMs is the first invocation's start minus the scheduled time, e2eMs the end."""
    t = timing.timing(T0, T0 + timedelta(seconds=2), T0 + timedelta(seconds=5), None, T0)
    assert (t.start_lag_ms, t.e2e_ms, t.sla_breached) == (2000, 5000, None)


def test_a_run_no_schedule_started_has_no_timing() -> None:
    """Without a scheduled time there is nothing to measure."""
    assert timing.timing(None, T0, T0, 1000, T0) == timing.Timing()


def test_the_sla_is_breached_when_the_start_lag_is_over_it() -> None:
    """Over the SLA is a breach; at it is not."""
    late = timing.timing(T0, T0 + timedelta(milliseconds=1001), None, 1000, T0)
    on_time = timing.timing(T0, T0 + timedelta(milliseconds=1000), None, 1000, T0)
    assert late.sla_breached is True and on_time.sla_breached is False


def test_a_run_not_started_breaches_once_the_sla_has_passed() -> None:
    """A run still waiting for its first invocation is judged by how long it has waited; one
    that ended without starting, by when it ended."""
    now = T0 + timedelta(minutes=2)
    assert timing.timing(T0, None, None, 60_000, now).sla_breached is True
    assert timing.timing(T0, None, None, 600_000, now).sla_breached is False
    ended = T0 + timedelta(seconds=30)
    assert timing.timing(T0, None, ended, 60_000, now).sla_breached is False


def test_a_clock_ahead_never_gives_a_negative_lag() -> None:
    """A start recorded before the scheduled time (another clock) counts as no lag."""
    assert timing.timing(T0, T0 - timedelta(seconds=1), None, None, T0).start_lag_ms == 0
