"""Schedules: their rows, the ticks they fire (each exactly once), and what a run's end changes.

A tick is fired inside one transaction that holds the schedule's row lock: its outcome goes
into ``schedule_ticks`` (whose primary key admits it once), its run gets the id
``tick_run_id(schedule, tick)`` (so it starts once), and the schedule's cursor moves on only
under the version the ticks were planned with. Times that decide firing come from the caller.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from stepline_server.engine import ids
from stepline_server.engine import schedules as rules
from stepline_server.engine.runs import RunStatus
from stepline_server.store import alerts, apps, runs
from stepline_server.store.db import Conn, Q, Record

# Why a tick did not start a run (schedule_ticks.reason), or why it started late.
MISFIRE = "misfire"  # older than the grace period when planned
OVERLAP = "overlap"  # a run of the schedule was still active
BUFFER_FULL = "buffer_full"  # buffer_one already held a tick
SUPERSEDED = "superseded"  # the schedule changed (or paused) while the tick was buffered
NO_WORKFLOW = "workflow_not_found"  # the workflow is no longer registered

_FIELDS = ("cron", "timezone", "input", "overlap", "misfire", "disable_after", "sla_ms")


class InvalidTransition(Exception):
    """The schedule's status does not allow the change (e.g. pausing a disabled schedule)."""


class WorkflowGone(Exception):
    """The schedule's workflow is no longer registered."""


class TickFailed(Exception):
    """Firing a schedule's ticks failed (nothing of it was written); ``schedule_id`` names it."""

    def __init__(self, schedule_id: str) -> None:
        super().__init__(f"firing the ticks of schedule {schedule_id} failed")
        self.schedule_id = schedule_id


@dataclass(frozen=True)
class ScheduleDef:
    """What a user (or a workflow's code) defines; cron and timezone already validated."""

    workflow: str
    cron: str
    timezone: str = "UTC"
    input: Any = None
    overlap: rules.OverlapPolicy = rules.OverlapPolicy.ALLOW
    misfire: rules.MisfirePolicy = rules.MisfirePolicy.FIRE_ONCE
    disable_after: int = rules.DEFAULT_DISABLE_AFTER
    sla_ms: int | None = None  # the longest start lag its runs should have


async def create(
    conn: Conn, project_id: uuid.UUID, d: ScheduleDef, now: datetime, *, source: str = "api"
) -> Record | None:
    """Create a schedule whose first tick is the first after ``now``; None on a conflict."""
    return await conn.fetchrow(
        Q["insert_schedule"],
        rules.new_schedule_id(now),
        project_id,
        d.workflow,
        d.cron,
        d.timezone,
        d.input,
        d.overlap.value,
        d.misfire.value,
        d.disable_after,
        source,
        rules.next_fire_after(d.cron, d.timezone, now),
        now,
        d.sla_ms,
    )


async def sla_of(conn: Conn, schedule_id: str) -> int | None:
    """The SLA (ms) a schedule sets on its runs' start lag, None when none (or it is gone)."""
    value: int | None = await conn.fetchval(Q["schedule_sla"], schedule_id)
    return value


async def get(conn: Conn, project_id: uuid.UUID, schedule_id: str) -> Record | None:
    return await conn.fetchrow(Q["get_schedule"], project_id, schedule_id)


async def page(
    conn: Conn, project_id: uuid.UUID, after: tuple[datetime, str] | None, limit: int
) -> list[Record]:
    """Schedules oldest first, after the keyset cursor ``after``."""
    at, ident = after if after else (None, None)
    return list(await conn.fetch(Q["list_schedules"], project_id, at, ident, limit))


async def delete(conn: Conn, project_id: uuid.UUID, schedule_id: str) -> bool:
    """Remove a schedule and its tick records; runs it started stay."""
    return await conn.fetchval(Q["delete_schedule"], project_id, schedule_id) is not None


async def ticks(conn: Conn, schedule_id: str) -> list[Record]:
    """Every planned tick of a schedule, oldest first."""
    return list(await conn.fetch(Q["list_ticks"], schedule_id))


