"""Retention at scale: the sweeper prunes ticks and long-lived runs' history in batches, and
every cascade and sweep statement can go through an index."""

from __future__ import annotations

import uuid

import pytest

from stepline_server.engine.runs import RunStatus
from stepline_server.loops import sweeper
from stepline_server.store import apps, db, keys, outcomes, runs
from stepline_server.store.db import Q

DAY = 86_400.0


async def _run(conn: db.Conn) -> uuid.UUID:
    app = await apps.get_by_name(conn, keys.DEFAULT_PROJECT, "a") or await apps.create(
        conn, keys.DEFAULT_PROJECT, "a", "http://127.0.0.1:9/", "s"
    )
    await apps.record_sync(conn, app, [("wf", {})], None)
    new = runs.NewRun(uuid.uuid4(), keys.DEFAULT_PROJECT, "wf", None)
    return (await runs.insert(conn, new))["id"]  # type: ignore[no-any-return]


async def test_sweep_prunes_old_ticks_and_the_old_history_of_long_lived_runs(
    database_url: str,
) -> None:
    """Schedule ticks and the history of a run still going, older than the retention, are
    deleted (the run and its steps stay); newer ones and other runs' history stay."""
    conn = await db.connect(database_url)
    pool = await db.create_pool(database_url, min_size=1, max_size=2)
    try:
        await keys.bootstrap(conn)
        long_lived, young = await _run(conn), await _run(conn)
        await conn.execute(
            "UPDATE runs SET created_at = now() - interval '40 days' WHERE id = $1", long_lived
        )
        await conn.execute(
            "INSERT INTO steps (run_id, name, project_id, kind, status, position)"
            " VALUES ($1, 'a', $2, 'run', 'completed', 1)",
            long_lived,
            keys.DEFAULT_PROJECT,
        )
        await conn.execute(
            "UPDATE run_events SET at = now() - interval '40 days' WHERE run_id = ANY($1)",
            [long_lived, young],
        )
        await runs.append_events(conn, long_lived, [{"type": "invocation.started"}])
        await conn.execute(
            "INSERT INTO schedules (id, project_id, workflow, cron) VALUES ('wfs_a', $1, 'wf',"
            " '* * * * *')",
            keys.DEFAULT_PROJECT,
        )
        await conn.execute(
            "INSERT INTO schedule_ticks (schedule_id, tick_at, version, outcome, created_at)"
            " SELECT 'wfs_a', now() - d * interval '1 day', 1, 'fired', now() - d * interval"
            " '1 day' FROM generate_series(0, 39) d"
        )
        swept = await sweeper.sweep_once(pool, retention_days=30)
        assert swept.ticks == 10  # days 30..39: day 30's is a moment past the retention
        assert swept.history == 1  # the long-lived run's run.started
        assert swept.runs == 0
        types = await conn.fetch(
            "SELECT type FROM run_events WHERE run_id = $1 ORDER BY seq", long_lived
        )
        assert [r["type"] for r in types] == ["invocation.started"]
        assert await conn.fetchval("SELECT count(*) FROM run_events WHERE run_id = $1", young)
        assert await conn.fetchval("SELECT count(*) FROM steps WHERE run_id = $1", long_lived)
        assert await conn.fetchval("SELECT count(*) FROM schedule_ticks") == 30
    finally:
        await pool.close()
        await conn.close()


async def test_sweep_keeps_each_runs_last_event_so_its_numbering_goes_on(
    database_url: str,
) -> None:
    """A long-lived run whose whole history is past the retention keeps its last event: the
    next event appended is numbered after it, not from 1 again (a follower's ?after= cursor
    stays valid)."""
    conn = await db.connect(database_url)
    pool = await db.create_pool(database_url, min_size=1, max_size=2)
    try:
        await keys.bootstrap(conn)
        run_id = await _run(conn)
        await runs.append_events(
            conn, run_id, [{"type": "invocation.started"}, {"type": "invocation.ended"}]
        )
        await conn.execute(
            "UPDATE runs SET created_at = now() - interval '40 days' WHERE id = $1", run_id
        )
        await conn.execute(
            "UPDATE run_events SET at = now() - interval '40 days' WHERE run_id = $1", run_id
        )
        swept = await sweeper.sweep_once(pool, retention_days=30)
        assert swept.history == 2
        seqs = "SELECT array_agg(seq ORDER BY seq) FROM run_events WHERE run_id = $1"
        assert await conn.fetchval(seqs, run_id) == [3]
        await runs.append_events(conn, run_id, [{"type": "invocation.started"}])
        assert await conn.fetchval(seqs, run_id) == [3, 4]
    finally:
        await pool.close()
        await conn.close()


