"""Schedules against real PostgreSQL with a controllable clock: exactly-once ticks under racing
schedulers, DST, overlap and misfire policies, auto-disable, pause/resume, versions, start lag."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from pydantic import ValidationError

from stepline.protocol import DescribeResponse, ScheduleSpec, WorkflowInfo
from stepline_server.application import serialize
from stepline_server.engine import schedules as rules
from stepline_server.engine.runs import RunStatus
from stepline_server.loops.scheduler import Scheduler
from stepline_server.orchestrator import Orchestrator
from stepline_server.store import apps, claims, db, keys, outcomes, runs, schedules
from tests import support

P = keys.DEFAULT_PROJECT
T0 = datetime(2026, 1, 1, tzinfo=UTC)
NY = ZoneInfo("America/New_York")
MIN = timedelta(minutes=1)
HOUR = timedelta(hours=1)


@pytest.fixture
async def orch(database_url: str) -> AsyncIterator[Orchestrator]:
    """A started orchestrator without its loops, with the workflow ``wf`` registered."""
    o = Orchestrator(support.test_settings(), database_url, run_loops=False)
    await o.start()
    async with o.pool.acquire() as conn:
        app = await apps.create(conn, P, "app", "http://127.0.0.1:9/", "whsec_test")
        assert app is not None
        await apps.record_sync(conn, app, [("wf", {"retries": {"attempts": 1}})], None)
    try:
        yield o
    finally:
        await o.stop()


@pytest.fixture
async def conn(orch: Orchestrator) -> AsyncIterator[db.Conn]:
    """A connection of the orchestrator's pool."""
    async with orch.pool.acquire() as c:
        yield c


@pytest.fixture
def sched(orch: Orchestrator) -> Scheduler:
    """A scheduler on the orchestrator's pool (grace 60 s), driven by the test's clock."""
    return Scheduler(orch.pool, orch.settings)


async def make(conn: db.Conn, cron: str, now: datetime = T0, **kw: Any) -> str:
    """Create a schedule of ``wf`` at ``now``; return its id."""
    tz = kw.pop("timezone", "UTC")
    d = schedules.ScheduleDef(workflow="wf", cron=rules.parse_cron(cron), timezone=tz, **kw)
    row = await schedules.create(conn, P, d, now)
    assert row is not None
    return str(row["id"])


async def runs_of(conn: db.Conn, sid: str) -> list[db.Record]:
    """The schedule's runs, oldest tick first."""
    return list(
        await conn.fetch(
            "SELECT * FROM runs WHERE schedule_id = $1 ORDER BY scheduled_at, created_at", sid
        )
    )


async def fired_at(conn: db.Conn, sid: str) -> list[datetime]:
    """The scheduled times of the schedule's runs."""
    return [r["scheduled_at"] for r in await runs_of(conn, sid)]


async def tick_outcomes(conn: db.Conn, sid: str) -> dict[datetime, tuple[str, str | None]]:
    """Each recorded tick's (outcome, reason)."""
    return {t["tick_at"]: (t["outcome"], t["reason"]) for t in await schedules.ticks(conn, sid)}


async def end(conn: db.Conn, run_id: Any, status: RunStatus) -> None:
    """End a run as the dispatcher would, in a transaction."""
    error = None if status is RunStatus.COMPLETED else {"message": status.value}
    async with conn.transaction():
        assert await outcomes.end_run(conn, run_id, None, status, None, error)


async def get(conn: db.Conn, sid: str) -> db.Record:
    row = await schedules.get(conn, P, sid)
    assert row is not None
    return row


# --- exactly once ------------------------------------------------------------------------------