async def next_fire_at(conn: Conn) -> datetime | None:
    """The soonest next tick of any active schedule."""
    value: datetime | None = await conn.fetchval(Q["next_schedule_fire_at"])
    return value


async def update(
    conn: Conn, project_id: uuid.UUID, schedule_id: str, changes: dict[str, Any], now: datetime
) -> Record | None:
    """Apply ``changes`` (keys of ScheduleDef, values validated); None when there is no such
    schedule. A new cron or time zone starts counting from ``now``."""
    async with conn.transaction():
        row = await conn.fetchrow(Q["lock_schedule"], project_id, schedule_id)
        if row is None:
            return None
        return await _rewrite(conn, row, changes, now)


async def pause(
    conn: Conn, project_id: uuid.UUID, schedule_id: str, now: datetime
) -> Record | None:
    """Stop firing; pausing a paused schedule changes nothing."""
    async with conn.transaction():
        row = await conn.fetchrow(Q["lock_schedule"], project_id, schedule_id)
        if row is None or row["status"] == rules.ScheduleStatus.PAUSED:
            return row
        if row["status"] != rules.ScheduleStatus.ACTIVE:
            raise InvalidTransition(
                f"the schedule is {row['status']}; only an active schedule can be paused"
                + (" (resume re-enables it)" if row["status"] == "disabled" else "")
            )
        return await _rewrite(conn, row, {"status": "paused"}, now)


async def resume(
    conn: Conn, project_id: uuid.UUID, schedule_id: str, now: datetime
) -> Record | None:
    """Fire again from the first tick after ``now``; a disabled schedule's failures reset."""
    async with conn.transaction():
        row = await conn.fetchrow(Q["lock_schedule"], project_id, schedule_id)
        if row is None or row["status"] == rules.ScheduleStatus.ACTIVE:
            return row
        if row["status"] == rules.ScheduleStatus.COMPLETED:
            raise InvalidTransition("the schedule is completed: its cron has no further tick")
        changes = {"status": "active", "consecutive_failures": 0}
        return await _rewrite(conn, row, changes, now, restart=True)


async def trigger(
    conn: Conn, project_id: uuid.UUID, schedule_id: str, now: datetime
) -> Record | None:
    """Start one run of the schedule now (trigger ``manual``), whatever its status and overlap
    policy; None when there is no such schedule."""
    row = await get(conn, project_id, schedule_id)
    if row is None:
        return None
    run = await runs.insert(conn, _new_run(row, ids.new_id(), now, "manual"))
    if run is None:  # a fresh id: only a workflow no longer registered creates no run
        raise WorkflowGone(f"the workflow {row['workflow']!r} is no longer registered")
    return run


async def fire_due(
    conn: Conn, now: datetime, grace: timedelta, cap: int, exclude: Sequence[str] = ()
) -> tuple[str, str, list[datetime]] | None:
    """Plan and fire the due ticks of one due schedule not in ``exclude``: its id, its workflow
    and the ticks whose runs started; None when none is due (or every due one is held by
    another scheduler)."""
    async with conn.transaction():
        row = await conn.fetchrow(Q["claim_due_schedule"], now, list(exclude))
        if row is None:
            return None
        try:
            return row["id"], row["workflow"], await _fire(conn, row, now, grace, cap)
        except Exception as exc:
            raise TickFailed(row["id"]) from exc


