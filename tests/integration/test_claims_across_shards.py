"""The claims and sweeps that Citus runs through variants (``store/citus.sql``, candidates read
without locks and each acted on on its run's shard) do on rows what they do on plain
PostgreSQL: each test runs on both (on a cluster with ``STEPLINE_TEST_CITUS``)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest

from stepline_server.engine import gathering, rates
from stepline_server.loops import sweeper
from stepline_server.store import (
    apps,
    claims,
    db,
    deployments,
    gatherings,
    keys,
    orchestrators,
    pause,
    pull,
    repair,
    runs,
    waits,
)
from tests.support import until

P = keys.DEFAULT_PROJECT
DAY = 86_400.0


async def _app(
    conn: db.Conn, workflows: list[tuple[str, dict[str, Any]]], kind: str = "push"
) -> uuid.UUID:
    await keys.bootstrap(conn)
    url = None if kind == "pull" else "http://127.0.0.1:9/"
    app = await apps.create(conn, P, f"app-{kind}", url, "s", kind=kind)
    assert app is not None
    await apps.record_sync(conn, app, workflows, None)
    return app["id"]  # type: ignore[no-any-return]


async def _start(conn: db.Conn, workflow: str, value: Any = None, **kw: Any) -> uuid.UUID:
    new = runs.NewRun(uuid.uuid4(), P, workflow, value, **kw)
    assert await runs.insert(conn, new, notify=False) is not None
    return new.id


async def _runs(conn: db.Conn, workflow: str) -> dict[uuid.UUID, Any]:
    rows = await conn.fetch(
        "SELECT id, ready_at, lease_token, held, paused, started_at, deployment, parent_run_id"
        " FROM runs WHERE workflow = $1",
        workflow,
    )
    return {r["id"]: r for r in rows}


async def test_retention_deletes_old_runs_events_ticks_and_history(database_url: str) -> None:
    """Runs ended past the retention go (their children keep no parent), newer ones stay;
    old events and ticks go; a long-lived run's old history goes but its last event."""
    conn = await db.connect(database_url)
    try:
        await _app(conn, [("wf", {})])
        old, young, child, long_lived = [await _start(conn, "wf") for _ in range(4)]
        await conn.execute(
            "UPDATE runs SET status = 'completed', ended_at = now() - interval '40 days',"
            " ready_at = NULL WHERE id = $1",
            old,
        )
        await conn.execute(
            "UPDATE runs SET status = 'completed', ended_at = now(), ready_at = NULL WHERE id = $1",
            young,
        )
        await conn.execute("UPDATE runs SET parent_run_id = $1 WHERE id = $2", old, child)
        await conn.execute(
            "UPDATE runs SET created_at = now() - interval '40 days' WHERE id = $1", long_lived
        )
        await conn.execute(
            "UPDATE run_events SET at = now() - interval '40 days' WHERE run_id = $1", long_lived
        )
        await conn.execute(
            "INSERT INTO run_events (run_id, seq, project_id, at, type)"
            " SELECT $1, seq, $2, now() - interval '40 days', 'invocation.started'"
            " FROM generate_series(2, 3) seq",
            long_lived,
            P,
        )
        await conn.execute(
            "INSERT INTO schedules (id, project_id, workflow, cron) VALUES ('wfs_a', $1, 'wf',"
            " '* * * * *')",
            P,
        )
        await conn.execute(
            "INSERT INTO schedule_ticks (schedule_id, tick_at, version, outcome, created_at)"
            " SELECT 'wfs_a', now() - d * interval '1 day', 1, 'fired', now() - d * interval"
            " '1 day' FROM generate_series(0, 39) d"
        )
        await conn.execute(
            "INSERT INTO events (id, project_id, name, data, received_at)"
            " SELECT gen_random_uuid(), $1, 'e', 'null', now() - d * interval '1 day'"
            " FROM generate_series(0, 9) d",
            P,
        )
        assert await waits.delete_old_runs(conn, 30 * DAY) == 1
        assert await waits.delete_old_runs(conn, 30 * DAY) == 0
        assert set(await _runs(conn, "wf")) == {young, child, long_lived}
        assert (await _runs(conn, "wf"))[child]["parent_run_id"] is None
        assert await waits.delete_old_events(conn, 5 * DAY, 3) == 3
        assert await waits.delete_old_events(conn, 5 * DAY) == 2  # days 5..9, in two batches
        assert await conn.fetchval("SELECT count(*) FROM events") == 5
        assert await waits.delete_old_ticks(conn, 30 * DAY) == 10
        assert await conn.fetchval("SELECT count(*) FROM schedule_ticks") == 30
        assert await waits.delete_old_history(conn, 30 * DAY) == 2
        assert await waits.delete_old_history(conn, 30 * DAY) == 0
        assert await conn.fetchval(
            "SELECT count(*) FROM run_events WHERE run_id = $1", long_lived
        ) == 1  # fmt: skip
        # The sweeper's pooled connections choose the same statements.
        await conn.execute(
            "UPDATE runs SET status = 'completed', ended_at = now() - interval '40 days',"
            " ready_at = NULL WHERE id = $1",
            young,
        )
        pool = await db.create_pool(database_url, min_size=1, max_size=1)
        try:
            swept = await sweeper.sweep_once(pool, retention_days=30)
        finally:
            await pool.close()
        assert swept.runs == 1 and set(await _runs(conn, "wf")) == {child, long_lived}
    finally:
        await conn.close()