async def test_racing_schedulers_start_one_run_per_tick(orch: Orchestrator, conn: db.Conn) -> None:
    """Two schedulers ticking at the same instants create exactly one run per tick."""
    ids = [await make(conn, "* * * * *", misfire=rules.MisfirePolicy.FIRE_ALL) for _ in range(3)]
    a, b = Scheduler(orch.pool, orch.settings), Scheduler(orch.pool, orch.settings)
    started = 0
    for minutes in (1, 2, 5, 5, 9):  # ticks late, repeated and in bursts of missed ones
        now = T0 + minutes * MIN + timedelta(seconds=1)
        started += sum(await asyncio.gather(a.tick(now), b.tick(now), a.tick(now)))
    assert started == 27
    for sid in ids:
        expected = [T0 + m * MIN for m in range(1, 10)]
        assert await fired_at(conn, sid) == expected
        assert [r["id"] for r in await runs_of(conn, sid)] == [
            rules.tick_run_id(sid, t) for t in expected
        ]


async def test_a_recorded_tick_never_fires_again(sched: Scheduler, conn: db.Conn) -> None:
    """Rewinding a schedule's cursor (a lost update, a restart) does not fire its ticks twice."""
    sid = await make(conn, "* * * * *")
    now = T0 + 3 * MIN
    await sched.tick(T0 + MIN)
    await sched.tick(T0 + 2 * MIN)
    await conn.execute(
        "UPDATE schedules SET last_tick_at = NULL, next_fire_at = $2 WHERE id = $1", sid, T0
    )
    assert await sched.tick(T0 + 2 * MIN) == 0
    assert await sched.tick(now) == 1
    assert await fired_at(conn, sid) == [T0 + MIN, T0 + 2 * MIN, now]


async def test_a_broken_schedule_does_not_stop_the_others(sched: Scheduler, conn: db.Conn) -> None:
    """A schedule whose ticks cannot be fired is passed over; the other schedules still fire."""
    broken = await make(conn, "* * * * *")
    fine = await make(conn, "* * * * *")
    await conn.execute("UPDATE schedules SET cron = 'not a cron' WHERE id = $1", broken)
    assert await sched.tick(T0 + MIN) == 1
    assert await fired_at(conn, fine) == [T0 + MIN]
    assert await fired_at(conn, broken) == []
    assert (await get(conn, broken))["next_fire_at"] == T0 + MIN  # retried on the next pass


# --- time zones --------------------------------------------------------------------------------


async def drive(sched: Scheduler, start: datetime, stop: datetime, step: timedelta) -> None:
    """Tick the scheduler every ``step`` from ``start`` to ``stop``."""
    now = start
    while now <= stop:
        await sched.tick(now)
        now += step


async def test_spring_forward_fires_once(sched: Scheduler, conn: db.Conn) -> None:
    """A daily 02:30 New York schedule fires once on 2026-03-08, when 02:30 does not exist: at
    03:00 EDT."""
    start = datetime(2026, 3, 6, 12, tzinfo=NY)
    sid = await make(conn, "30 2 * * *", start, timezone="America/New_York")
    await drive(sched, start, datetime(2026, 3, 10, 12, tzinfo=NY), timedelta(minutes=10))
    local = [t.astimezone(NY) for t in await fired_at(conn, sid)]
    assert [t.strftime("%m-%d %H:%M%z") for t in local] == [
        "03-07 02:30-0500",
        "03-08 03:00-0400",
        "03-09 02:30-0400",
        "03-10 02:30-0400",
    ]


@pytest.mark.parametrize(
    ("cron", "on_the_day"),
    [("30 2 * * *", "11-01 02:30-0500"), ("30 1 * * *", "11-01 01:30-0400")],
    ids=["0230", "0130-repeated"],
)
async def test_fall_back_fires_once(
    sched: Scheduler, conn: db.Conn, cron: str, on_the_day: str
) -> None:
    """On 2026-11-01 New York repeats 01:00-02:00: 02:30 fires once, and 01:30 fires once, at its
    first occurrence."""
    start = datetime(2026, 10, 30, 12, tzinfo=NY)
    sid = await make(conn, cron, start, timezone="America/New_York")
    await drive(sched, start, datetime(2026, 11, 3, 12, tzinfo=NY), timedelta(minutes=10))
    local = [t.astimezone(NY).strftime("%m-%d %H:%M%z") for t in await fired_at(conn, sid)]
    assert [t[:5] for t in local] == ["10-31", "11-01", "11-02", "11-03"]
    assert local[1] == on_the_day


