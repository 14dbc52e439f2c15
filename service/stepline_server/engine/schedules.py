"""Pure scheduling rules: cron parsing, DST-correct ticks, misfire and overlap policies."""

from __future__ import annotations

import enum
import re
import secrets
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, CroniterError, croniter

from stepline_server.engine import ids

__all__ = [
    "DEFAULT_DISABLE_AFTER",
    "MisfirePolicy",
    "OverlapDecision",
    "OverlapPolicy",
    "ScheduleError",
    "ScheduleStatus",
    "TickPlan",
    "decide_overlap",
    "new_schedule_id",
    "next_fire_after",
    "parse_cron",
    "parse_timezone",
    "plan_ticks",
    "should_disable",
    "tick_run_id",
]

# DST rules (croniter only sees naive local wall-clock times; we map them to instants):
# - A wall time inside a spring-forward gap (02:30 on 2026-03-08 in America/New_York) fires once,
#   at the first instant after the gap (03:00 local). Several gap times collapse into that one fire.
# - A wall time that happens twice at fall-back (01:30 on 2026-11-01) fires once, at its first
#   occurrence. This holds for every cron, @hourly and minutely too: a wall-clock tick fires once
#   per wall-clock time, so an @hourly schedule has a two-hour real gap (01:00 EDT, 02:00 EST).

DEFAULT_DISABLE_AFTER = 20
"""Consecutive failed runs after which a schedule is disabled, unless configured otherwise."""

_ALIASES = frozenset(
    {"@hourly", "@daily", "@weekly", "@monthly", "@yearly", "@annually", "@midnight"}
)
# croniter's "H" (hashed) and "R" (random) differ per process, so orchestrators would disagree.
_NON_DETERMINISTIC = re.compile(r"(?:^|[^A-Za-z])[HhRr](?:$|[^A-Za-z])")
_TICK_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "stepline:schedule-tick")
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


class OverlapPolicy(enum.StrEnum):
    """What a tick does while an earlier run of the same schedule is still active."""

    ALLOW = "allow"  # start anyway; runs may overlap
    SKIP = "skip"  # record the tick as skipped
    BUFFER_ONE = "buffer_one"  # hold one tick until the active run ends; drop further ones


class MisfirePolicy(enum.StrEnum):
    """What happens to ticks missed by more than the grace period (downtime, paused loop)."""

    FIRE_ONCE = "fire_once"  # one run, for the latest missed tick
    SKIP = "skip"  # no run for missed ticks
    FIRE_ALL = "fire_all"  # one run per missed tick, oldest first, capped


class ScheduleStatus(enum.StrEnum):
    """Lifecycle of a schedule."""

    ACTIVE = "active"  # firing
    PAUSED = "paused"  # stopped by a user; resume restarts it
    DISABLED = "disabled"  # stopped after too many consecutive failed runs
    COMPLETED = "completed"  # no more ticks will ever come


class OverlapDecision(enum.StrEnum):
    """What to do with one tick, given the schedule's overlap policy."""

    START = "start"  # start the tick's run now
    SKIP = "skip"  # record the tick as skipped
    BUFFER = "buffer"  # keep the tick; start it when the active run ends
    DROP = "drop"  # the buffer is full: record the tick as skipped


