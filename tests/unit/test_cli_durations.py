"""Durations in the command's tables and lines as people read them: ``3d 4h``, ``2h 5m``,
``45s``, ``850ms``, never ``3d04h`` or ``2m05s``."""

from __future__ import annotations

import pytest

from stepline.cli.output import duration, event_line, run_lines, timing, took

RUN = {
    "id": "0192f0a0-0000-7000-8000-000000000001",
    "workflow": "report",
    "status": "completed",
    "input": None,
    "createdAt": "2026-12-01T12:00:00Z",
    "endedAt": "2026-12-04T16:00:30Z",
}


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0, "0ms"),
        (0.85, "850ms"),
        (3.44, "3.4s"),
        (45, "45s"),
        (90, "1m 30s"),
        (125, "2m 5s"),
        (3600, "1h"),
        (2 * 3600 + 5 * 60 + 9, "2h 5m"),
        (86400, "1d"),
        (3 * 86400 + 4 * 3600 + 59, "3d 4h"),
        (-1, "0ms"),
    ],
)
def test_a_duration_shows_in_at_most_two_units_apart(seconds: float, shown: str) -> None:
    """At most two units, each number beside its unit, a space between them, the second left
    out when it is zero."""
    assert duration(seconds) == shown


def test_every_line_shows_durations_alike() -> None:
    """A run's took, its start lag, end to end and SLA, and an event's duration all read the
    same way."""
    assert took(RUN["createdAt"], RUN["endedAt"]) == "3d 4h"
    run = {**RUN, "startLagMs": 125_000, "e2eMs": 7_500_000, "slaMs": 90_000, "slaBreached": True}
    assert "took 3d 4h" in "\n".join(run_lines(run))
    assert timing(run) == "start lag 2m 5s, end to end 2h 5m, SLA 1m 30s BREACHED"
    event = {"seq": 3, "at": "2026-12-01T12:00:00Z", "type": "invocation.ended"}
    assert event_line({**event, "durationMs": 1234, "httpStatus": 200}).endswith("http 200  1.2s")