# --- overlap -----------------------------------------------------------------------------------


async def test_overlap_allow_starts_while_a_run_is_active(sched: Scheduler, conn: db.Conn) -> None:
    """``allow`` starts every tick's run even while the previous one is still running."""
    sid = await make(conn, "* * * * *", overlap=rules.OverlapPolicy.ALLOW)
    await sched.tick(T0 + MIN)
    await sched.tick(T0 + 2 * MIN)
    assert [r["status"] for r in await runs_of(conn, sid)] == ["running", "running"]


async def test_overlap_skip_records_a_skipped_tick(sched: Scheduler, conn: db.Conn) -> None:
    """``skip`` records the tick skipped while a run is active, and fires again once it ended."""
    sid = await make(conn, "* * * * *", overlap=rules.OverlapPolicy.SKIP)
    await sched.tick(T0 + MIN)
    await sched.tick(T0 + 2 * MIN)
    (first,) = await runs_of(conn, sid)
    assert (await tick_outcomes(conn, sid))[T0 + 2 * MIN] == ("skipped", "overlap")
    await end(conn, first["id"], RunStatus.COMPLETED)
    await sched.tick(T0 + 3 * MIN)
    assert await fired_at(conn, sid) == [T0 + MIN, T0 + 3 * MIN]


async def test_overlap_buffer_one_starts_the_waiting_tick_when_the_run_ends(
    sched: Scheduler, conn: db.Conn
) -> None:
    """``buffer_one`` holds one tick while a run is active, drops further ones, and starts the
    held tick (with its own scheduled time) once the active run ends: the end makes the
    schedule due at the held tick, and the scheduler's next pass starts its run."""
    sid = await make(conn, "* * * * *", overlap=rules.OverlapPolicy.BUFFER_ONE)
    for m in (1, 2, 3):
        await sched.tick(T0 + m * MIN)
    (first,) = await runs_of(conn, sid)
    ticks = await tick_outcomes(conn, sid)
    assert ticks[T0 + 2 * MIN] == ("buffered", "overlap")
    assert ticks[T0 + 3 * MIN] == ("skipped", "buffer_full")
    assert (await get(conn, sid))["buffered_tick_at"] == T0 + 2 * MIN

    await end(conn, first["id"], RunStatus.FAILED)
    assert await fired_at(conn, sid) == [T0 + MIN]  # the run's end makes the schedule due
    assert (await get(conn, sid))["next_fire_at"] == T0 + 2 * MIN
    assert await sched.tick(T0 + 3 * MIN) == 1  # and the scheduler starts it (and counts it)
    assert await fired_at(conn, sid) == [T0 + MIN, T0 + 2 * MIN]
    second = (await runs_of(conn, sid))[1]
    assert second["id"] == rules.tick_run_id(sid, T0 + 2 * MIN)
    assert second["trigger"] == "schedule"
    assert (await tick_outcomes(conn, sid))[T0 + 2 * MIN][0] == "fired"
    row = await get(conn, sid)
    assert row["buffered_tick_at"] is None
    assert row["last_fire_at"] == T0 + 2 * MIN


# --- misfire -----------------------------------------------------------------------------------

DOWN_UNTIL = T0 + 5 * HOUR + timedelta(seconds=30)  # 01:00-04:00 missed, 05:00 on time


@pytest.mark.parametrize(
    ("policy", "fired"),
    [
        (rules.MisfirePolicy.FIRE_ONCE, [4, 5]),
        (rules.MisfirePolicy.SKIP, [5]),
        (rules.MisfirePolicy.FIRE_ALL, [1, 2, 3, 4, 5]),
    ],
)
async def test_misfire_policies(
    sched: Scheduler, conn: db.Conn, policy: rules.MisfirePolicy, fired: list[int]
) -> None:
    """Ticks missed past the grace period follow the misfire policy; on-time ticks fire."""
    sid = await make(conn, "@hourly", misfire=policy)
    await sched.tick(DOWN_UNTIL)
    assert await fired_at(conn, sid) == [T0 + h * HOUR for h in fired]
    ticks = await tick_outcomes(conn, sid)
    assert ticks[T0 + 5 * HOUR] == ("fired", None)
    for h in range(1, 5):
        expected = ("fired", "misfire") if h in fired else ("skipped", "misfire")
        assert ticks[T0 + h * HOUR] == expected
    assert (await get(conn, sid))["next_fire_at"] == T0 + 6 * HOUR


