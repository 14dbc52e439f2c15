"""Rate limits: when the next runs of a rate-limited workflow may start (a sliding window)."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True)
class RateLimit:
    """At most ``limit`` runs start in any window of ``period``."""

    limit: int
    period: timedelta


def start_times(
    rate: RateLimit, starts: Sequence[datetime], now: datetime, waiting: int
) -> list[datetime]:
    """When each of ``waiting`` runs (in the order they are to go) may start, given the
    ``starts`` of runs within the last period: a run may start at ``t`` when fewer than
    ``rate.limit`` runs started in ``(t - period, t]``. A time at or before ``now`` means now.

    Each run takes the earliest slot free; a slot frees one period after the start that took
    it, so the runs beyond the limit are spread over the periods the limit allows."""
    recent = sorted(s for s in starts if s > now - rate.period)[-rate.limit :]
    slots = [s + rate.period for s in recent]
    slots += [now] * (rate.limit - len(slots))
    heapq.heapify(slots)
    times: list[datetime] = []
    for _ in range(waiting):
        at = max(now, heapq.heappop(slots))
        times.append(at)
        heapq.heappush(slots, at + rate.period)
    return times


def room(times: Sequence[datetime], now: datetime) -> int:
    """How many of the runs given ``times`` (as :func:`start_times` answers) may start now."""
    return sum(1 for t in times if t <= now)
