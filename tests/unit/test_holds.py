"""What holds a run that is not ended: a pause, its app unreachable, a concurrency cap, a rate
limit, or nothing."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from stepline_server.engine.holds import HeldBy, RunState, held_by

NOW = datetime(2026, 1, 1, tzinfo=UTC)
DUE = RunState(
    ended=False,
    paused=False,
    leased=False,
    held=False,
    undelivered=False,
    rate_limited=False,
    started=False,
    ready_at=NOW,
)


@pytest.mark.parametrize(
    ("run", "expected"),
    [
        (DUE, None),
        (replace(DUE, paused=True), HeldBy.PAUSE),
        (replace(DUE, paused=True, undelivered=True, held=True), HeldBy.PAUSE),
        (replace(DUE, undelivered=True, started=True), HeldBy.APP_UNREACHABLE),
        (replace(DUE, held=True, ready_at=NOW + timedelta(hours=1)), HeldBy.CONCURRENCY),
        (replace(DUE, rate_limited=True, ready_at=NOW + timedelta(seconds=5)), HeldBy.RATE_LIMIT),
        (replace(DUE, rate_limited=True), None),  # due now: it goes
        (replace(DUE, rate_limited=True, started=True, ready_at=None), None),  # waits on a step
        (replace(DUE, ended=True, paused=True), None),
        (replace(DUE, leased=True, paused=True), None),  # being invoked: it moves
    ],
)
def test_what_holds_a_run(run: RunState, expected: HeldBy | None) -> None:
    """A pause comes first, then an unreachable app, a full concurrency cap, a rate limit that
    defers a run not started yet; an ended run, or one being invoked, is held by nothing."""
    assert held_by(run, NOW) == expected