async def test_fire_all_is_capped(orch: Orchestrator, conn: db.Conn) -> None:
    """``fire_all`` starts at most ``cap`` missed ticks (the oldest) and skips the rest."""
    sid = await make(conn, "@hourly", misfire=rules.MisfirePolicy.FIRE_ALL)
    await Scheduler(orch.pool, orch.settings, cap=2).tick(DOWN_UNTIL)
    assert await fired_at(conn, sid) == [T0 + HOUR, T0 + 2 * HOUR, T0 + 5 * HOUR]
    assert (await tick_outcomes(conn, sid))[T0 + 3 * HOUR] == ("skipped", "misfire")


# --- failures, pause, versions -----------------------------------------------------------------


async def test_auto_disable_after_consecutive_failures_and_reset_by_resume(
    sched: Scheduler, conn: db.Conn
) -> None:
    """Failed and timed-out runs count, completed resets, cancelled leaves the count; at the
    threshold the schedule is disabled, and resume re-enables it with the count reset."""
    sid = await make(conn, "* * * * *", disable_after=3)
    endings = [
        RunStatus.FAILED,
        RunStatus.COMPLETED,  # resets
        RunStatus.FAILED,
        RunStatus.CANCELLED,  # neither counts nor resets
        RunStatus.TIMED_OUT,
    ]
    for m, status in enumerate(endings, start=1):
        await sched.tick(T0 + m * MIN)
        await end(conn, rules.tick_run_id(sid, T0 + m * MIN), status)
    row = await get(conn, sid)
    assert (row["status"], row["consecutive_failures"]) == ("active", 2)

    await sched.tick(T0 + 6 * MIN)
    await end(conn, rules.tick_run_id(sid, T0 + 6 * MIN), RunStatus.FAILED)
    row = await get(conn, sid)
    assert (row["status"], row["consecutive_failures"]) == ("disabled", 3)
    assert serialize.schedule(row)["nextFireAt"] is None
    assert await sched.tick(T0 + 10 * MIN) == 0

    resumed = await schedules.resume(conn, P, sid, T0 + 10 * MIN + timedelta(seconds=5))
    assert resumed is not None
    assert (resumed["status"], resumed["consecutive_failures"]) == ("active", 0)
    assert resumed["next_fire_at"] == T0 + 11 * MIN
    assert await sched.tick(T0 + 11 * MIN) == 1
    assert len(await runs_of(conn, sid)) == 7


async def test_disable_after_zero_never_disables(sched: Scheduler, conn: db.Conn) -> None:
    """``disableAfter`` 0 keeps a schedule active however many runs fail."""
    sid = await make(conn, "* * * * *", disable_after=0)
    for m in range(1, 4):
        await sched.tick(T0 + m * MIN)
        await end(conn, rules.tick_run_id(sid, T0 + m * MIN), RunStatus.FAILED)
    assert (await get(conn, sid))["status"] == "active"


async def test_pause_and_resume(sched: Scheduler, conn: db.Conn) -> None:
    """A paused schedule fires nothing; resumed, it fires from the next tick after the resume,
    never the ticks it missed while paused."""
    sid = await make(conn, "* * * * *")
    await sched.tick(T0 + MIN)
    paused = await schedules.pause(conn, P, sid, T0 + MIN + timedelta(seconds=10))
    assert paused is not None and paused["status"] == "paused"
    assert paused["version"] == 2
    assert await sched.tick(T0 + 5 * MIN) == 0
    resumed = await schedules.resume(conn, P, sid, T0 + 5 * MIN + timedelta(seconds=30))
    assert resumed is not None and resumed["version"] == 3
    assert await sched.tick(T0 + 6 * MIN) == 1
    assert await fired_at(conn, sid) == [T0 + MIN, T0 + 6 * MIN]
    assert set(await tick_outcomes(conn, sid)) == {T0 + MIN, T0 + 6 * MIN}


