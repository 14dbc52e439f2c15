"""How a scheduled run kept to its time: start lag, end-to-end time and its schedule's SLA.

``startLagMs`` is the first invocation's start minus the scheduled time, ``e2eMs`` the end minus
the scheduled time, and ``slaBreached`` whether the start lag is over the schedule's SLA; a run
not started yet has breached it once the SLA has passed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True)
class Timing:
    """A run's timing against its scheduled time; None where it does not apply yet."""

    start_lag_ms: int | None = None
    e2e_ms: int | None = None
    sla_breached: bool | None = None


def _ms(later: datetime, earlier: datetime) -> int:
    """Whole milliseconds from ``earlier`` to ``later`` (cut, not rounded), never negative."""
    return max(0, (later - earlier) // timedelta(milliseconds=1))


def timing(
    scheduled_at: datetime | None,
    started_at: datetime | None,
    ended_at: datetime | None,
    sla_ms: int | None,
    now: datetime,
) -> Timing:
    """The run's timing; ``sla_breached`` is None without an SLA (or a scheduled time)."""
    if scheduled_at is None:
        return Timing()
    lag = _ms(started_at, scheduled_at) if started_at is not None else None
    e2e = _ms(ended_at, scheduled_at) if ended_at is not None else None
    breached: bool | None = None
    if sla_ms is not None:
        waited = lag if lag is not None else _ms(ended_at or now, scheduled_at)
        breached = waited > sla_ms
    return Timing(lag, e2e, breached)