async def test_repair_wakes_only_the_runs_with_no_way_forward(database_url: str) -> None:
    """A run with no lease, no due time and no open wait is made due, with run.repaired in its
    history; a paused run, a held one and an ended one are not."""
    conn = await db.connect(database_url)
    try:
        await _app(conn, [("wf", {})])
        stuck, paused, held, ended = [await _start(conn, "wf") for _ in range(4)]
        await conn.execute("UPDATE runs SET ready_at = NULL WHERE workflow = 'wf'")
        await conn.execute("UPDATE runs SET paused = true WHERE id = $1", paused)
        await conn.execute("UPDATE runs SET held = true WHERE id = $1", held)
        await conn.execute(
            "UPDATE runs SET status = 'completed', ended_at = now() WHERE id = $1", ended
        )
        repaired = await repair.repair_stuck(conn)
        assert [(r["id"], r["workflow"]) for r in repaired] == [(stuck, "wf")]
        assert (await _runs(conn, "wf"))[stuck]["ready_at"] is not None
        assert await conn.fetchval(
            "SELECT count(*) FROM run_events WHERE run_id = $1 AND type = 'run.repaired'", stuck
        ) == 1  # fmt: skip
        assert await repair.repair_stuck(conn) == []
    finally:
        await conn.close()


async def test_pausing_and_resuming_a_workflow_and_an_app(database_url: str) -> None:
    """Pausing twice keeps the first time; resuming makes the runs set aside due again and
    counts them."""
    conn = await db.connect(database_url)
    try:
        app_id = await _app(conn, [("wf", {})])
        first = await pause.pause_workflow(conn, P, "wf")
        again = await pause.pause_workflow(conn, P, "wf")
        assert first is not None and again is not None
        assert first["paused_at"] is not None and again["paused_at"] == first["paused_at"]
        assert again["app_slug"] is not None
        aside = [await _start(conn, "wf") for _ in range(2)]
        await conn.execute(
            "UPDATE runs SET paused = true, ready_at = NULL WHERE id = ANY($1)", aside
        )
        resumed = await pause.resume_workflow(conn, P, "wf")
        assert resumed is not None and (resumed["resumed"], resumed["paused_at"]) == (2, None)
        assert all(r["ready_at"] and not r["paused"] for r in (await _runs(conn, "wf")).values())

        app = await pause.pause_app(conn, P, app_id)
        assert app is not None and app["paused_at"] is not None
        assert (await pause.pause_app(conn, P, app_id))["paused_at"] == app["paused_at"]
        await conn.execute("UPDATE runs SET paused = true, ready_at = NULL WHERE id = $1", aside[0])
        resumed = await pause.resume_app(conn, P, app_id)
        assert resumed is not None and (resumed["resumed"], resumed["paused_at"]) == (1, None)
        assert not (await _runs(conn, "wf"))[aside[0]]["paused"]
    finally:
        await conn.close()