async def _fire(
    conn: Conn, row: Record, now: datetime, grace: timedelta, cap: int
) -> list[datetime]:
    sid, version = row["id"], row["version"]
    plan = rules.plan_ticks(
        row["cron"],
        row["timezone"],
        last_tick=row["last_tick_at"],
        created_at=row["created_at"],
        now=now,
        misfire=rules.MisfirePolicy(row["misfire"]),
        grace=grace,
        cap=cap,
    )
    if plan.skipped:
        await conn.execute(Q["record_ticks_skipped"], sid, version, list(plan.skipped), MISFIRE)
    registered = bool(plan.fire) and (
        await apps.workflow(conn, row["project_id"], row["workflow"]) is not None
    )
    overlap = rules.OverlapPolicy(row["overlap"])
    active = 0
    if plan.fire and overlap is not rules.OverlapPolicy.ALLOW:
        active = await conn.fetchval(Q["count_active_schedule_runs"], sid)
    buffered: datetime | None = row["buffered_tick_at"]
    started: list[datetime] = []
    last_fired = None
    if buffered is not None:  # the older tick goes first, so a new one never jumps it
        verdict = await _buffered_verdict(conn, row)
        if verdict == _START:
            run_id = rules.tick_run_id(sid, buffered)
            await conn.execute(Q["settle_buffered_tick"], sid, buffered, "fired", OVERLAP, run_id)
            await runs.insert(conn, _new_run(row, run_id, buffered, "schedule"))
            started.append(buffered)
            active, last_fired, buffered = active + 1, buffered, None
        elif verdict != _WAIT:
            await _drop_buffered(conn, sid, buffered, verdict)
            buffered = None
    for tick in plan.fire:
        if not registered:
            await _record(conn, sid, tick, version, "skipped", NO_WORKFLOW)
            continue
        decision = rules.decide_overlap(overlap, active_runs=active, buffered=int(bool(buffered)))
        if decision is rules.OverlapDecision.START:
            run_id = rules.tick_run_id(sid, tick)
            reason = MISFIRE if tick < now - grace else None
            if await _record(conn, sid, tick, version, "fired", reason, run_id):
                await runs.insert(conn, _new_run(row, run_id, tick, "schedule"))
                active, last_fired = active + 1, tick
                started.append(tick)
        elif decision is rules.OverlapDecision.BUFFER:
            if await _record(conn, sid, tick, version, "buffered", OVERLAP):
                buffered = tick
        else:
            reason = OVERLAP if decision is rules.OverlapDecision.SKIP else BUFFER_FULL
            await _record(conn, sid, tick, version, "skipped", reason)
    advanced = await conn.fetchval(
        Q["advance_schedule"],
        sid,
        version,
        plan.last_tick,
        plan.next_fire_at,
        last_fired,
        buffered,
    )
    if advanced is None:  # cannot happen under the row lock; never fire on a stale plan
        raise RuntimeError(f"schedule {sid} changed version while its ticks were planned")
    return started


async def on_run_ended(conn: Conn, row: Record) -> None:
    """A run of a schedule ended: count failures (disabling the schedule at its threshold) and
    release the buffered tick when no run of the schedule is active any more."""
    status = row["status"]
    delta = 0 if status == RunStatus.COMPLETED else None
    if status in (RunStatus.FAILED, RunStatus.TIMED_OUT):
        delta = 1
    async with conn.transaction():
        sched = await conn.fetchrow(Q["lock_schedule_by_id"], row["schedule_id"])
        if sched is None:
            return
        failures = 0 if delta == 0 else sched["consecutive_failures"] + (delta or 0)
        disable = (
            delta == 1
            and sched["status"] == rules.ScheduleStatus.ACTIVE
            and rules.should_disable(failures, sched["disable_after"])
        )
        sched = await conn.fetchrow(Q["schedule_run_ended"], sched["id"], delta, disable)
        assert sched is not None
        if disable:
            await alerts.record_schedule_disabled(conn, sched["id"], row["id"])
        await _release_buffered(conn, sched)


_START, _WAIT = "start", "wait"


async def _buffered_verdict(conn: Conn, sched: Record) -> str:
    """What the schedule's buffered tick may do now (its row locked): ``_START``, ``_WAIT``
    while a run of the schedule is active, or the reason it is let go."""
    record = await conn.fetchrow(Q["get_tick"], sched["id"], sched["buffered_tick_at"])
    if (
        sched["status"] != rules.ScheduleStatus.ACTIVE
        or record is None
        or record["version"] != sched["version"]
    ):
        return SUPERSEDED
    if await conn.fetchval(Q["count_active_schedule_runs"], sched["id"]):
        return _WAIT  # another run (e.g. a manual trigger) is still going
    if await apps.workflow(conn, sched["project_id"], sched["workflow"]) is None:
        return NO_WORKFLOW
    return _START