async def test_pausing_a_disabled_schedule_is_refused(conn: db.Conn) -> None:
    """Only an active (or already paused) schedule can be paused."""
    sid = await make(conn, "* * * * *")
    await conn.execute("UPDATE schedules SET status = 'disabled' WHERE id = $1", sid)
    with pytest.raises(schedules.InvalidTransition, match="resume"):
        await schedules.pause(conn, P, sid, T0)


async def test_an_edit_drops_the_tick_buffered_under_the_old_version(
    sched: Scheduler, conn: db.Conn
) -> None:
    """A tick buffered under version 1 is not fired after an edit makes version 2; the next
    tick runs with the new input."""
    sid = await make(conn, "* * * * *", overlap=rules.OverlapPolicy.BUFFER_ONE, input={"v": 1})
    await sched.tick(T0 + MIN)
    await sched.tick(T0 + 2 * MIN)
    edited = await schedules.update(conn, P, sid, {"input": {"v": 2}}, T0 + 2 * MIN)
    assert edited is not None and edited["version"] == 2
    assert (await tick_outcomes(conn, sid))[T0 + 2 * MIN] == ("skipped", "superseded")

    await end(conn, rules.tick_run_id(sid, T0 + MIN), RunStatus.COMPLETED)
    assert await fired_at(conn, sid) == [T0 + MIN]
    await sched.tick(T0 + 3 * MIN)
    assert [r["input"] for r in await runs_of(conn, sid)] == [{"v": 1}, {"v": 2}]


async def test_a_buffered_tick_of_an_older_version_is_not_fired(
    sched: Scheduler, conn: db.Conn
) -> None:
    """Even if still held, a buffered tick recorded under an older version does not start."""
    sid = await make(conn, "* * * * *", overlap=rules.OverlapPolicy.BUFFER_ONE)
    await sched.tick(T0 + MIN)
    await sched.tick(T0 + 2 * MIN)
    await conn.execute("UPDATE schedules SET version = version + 1 WHERE id = $1", sid)
    await end(conn, rules.tick_run_id(sid, T0 + MIN), RunStatus.COMPLETED)
    assert await fired_at(conn, sid) == [T0 + MIN]
    assert (await tick_outcomes(conn, sid))[T0 + 2 * MIN] == ("skipped", "superseded")
    assert (await get(conn, sid))["buffered_tick_at"] is None


async def test_a_new_cron_counts_from_the_edit(sched: Scheduler, conn: db.Conn) -> None:
    """Changing the cron bumps the version, recomputes the next tick from the edit's time and
    fires no tick of the new cron from before the edit."""
    sid = await make(conn, "@hourly")
    edited = await schedules.update(conn, P, sid, {"cron": "*/15 * * * *"}, T0 + 2 * HOUR)
    assert edited is not None
    assert (edited["version"], edited["next_fire_at"]) == (2, T0 + 2 * HOUR + 15 * MIN)
    await sched.tick(T0 + 2 * HOUR + 15 * MIN)
    assert await fired_at(conn, sid) == [T0 + 2 * HOUR + 15 * MIN]


# --- runs --------------------------------------------------------------------------------------


async def test_start_lag_is_recorded(sched: Scheduler, conn: db.Conn) -> None:
    """A tick's run carries its schedule, scheduled time and trigger; once claimed, its start lag
    is started minus scheduled."""
    tick = datetime.now(UTC).replace(second=0, microsecond=0) - MIN
    sid = await make(conn, "* * * * *", tick - timedelta(seconds=30), input={"x": 1})
    assert await sched.tick(tick + timedelta(seconds=1)) == 1
    await claims.claim(conn, "test", 30.0, 10)
    row = await runs.get(conn, P, rules.tick_run_id(sid, tick))
    assert row is not None
    data = serialize.run(row)
    assert (data["scheduleId"], data["scheduledAt"], data["trigger"], data["input"]) == (
        sid,
        serialize.ts(tick),
        "schedule",
        {"x": 1},
    )
    lag = row["started_at"] - tick
    assert data["startLagMs"] == lag // timedelta(milliseconds=1)
    assert data["startLagMs"] >= 60_000