async def test_sweep_deletes_in_batches_until_nothing_is_left(database_url: str) -> None:
    """More old runs than one batch are all deleted, with their callbacks and log lines, in
    one sweep."""
    conn = await db.connect(database_url)
    pool = await db.create_pool(database_url, min_size=1, max_size=2)
    try:
        await keys.bootstrap(conn)
        await _run(conn)
        await conn.execute(
            "INSERT INTO runs (id, project_id, app_id, workflow, status, created_at, ended_at)"
            " SELECT gen_random_uuid(), project_id, app_id, 'wf', 'completed',"
            " now() - interval '40 days', now() - interval '31 days'"
            " FROM runs, generate_series(1, 1200) LIMIT 1200"
        )
        await conn.execute(
            "INSERT INTO callbacks (id, project_id, run_id, step_name)"
            " SELECT gen_random_uuid(), project_id, id, 'cb' FROM runs WHERE ended_at IS NOT NULL"
        )
        await conn.execute(
            "INSERT INTO run_logs (run_id, seq, project_id, at, level, message)"
            " SELECT id, n, project_id, now(), 'info', 'line' FROM runs,"
            " generate_series(1, 2) n WHERE ended_at IS NOT NULL"
        )
        live = await conn.fetchval("SELECT id FROM runs WHERE ended_at IS NULL")
        await conn.execute(
            "INSERT INTO run_logs (run_id, seq, project_id, at, level, message)"
            " VALUES ($1, 1, $2, now(), 'info', 'kept')",
            live,
            keys.DEFAULT_PROJECT,
        )
        swept = await sweeper.sweep_once(pool, retention_days=30)
        assert swept.runs == 1200
        assert await conn.fetchval("SELECT count(*) FROM callbacks") == 0
        assert await conn.fetchval("SELECT message FROM run_logs") == "kept"
        assert await conn.fetchval("SELECT count(*) FROM runs") == 1
    finally:
        await pool.close()
        await conn.close()


CASCADES = [
    ("callbacks", "DELETE FROM callbacks WHERE run_id = $1::uuid"),
    ("steps", "DELETE FROM steps WHERE run_id = $1::uuid"),
    ("run_events", "DELETE FROM run_events WHERE run_id = $1::uuid"),
    ("run_logs", "DELETE FROM run_logs WHERE run_id = $1::uuid"),
    ("runs", "UPDATE runs SET parent_run_id = NULL WHERE parent_run_id = $1::uuid"),
]


@pytest.mark.parametrize(("table", "sql"), CASCADES, ids=[c[0] for c in CASCADES])
async def test_what_deleting_a_run_cascades_to_can_use_an_index(
    database_url: str, table: str, sql: str
) -> None:
    """The statements PostgreSQL runs for each foreign key to runs find their rows through an
    index, never by scanning the table."""
    conn = await db.connect(database_url)
    try:
        await conn.execute("SET enable_seqscan = off")
        await conn.execute(f"PREPARE q AS {sql}")
        plan = "\n".join(r[0] for r in await conn.fetch(f"EXPLAIN EXECUTE q('{uuid.uuid4()}')"))
        assert "Seq Scan" not in plan, plan
    finally:
        await conn.close()


SWEEPS = ["delete_old_runs", "delete_old_events", "delete_old_ticks", "delete_old_history"]


@pytest.mark.parametrize("query", SWEEPS)
async def test_every_sweep_can_use_an_index(database_url: str, query: str) -> None:
    """Each sweep statement finds what it deletes through indexes, not by scanning tables."""
    conn = await db.connect(database_url)
    try:
        await conn.execute("SET enable_seqscan = off")
        await conn.execute(f"PREPARE q AS {Q[query]}")
        plan = "\n".join(r[0] for r in await conn.fetch("EXPLAIN EXECUTE q(86400, 500)"))
        assert "Seq Scan" not in plan, plan
    finally:
        await conn.close()


async def test_ending_and_deleting_a_run_with_callbacks(database_url: str) -> None:
    """A run ended and past retention goes with its callbacks (the cascade the index serves)."""
    conn = await db.connect(database_url)
    pool = await db.create_pool(database_url, min_size=1, max_size=2)
    try:
        await keys.bootstrap(conn)
        run_id = await _run(conn)
        await conn.execute(
            "INSERT INTO callbacks (id, project_id, run_id, step_name) VALUES ($1, $2, $3, 'c')",
            uuid.uuid4(),
            keys.DEFAULT_PROJECT,
            run_id,
        )
        async with conn.transaction():
            await outcomes.end_run(conn, run_id, None, RunStatus.COMPLETED, None, None)
        await conn.execute(
            "UPDATE runs SET ended_at = now() - interval '31 days' WHERE id = $1", run_id
        )
        assert (await sweeper.sweep_once(pool, retention_days=30)).runs == 1
        assert await conn.fetchval("SELECT count(*) FROM callbacks") == 0
    finally:
        await pool.close()
        await conn.close()