async def _release_buffered(conn: Conn, sched: Record) -> None:
    """The run holding back the buffered tick ended: let the tick go if it no longer may
    start, else make the schedule due at it and wake the schedulers, which start its run
    (the scheduler is the one place ticks start runs, and are counted)."""
    if sched["buffered_tick_at"] is None:
        return
    verdict = await _buffered_verdict(conn, sched)
    if verdict == _START:
        await conn.execute(Q["buffered_tick_due"], sched["id"])
    elif verdict != _WAIT:
        await _drop_buffered(conn, sched["id"], sched["buffered_tick_at"], verdict)


async def _drop_buffered(conn: Conn, sid: str, tick: datetime, reason: str) -> None:
    await conn.execute(Q["take_buffered_tick"], sid)
    await conn.execute(Q["settle_buffered_tick"], sid, tick, "skipped", reason, None)


async def sync_code(
    conn: Conn, app: Record, declared: dict[str, ScheduleDef], now: datetime
) -> None:
    """Make the app's code schedules match what its workflows declare: create, change (only
    when the declaration changed, the SLA included; status and disableAfter are kept) or
    delete them."""
    pid = app["project_id"]
    async with conn.transaction():
        for name, d in declared.items():
            row = await conn.fetchrow(Q["get_code_schedule"], pid, name)
            if row is None:
                await create(conn, pid, d, now, source="code")
                continue
            wanted = {
                "cron": d.cron,
                "timezone": d.timezone,
                "input": d.input,
                "overlap": d.overlap.value,
                "misfire": d.misfire.value,
                "sla_ms": d.sla_ms,
            }
            changes = {k: v for k, v in wanted.items() if row[k] != v}
            if changes:
                await _rewrite(conn, row, changes, now)
        await conn.fetch(Q["delete_stale_code_schedules"], pid, app["id"], list(declared))


async def _rewrite(
    conn: Conn, row: Record, changes: dict[str, Any], now: datetime, *, restart: bool = False
) -> Record:
    """Write a user's change under the row lock: the version goes up and a buffered tick is let
    go. With a new cron or time zone, or ``restart``, ticks count from ``now``."""
    new = {k: row[k] for k in (*_FIELDS, "status", "consecutive_failures")}
    new.update({k: v.value if isinstance(v, enum.Enum) else v for k, v in changes.items()})
    cursor: datetime = row["last_tick_at"] or row["created_at"]
    last_tick = row["last_tick_at"]
    if restart or new["cron"] != row["cron"] or new["timezone"] != row["timezone"]:
        cursor = last_tick = max(cursor, now)
    if row["buffered_tick_at"] is not None:
        await conn.execute(
            Q["settle_buffered_tick"],
            row["id"],
            row["buffered_tick_at"],
            "skipped",
            SUPERSEDED,
            None,
        )
    updated = await conn.fetchrow(
        Q["update_schedule"],
        row["project_id"],
        row["id"],
        new["cron"],
        new["timezone"],
        new["input"],
        new["overlap"],
        new["misfire"],
        new["disable_after"],
        new["status"],
        new["consecutive_failures"],
        rules.next_fire_after(new["cron"], new["timezone"], cursor),
        last_tick,
        now,
        new["sla_ms"],
    )
    assert updated is not None
    return updated


async def _record(
    conn: Conn,
    sid: str,
    tick: datetime,
    version: int,
    outcome: str,
    reason: str | None,
    run_id: uuid.UUID | None = None,
) -> bool:
    """Record a tick's outcome; False when it was already recorded (another loop planned it)."""
    inserted = await conn.fetchval(Q["record_tick"], sid, tick, version, outcome, reason, run_id)
    return inserted is not None


def _new_run(sched: Record, run_id: uuid.UUID, at: datetime, trigger: str) -> runs.NewRun:
    return runs.NewRun(
        id=run_id,
        project_id=sched["project_id"],
        workflow=sched["workflow"],
        input=sched["input"],
        schedule_id=sched["id"],
        scheduled_at=at,
        trigger=trigger,
    )