async def test_deleting_a_deployment_moves_its_runs_not_ended(database_url: str) -> None:
    """The runs not ended on a deployment deleted with move go to the current one; an ended
    one keeps none."""
    conn = await db.connect(database_url)
    try:
        app_id = await _app(conn, [("wf", {})])
        first = await deployments.create(conn, app_id, "http://127.0.0.1:9/v1", "d-1")
        moving = [await _start(conn, "wf") for _ in range(2)]
        ended = await _start(conn, "wf")
        await conn.execute("UPDATE runs SET deployment = $1 WHERE workflow = 'wf'", first)
        await conn.execute(
            "UPDATE runs SET status = 'completed', ended_at = now(), ready_at = NULL WHERE id = $1",
            ended,
        )
        second = await deployments.create(conn, app_id, "http://127.0.0.1:9/v2", "d-2")
        old = await conn.fetchrow("SELECT * FROM deployments WHERE id = $1", first)
        assert await deployments.delete(conn, app_id, old, move=True) == 2
        rows = await _runs(conn, "wf")
        assert {rows[r]["deployment"] for r in moving} == {second}
        assert rows[ended]["deployment"] is None
    finally:
        await conn.close()


async def test_a_start_finds_the_open_gathering_of_its_key(database_url: str) -> None:
    """A debounced workflow's start finds the gathering its key opened; its run no longer
    gathering (made due meanwhile), the start opens another with a run of its own."""
    conn = await db.connect(database_url)
    try:
        await _app(conn, [("wf", {})])
        spec = gathering.Spec("debounce", 60_000, None, None, None)
        async with conn.transaction():
            one = await gatherings.gather(conn, spec, runs.NewRun(uuid.uuid4(), P, "wf", 1))
        assert one is not None and one.created is not None
        await conn.execute("UPDATE runs SET ready_at = now() WHERE id = $1", one.run_id)
        async with conn.transaction():
            two = await gatherings.gather(conn, spec, runs.NewRun(uuid.uuid4(), P, "wf", 2))
        assert two is not None and two.created is not None and two.run_id != one.run_id
        assert [r["run_id"] for r in await conn.fetch("SELECT run_id FROM run_gatherings")] == [
            two.run_id
        ]
    finally:
        await conn.close()


async def test_a_pull_apps_polls_lease_and_find_lost_leases(database_url: str) -> None:
    """A poll leases the due runs once; the lease answers by its token; a lease that lapsed
    while its orchestrator beat is its worker's loss; the next due time counts the leases."""
    conn = await db.connect(database_url)
    try:
        app_id = await _app(conn, [("wf", {})], kind="pull")
        mine = {await _start(conn, "wf") for _ in range(3)}
        assert await pull.next_due_in(conn, app_id, 60) is not None
        polled = await pull.claim(conn, app_id, "here", 60, 2)
        assert len(polled) == 2 and {r["id"] for r in polled} < mine
        assert all(r["lease_token"] and r["app_url"] is None for r in polled)
        (last,) = await pull.claim(conn, app_id, "here", 60, 5)
        assert await pull.claim(conn, app_id, "here", 60, 5) == []
        lease = await pull.leased(conn, last["id"], last["lease_token"])
        assert lease is not None and lease["invocation_id"] == last["invocation_id"]
        assert await pull.leased(conn, last["id"], "another") is None
        due_in = await pull.next_due_in(conn, app_id, 60)
        assert due_in is not None and 55 < due_in <= 60
        lapsed = polled[0]
        await conn.execute(
            "UPDATE runs SET ready_at = now() - interval '1 second' WHERE id = $1", lapsed["id"]
        )
        assert await pull.lost(conn, app_id, 60) == []  # "here" never beat
        await orchestrators.seen(conn, "here", 62)
        (lost,) = await pull.lost(conn, app_id, 60)
        assert (lost["id"], lost["lease_token"]) == (lapsed["id"], lapsed["lease_token"])
        assert await pull.claim(conn, app_id, "there", 60, 5) == []  # not before it is recorded
        await conn.execute(
            "UPDATE orchestrators SET seen_at = now() - interval '61 seconds' WHERE owner = 'here'"
        )
        (taken,) = await pull.claim(conn, app_id, "there", 60, 5)
        assert taken["id"] == lapsed["id"] and taken["taken_over"]
    finally:
        await conn.close()