class ScheduleError(ValueError):
    """A schedule field is invalid; `field` names it, the message says why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True)
class TickPlan:
    """The outcome of one look at a schedule: runs to start, ticks to record, what comes next."""

    fire: tuple[datetime, ...]
    """Ticks to start a run for, oldest first; each run keeps its own scheduled time."""
    skipped: tuple[datetime, ...]
    """Ticks to record as skipped, oldest first, at most `cap` of them."""
    more_skipped: bool
    """True when further skipped ticks exist that are not listed (long downtime)."""
    last_tick: datetime | None
    """The newest tick at or before `now` (the new cursor), or the old cursor if none was due."""
    next_fire_at: datetime
    """The first tick after `now` (or after the cursor, if that lies in the future)."""


def parse_cron(expr: str) -> str:
    """Validate a 5-field cron expression or an @alias and return it normalised."""
    if not isinstance(expr, str) or not expr.strip():
        raise ScheduleError("cron", "cron must be a non-empty string such as '0 9 * * 1-5'")
    fields = expr.split()
    if len(fields) == 1 and fields[0].startswith("@"):
        alias = fields[0].lower()
        if alias not in _ALIASES:
            known = ", ".join(sorted(_ALIASES))
            raise ScheduleError("cron", f"cron alias {fields[0]!r} is not supported; use {known}")
        return alias
    if len(fields) != 5:
        raise ScheduleError(
            "cron",
            f"cron {expr!r} has {len(fields)} fields; expected 5 "
            "(minute hour day-of-month month day-of-week), seconds and years are not supported",
        )
    normalised = " ".join(fields)
    if _NON_DETERMINISTIC.search(normalised):
        raise ScheduleError(
            "cron", f"cron {expr!r} uses H or R, which are not the same on every orchestrator"
        )
    try:
        valid = croniter.is_valid(normalised)
    except (CroniterError, TypeError, ValueError):
        valid = False
    if not valid:
        raise ScheduleError("cron", f"cron {expr!r} is not a valid cron expression")
    try:
        croniter(normalised, datetime(2000, 1, 1)).get_next(datetime)
    except CroniterBadDateError:
        raise ScheduleError("cron", f"cron {expr!r} never fires (no such date)") from None
    return normalised


def parse_timezone(name: str) -> ZoneInfo:
    """Return the IANA time zone called `name`, or raise ScheduleError(field="timezone")."""
    if not isinstance(name, str) or not name.strip():
        raise ScheduleError("timezone", "timezone must be an IANA name such as 'Europe/London'")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ScheduleError(
            "timezone",
            f"timezone {name!r} is not a known IANA time zone name (e.g. 'Europe/London', 'UTC')",
        ) from None


def next_fire_after(cron: str, tz: ZoneInfo | str, after: datetime) -> datetime:
    """Return the first tick strictly after `after`, as an aware UTC datetime."""
    _require_aware("after", after)
    return next(_iter_ticks(parse_cron(cron), _zone(tz), after))


def plan_ticks(
    cron: str,
    tz: ZoneInfo | str,
    *,
    last_tick: datetime | None,
    created_at: datetime,
    now: datetime,
    misfire: MisfirePolicy,
    grace: timedelta,
    cap: int = 100,
) -> TickPlan:
    """Sort the ticks due since the cursor into runs to start and ticks to skip.

    Due ticks are those after `last_tick` (or `created_at` when none) and at or before `now`.
    A tick is on time when `now - tick <= grace`; on-time ticks always fire. Older ones are
    misfires and follow `misfire`; `cap` bounds how many misfires `fire_all` starts and how many
    skipped ticks are listed.
    """
    expr, zone, policy = parse_cron(cron), _zone(tz), MisfirePolicy(misfire)
    _require_aware("created_at", created_at)
    _require_aware("now", now)
    if last_tick is not None:
        _require_aware("last_tick", last_tick)
    if grace < timedelta(0):
        raise ValueError("grace must not be negative")
    if cap < 0:
        raise ValueError("cap must not be negative")

    cursor = last_tick if last_tick is not None else created_at
    boundary = now - grace
    keep = 2 * cap + 1  # enough for every policy's fire and skipped lists
    missed: list[datetime] = []
    on_time: list[datetime] = []
    latest_missed: datetime | None = None
    newest = last_tick
    unlisted = jumped = False
    ticks = _iter_ticks(expr, zone, cursor)
    while (tick := next(ticks)) <= now:
        newest = tick
        if tick >= boundary:
            on_time.append(tick)
            continue
        latest_missed = tick
        if len(missed) < keep:
            missed.append(tick)
            continue
        unlisted = True
        if not jumped:
            # A long outage: jump close to the boundary instead of walking every missed tick.
            jumped = True
            resume = _skip_ahead(expr, zone, tick, boundary)
            if resume > tick:
                ticks = _iter_ticks(expr, zone, resume)

    if policy is MisfirePolicy.SKIP:
        fire, skipped = on_time, missed
    elif policy is MisfirePolicy.FIRE_ONCE:
        fire = ([latest_missed] if latest_missed is not None else []) + on_time
        skipped = [t for t in missed if t != latest_missed]
    else:
        fire, skipped = missed[:cap] + on_time, missed[cap:]
    return TickPlan(
        fire=tuple(fire),
        skipped=tuple(skipped[:cap]),
        more_skipped=unlisted or len(skipped) > cap,
        last_tick=newest,
        next_fire_at=tick,
    )


def decide_overlap(policy: OverlapPolicy, *, active_runs: int, buffered: int) -> OverlapDecision:
    """Decide what a due tick does, given the schedule's active runs and buffered ticks."""
    if active_runs < 0 or buffered < 0:
        raise ValueError("active_runs and buffered must not be negative")
    policy = OverlapPolicy(policy)
    if policy is OverlapPolicy.ALLOW:
        return OverlapDecision.START
    if policy is OverlapPolicy.SKIP:
        return OverlapDecision.SKIP if active_runs else OverlapDecision.START
    # buffer_one: the buffered tick is older and starts first, so a new tick never jumps it.
    if buffered:
        return OverlapDecision.DROP
    return OverlapDecision.BUFFER if active_runs else OverlapDecision.START


