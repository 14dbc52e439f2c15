"""Why a run that is not ended does not move: what holds it, from its row and its pauses."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum


class HeldBy(StrEnum):
    PAUSE = "pause"  # its workflow or app is paused: set aside until resumed
    APP_UNREACHABLE = "appUnreachable"  # its app could not be invoked: tried again with backoff
    CONCURRENCY = "concurrency"  # its workflow's concurrency cap is full: goes when a run ends
    RATE_LIMIT = "rateLimit"  # its workflow's rate limit defers its start


@dataclass(frozen=True)
class RunState:
    """What a run's row says about whether it can move now."""

    ended: bool
    paused: bool  # its workflow or app is paused
    leased: bool  # an invocation is running it
    held: bool  # set aside by its workflow's concurrency cap
    undelivered: bool  # its last invocations could not be delivered
    rate_limited: bool  # its workflow has a rate limit
    started: bool  # it was invoked at least once
    ready_at: datetime | None


def held_by(run: RunState, now: datetime) -> HeldBy | None:
    """What holds the run, the first that applies in the order of :class:`HeldBy`; None when
    it has ended, is being invoked, is due, or waits on a step of its own."""
    if run.ended or run.leased:
        return None
    if run.paused:
        return HeldBy.PAUSE
    if run.undelivered:
        return HeldBy.APP_UNREACHABLE
    if run.held:
        return HeldBy.CONCURRENCY
    deferred = run.ready_at is not None and run.ready_at > now
    if run.rate_limited and not run.started and deferred:
        return HeldBy.RATE_LIMIT
    return None