async def test_two_polls_at_once_never_take_the_same_run(database_url: str) -> None:
    """While one poll's lease of a run is not yet committed, a second poll passes that run
    over (on Citus: read as due, then found locked on its shard) and takes the others."""
    first, second = await db.connect(database_url), await db.connect(database_url)
    try:
        app_id = await _app(first, [("wf", {})], kind="pull")
        mine = {await _start(first, "wf") for _ in range(3)}
        async with first.transaction():
            (held,) = await pull.claim(first, app_id, "one", 60, 1)
            others = await pull.claim(second, app_id, "two", 60, 10)
            assert len(others) == 2 and held["id"] not in {r["id"] for r in others}
        assert {held["id"], *(r["id"] for r in others)} == mine
        assert await pull.claim(second, app_id, "two", 60, 10) == []
    finally:
        await first.close()
        await second.close()


async def test_a_cap_leases_its_room_holds_the_rest_and_releases_them(database_url: str) -> None:
    """Cap 2, five due runs: the two oldest of the highest priority are leased, the others
    held; a lease ended makes room for one held run, released due now."""
    conn = await db.connect(database_url)
    try:
        await _app(conn, [("capped", {"concurrency": 2})])
        started = [await _start(conn, "capped", priority=p) for p in (0, 0, 1, 0, 0)]
        capped = claims.Capped(P, "capped", None, 2)
        lease = claims.Lease("here", 60)
        leased = await claims.claim_capped(conn, capped, lease, 10)
        assert [r["id"] for r in leased] == [started[2], started[0]]
        rows = await _runs(conn, "capped")
        assert {r for r in rows if rows[r]["held"]} == {started[1], started[3], started[4]}
        assert await claims.claim_capped(conn, capped, lease, 10) == []
        assert await claims.release_held(conn, capped) == 0  # no room
        await conn.execute(
            "UPDATE runs SET lease_token = NULL, ready_at = NULL WHERE id = $1", started[2]
        )
        assert await claims.release_held(conn) == 1
        rows = await _runs(conn, "capped")
        assert not rows[started[1]]["held"] and rows[started[1]]["ready_at"] is not None
        (next_,) = await claims.claim_capped(conn, capped, lease, 10)
        assert next_["id"] == started[1]
    finally:
        await conn.close()


async def test_a_rate_limit_leases_its_window_and_defers_the_rest(database_url: str) -> None:
    """Two an hour, four due runs: the two oldest are leased and started, the two others come
    due when the window lets them start."""
    conn = await db.connect(database_url)
    try:
        options = {"rateLimit": {"limit": 2, "periodMs": 3_600_000}}
        await _app(conn, [("limited", options)])
        started = [await _start(conn, "limited") for _ in range(4)]
        limit = claims.RateLimited(P, "limited", None, rates.RateLimit(2, timedelta(hours=1)))
        leased = await claims.claim_rate_limited(conn, limit, claims.Lease("here", 60), 10)
        assert [r["id"] for r in leased] == started[:2]
        rows = await _runs(conn, "limited")
        later = [rows[r] for r in started[2:]]
        assert all(r["started_at"] is None and r["lease_token"] is None for r in later)
        first_start = rows[started[0]]["started_at"]
        assert all(r["ready_at"] >= first_start + timedelta(minutes=59) for r in later)
        assert await claims.claim_rate_limited(conn, limit, claims.Lease("here", 60), 10) == []
    finally:
        await conn.close()