async def test_trigger_starts_a_manual_run(conn: db.Conn) -> None:
    """Trigger starts a run with a fresh id, trigger ``manual`` and scheduledAt now."""
    sid = await make(conn, "@daily", input={"y": 2})
    now = datetime.now(UTC)
    run = await schedules.trigger(conn, P, sid, now)
    assert run is not None
    assert (run["trigger"], run["schedule_id"], run["scheduled_at"], run["input"]) == (
        "manual",
        sid,
        now,
        {"y": 2},
    )


async def test_trigger_of_an_unregistered_workflow_starts_nothing(conn: db.Conn) -> None:
    """A manual trigger whose workflow is gone says so and creates no run."""
    sid = await make(conn, "@daily")
    await conn.execute("DELETE FROM workflows WHERE name = 'wf'")
    with pytest.raises(schedules.WorkflowGone):
        await schedules.trigger(conn, P, sid, datetime.now(UTC))
    assert await conn.fetchval("SELECT count(*) FROM runs WHERE schedule_id = $1", sid) == 0


async def test_ticks_of_an_unregistered_workflow_are_skipped(
    sched: Scheduler, conn: db.Conn
) -> None:
    """When the workflow is gone, ticks are recorded skipped rather than failing the loop."""
    sid = await make(conn, "* * * * *")
    await conn.execute("DELETE FROM workflows WHERE name = 'wf'")
    assert await sched.tick(T0 + MIN) == 0
    assert await tick_outcomes(conn, sid) == {T0 + MIN: ("skipped", "workflow_not_found")}


# --- schedules declared in code ----------------------------------------------------------------


def described(**schedules_: ScheduleSpec | None) -> DescribeResponse:
    """A describe answer with one workflow per keyword."""
    return DescribeResponse(
        workflows=[WorkflowInfo(name=n, schedule=s) for n, s in schedules_.items()]
    )


async def code_schedules(conn: db.Conn) -> list[db.Record]:
    return list(await conn.fetch("SELECT * FROM schedules WHERE source = 'code'"))


async def test_sync_registers_updates_and_removes_code_schedules(
    orch: Orchestrator, conn: db.Conn
) -> None:
    """A sync creates a code schedule per declaring workflow, changes it (bumping its version)
    only when the declaration changed, and deletes it once the workflow stops declaring one."""
    app = await apps.get_by_name(conn, P, "app")
    assert app is not None
    await orch.after_sync(conn, app, described(wf=ScheduleSpec(cron="@hourly", input=[1])))
    (row,) = await code_schedules(conn)
    assert (row["workflow"], row["cron"], row["input"], row["version"]) == ("wf", "@hourly", [1], 1)

    await orch.after_sync(conn, app, described(wf=ScheduleSpec(cron="@hourly", input=[1])))
    assert (await code_schedules(conn))[0]["version"] == 1
    spec = ScheduleSpec(cron="0 9 * * 1-5", timezone="Europe/Paris", overlap="skip")
    await orch.after_sync(conn, app, described(wf=spec))
    (row,) = await code_schedules(conn)
    assert (row["id"], row["cron"], row["overlap"], row["version"]) == (
        row["id"],
        "0 9 * * 1-5",
        "skip",
        2,
    )

    await orch.after_sync(conn, app, described(wf=None))
    assert await code_schedules(conn) == []


async def test_sync_rejects_an_invalid_code_schedule(orch: Orchestrator, conn: db.Conn) -> None:
    """A declared schedule whose time zone does not parse is a validation error naming it."""
    app = await apps.get_by_name(conn, P, "app")
    assert app is not None
    bad = ScheduleSpec(cron="@daily", timezone="Mars/Olympus")
    with pytest.raises(ValidationError, match=r"workflows\.wf\.schedule\.timezone"):
        await orch.after_sync(conn, app, described(wf=bad))
    assert await code_schedules(conn) == []
