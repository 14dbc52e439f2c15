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
    DEBOUNCE = "debounce"  # it gathers its workflow's starts until its debounce fires
    BATCH = "batch"  # it gathers events until its batch is full or its wait is over


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
    gathers: str | None = None  # its workflow debounces or batches ("debounce", "batch")


def held_by(run: RunState, now: datetime) -> HeldBy | None:
    """What holds the run, the first that applies (a gathering first, then in the order of
    :class:`HeldBy`); None when
    it has ended, is being invoked, is due, or waits on a step of its own."""
    if run.ended or run.leased:
        return None
    if run.gathers is not None and not run.started and run.ready_at is None:
        return HeldBy(run.gathers)  # a gathering run has no due time until it fires
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