async def test_a_rate_limited_claim_that_waited_for_its_lock_counts_the_whole_window(
    database_url: str,
) -> None:
    """Two an hour: a claim waits for the limit's lock while the lock's holder records two
    starts just inside the hour before the claim's transaction began; the claim counts them,
    as of its transaction's time (the time its leases would start runs at), and starts
    nothing. On Citus the window's rows are read on the workers, whose transactions there
    began only once the lock was taken: counted to their now(), the two starts had left the
    window."""
    holder, claimer = await db.connect(database_url), await db.connect(database_url)
    try:
        options = {"rateLimit": {"limit": 2, "periodMs": 3_600_000}}
        await _app(claimer, [("limited", options)])
        started = [await _start(claimer, "limited") for _ in range(3)]
        hour = timedelta(hours=1)
        limit = claims.RateLimited(P, "limited", None, rates.RateLimit(2, hour))
        async with holder.transaction():
            await holder.execute(db.Q["lock_rate"], P, "limited", None)
            lease = claims.Lease("here", 60)
            claim = asyncio.create_task(claims.claim_rate_limited(claimer, limit, lease, 10))
            pid = claimer.get_server_pid()
            began = await until(
                lambda: _waiting_for_a_lock(holder, pid), "the claim waiting for the lock"
            )
            await holder.execute(
                "UPDATE runs SET started_at = $1 WHERE id = ANY ($2::uuid[])",
                began - hour + timedelta(milliseconds=500),
                started[:2],
            )
            await asyncio.sleep(1.0)  # the claim waits past those starts' hour
        assert await claim == []
        rows = await _runs(claimer, "limited")
        assert rows[started[2]]["started_at"] is None
        assert rows[started[2]]["ready_at"] >= began + timedelta(milliseconds=500)
    finally:
        await holder.close()
        await claimer.close()


async def _waiting_for_a_lock(conn: db.Conn, pid: int) -> datetime | None:
    """When the transaction of backend ``pid`` began, once it waits for a lock."""
    return await conn.fetchval(  # type: ignore[no-any-return]
        "SELECT xact_start FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'",
        pid,
    )


async def test_a_beat_keeps_the_leases_still_held(database_url: str) -> None:
    """Three runs leased for 60 s, one lease gone stale: a beat of 600 s moves the two held
    leases' ends past the first, answers them (no cancel asked), leaves the stale one."""
    conn = await db.connect(database_url)
    try:
        await _app(conn, [("beat", {})])
        for _ in range(3):
            await _start(conn, "beat")
        leased = await claims.claim(conn, "here", 60, 10)
        before = await _runs(conn, "beat")
        stale = leased[0]["id"]
        leases = [(r["id"], r["lease_token"]) for r in leased[1:]] + [(stale, "not-the-token")]
        held = await claims.heartbeat(conn, leases, 600)
        after = await _runs(conn, "beat")
        assert held == {r["id"]: False for r in leased[1:]}
        for r in leased[1:]:
            assert after[r["id"]]["ready_at"] > before[r["id"]]["ready_at"] + timedelta(minutes=5)
        assert after[stale]["ready_at"] == before[stale]["ready_at"]
    finally:
        await conn.close()


async def test_a_beat_keeps_the_other_leases_while_one_run_is_locked(database_url: str) -> None:
    """On Citus: one leased run's row held by a transaction still open, a beat of three keeps
    the other two at once, each committed (seen from another connection while the beat waits),
    then the held one when the transaction ends. (On plain PostgreSQL a beat is one
    statement.)"""
    first, second, watcher = [await db.connect(database_url) for _ in range(3)]
    try:
        if not db.on_citus(first):
            pytest.skip("a beat on plain PostgreSQL is one statement")
        await _app(first, [("beat", {})])
        for _ in range(3):
            await _start(first, "beat")
        leased = await claims.claim(first, "here", 60, 10)
        before = await _runs(first, "beat")
        locked = leased[1]["id"]
        leases = [(r["id"], r["lease_token"]) for r in leased]
        async with first.transaction():
            await first.execute("SELECT 1 FROM runs WHERE id = $1 FOR UPDATE", locked)
            beat = asyncio.ensure_future(claims.heartbeat(second, leases, 600))

            async def others_kept() -> bool:
                rows = await _runs(watcher, "beat")
                return all(
                    rows[r["id"]]["ready_at"] > before[r["id"]]["ready_at"]
                    for r in leased
                    if r["id"] != locked
                )

            await until(others_kept, "the leases not locked kept")
            assert not beat.done()
            assert (await _runs(watcher, "beat"))[locked]["ready_at"] == before[locked]["ready_at"]
        assert await beat == {r["id"]: False for r in leased}
        assert (await _runs(watcher, "beat"))[locked]["ready_at"] > before[locked]["ready_at"]
    finally:
        for conn in (first, second, watcher):
            await conn.close()