def tick_run_id(schedule_id: str, tick: datetime) -> uuid.UUID:
    """Return the run id of one tick: the same on every orchestrator, for every edit."""
    _require_aware("tick", tick)
    instant = tick.astimezone(UTC).isoformat(timespec="microseconds")
    return ids.derived_id(tick, f"{schedule_id}@{instant}", _TICK_NAMESPACE)


def should_disable(consecutive_failures: int, threshold: int = DEFAULT_DISABLE_AFTER) -> bool:
    """Return True when a schedule has failed often enough to be disabled (0 means never)."""
    return threshold > 0 and consecutive_failures >= threshold


def new_schedule_id(now: datetime | None = None) -> str:
    """Return a new `wfs_` id: 26 Crockford base32 characters, ULID-like (time-ordered)."""
    moment = now if now is not None else datetime.now(UTC)
    millis = int(moment.timestamp() * 1000) & ((1 << 48) - 1)
    value = (millis << 80) | int.from_bytes(secrets.token_bytes(10), "big")
    chars = [_CROCKFORD[(value >> shift) & 31] for shift in range(125, -5, -5)]
    return "wfs_" + "".join(chars)


def _zone(tz: ZoneInfo | str) -> ZoneInfo:
    return tz if isinstance(tz, ZoneInfo) else parse_timezone(tz)


def _require_aware(name: str, value: datetime) -> None:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be a timezone-aware datetime")


def _iter_ticks(expr: str, zone: ZoneInfo, after: datetime) -> Iterator[datetime]:
    """Yield tick instants (UTC) strictly after `after`, strictly increasing."""
    local = after.astimezone(zone).replace(tzinfo=None, fold=0)
    wall_clock = croniter(expr, local)
    last = after
    while True:
        instant = _wall_to_instant(wall_clock.get_next(datetime), zone)
        # Gap times collapse onto one instant and repeated-hour times may precede `after`.
        if instant > last:
            last = instant
            yield instant


def _wall_to_instant(wall: datetime, zone: ZoneInfo) -> datetime:
    """Map a naive local wall time to a UTC instant: first occurrence, or the end of a gap."""
    early = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    late = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    if early == late:
        return early
    first, second = min(early, late), max(early, late)
    if first.astimezone(zone).replace(tzinfo=None) == wall.replace(fold=0):
        return first  # the wall time happens twice: fire at its first occurrence
    return _transition(zone, first, second)  # the wall time does not exist


def _transition(zone: ZoneInfo, lo: datetime, hi: datetime) -> datetime:
    """Return the first whole second in (lo, hi] whose UTC offset is hi's: the end of a gap."""
    target = hi.astimezone(zone).utcoffset()
    low, high = int(lo.timestamp()), int(hi.timestamp())
    while high - low > 1:
        mid = (low + high) // 2
        if datetime.fromtimestamp(mid, zone).utcoffset() == target:
            high = mid
        else:
            low = mid
    return datetime.fromtimestamp(high, UTC)


def _skip_ahead(expr: str, zone: ZoneInfo, cursor: datetime, boundary: datetime) -> datetime:
    """Return a point after `cursor` with only a few ticks between it and `boundary`."""
    width = timedelta(hours=1)
    while True:
        candidate = boundary - width
        if candidate <= cursor:
            return cursor
        if next(_iter_ticks(expr, zone, candidate)) < boundary:
            return candidate
        width *= 2
