"""The ``scale`` workload: ``steps``, ``sleep`` and ``callback`` on the database as it is, then
again after filling it by set-based inserts (then vacuumed and analysed) with ended runs (3 steps
and 7 history events each; a quarter also waited on a callback, a quarter on an event, a tenth
are child runs of the run before them, with their parent's ``invoke`` step) and runs waiting
(a third asleep, a third on a pending callback, a third on an event), and a day of received
events; then which of the run loop's statements would read a large table whole, from their
generic plans (the plans a prepared statement settles on) on the full database."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from dataclasses import replace
from typing import Any

import asyncpg

from bench import workloads
from bench.workloads import Bench, Result
from stepline_server.loops import sweeper
from stepline_server.store import db
from stepline_server.store.db import Q

# A fresh table of ids, then each table filled from it in one statement. The ids are
# time-ordered like the orchestrator's (UUIDv7 of the run's creation: run g was created g + 1
# seconds ago, and ended g seconds ago; $2 seconds older still for the runs the sweep deletes).
_IDS = """
CREATE TEMP TABLE fill_ids ON COMMIT DROP AS
SELECT (lpad(to_hex(((extract(epoch FROM now()) - g - 1 - $2) * 1000)::bigint), 12, '0') || '7'
        || substr(h, 1, 3) || '8' || substr(h, 4, 15))::uuid AS id, g + $2::int AS g
FROM generate_series(1, $1::int) g, LATERAL (SELECT md5(random()::text || g) AS h) r"""
# A tenth of the ended runs are children of the run created just before them (which is not one).
_CHILDREN = """
UPDATE runs c SET parent_run_id = p.id, parent_step = 'child', trigger = 'parent'
FROM fill_ids f JOIN fill_ids p ON p.g = f.g + 1
WHERE c.id = f.id AND f.g % 10 = 2 AND c.project_id = $1"""
_PARENT_STEPS = """
INSERT INTO steps (run_id, name, project_id, kind, status, position, output, ended_at,
                   child_run_id)
SELECT p.id, 'child', $1, 'invoke', 'completed', 9, '3', now(), f.id
FROM fill_ids f JOIN fill_ids p ON p.g = f.g + 1
WHERE f.g % 10 = 2"""
# A quarter of the ended runs waited on a callback (completed), a quarter on an event.
_ENDED_CALLBACK_STEPS = """
INSERT INTO steps (run_id, name, project_id, kind, status, position, output, ended_at,
                   callback_id)
SELECT f.id, 'cb', $1, 'callback', 'completed', 10, '{"ok": true}', now(), f.id
FROM fill_ids f WHERE f.g % 4 = 0"""
_ENDED_CALLBACKS = """
INSERT INTO callbacks (id, project_id, run_id, step_name, status, body, completed_at)
SELECT f.id, $1, f.id, 'cb', 'completed', '{"ok": true}', now()
FROM fill_ids f WHERE f.g % 4 = 0"""
_ENDED_EVENT_STEPS = """
INSERT INTO steps (run_id, name, project_id, kind, status, position, output, ended_at,
                   event_name)
SELECT f.id, 'ev', $1, 'event', 'completed', 10, '{"ok": true}', now(),
       'bench.filled-' || f.g % 1000
FROM fill_ids f WHERE f.g % 4 = 1"""
# A day of events received (they are kept a day), one a second.
_RECEIVED_EVENTS = """
INSERT INTO events (id, project_id, name, data, received_at)
SELECT gen_random_uuid(), $1, 'bench.filled-' || g % 1000, '{"ok": true}',
       now() - g * interval '1 second'
FROM generate_series(1, least($2::int, 86000)) g"""
_ENDED_RUNS = """
INSERT INTO runs (id, project_id, app_id, workflow, status, input, output, created_at,
                  started_at, ended_at, version)
SELECT id, $1, $2, 'steps', 'completed', '{"n": 3}', '3',
       now() - (g * interval '1 second') - interval '1 second',
       now() - (g * interval '1 second') - interval '1 second', now() - (g * interval '1 second'),
       2
FROM fill_ids"""
_ENDED_STEPS = """
INSERT INTO steps (run_id, name, project_id, kind, status, position, output, ended_at)
SELECT f.id, 's' || k, $1, 'run', 'completed', 2 + 2 * k, to_jsonb(k), now()
FROM fill_ids f CROSS JOIN generate_series(1, 3) k"""
# Through append_run_events, the only writer of a run's history (one call a run).
_ENDED_EVENTS = """
SELECT count(append_run_events(f.id, $1, '[
    {"type": "run.started"}, {"type": "invocation.started"},
    {"type": "step.started", "step_name": "s1"}, {"type": "step.completed", "step_name": "s1"},
    {"type": "step.completed", "step_name": "s1"}, {"type": "invocation.ended"},
    {"type": "run.completed"}]'::jsonb))
FROM fill_ids f"""
_SLEEPING_RUNS = """
INSERT INTO runs (id, project_id, app_id, workflow, status, input, created_at, started_at,
                  ready_at)
SELECT id, $1, $2, 'idle', 'running', '{"ms": 3600000}', now(), now(),
       now() + interval '1 hour' + g * interval '10 ms'
FROM fill_ids"""
# A third of the waiting runs sleep, a third wait on a callback, a third on an event (neither
# with a timeout, so only their sleepers have a due time).
_SLEEPING_STEPS = """
INSERT INTO steps (run_id, name, project_id, kind, status, position, wake_at, callback_id,
                   event_name)
SELECT f.id, 'nap', $1, w.kind, w.status, 3, w.wake_at, w.callback_id, w.event_name
FROM fill_ids f CROSS JOIN LATERAL (
    SELECT CASE f.g % 3 WHEN 0 THEN 'sleep' WHEN 1 THEN 'callback' ELSE 'event'
           END::step_kind AS kind,
           CASE f.g % 3 WHEN 0 THEN 'sleeping' ELSE 'waiting' END::step_status AS status,
           CASE WHEN f.g % 3 = 0 THEN now() + interval '1 hour' + f.g * interval '10 ms'
           END AS wake_at,
           CASE WHEN f.g % 3 = 1 THEN f.id END AS callback_id,
           CASE WHEN f.g % 3 = 2 THEN 'bench.waited-' || f.g % 1000 END AS event_name
) w"""
_PENDING_CALLBACKS = """
INSERT INTO callbacks (id, project_id, run_id, step_name)
SELECT f.id, $1, f.id, 'nap' FROM fill_ids f WHERE f.g % 3 = 1"""
_WAITING_RUNS = """
UPDATE runs r SET ready_at = NULL
FROM fill_ids f WHERE r.id = f.id AND f.g % 3 <> 0 AND r.project_id = $1"""
_SLEEPING_EVENTS = """
SELECT count(append_run_events(f.id, $1, '[
    {"type": "run.started"}, {"type": "invocation.started"},
    {"type": "step.sleeping", "step_name": "nap"}, {"type": "invocation.ended"}]'::jsonb))
FROM fill_ids f"""


async def fill(dsn: str, ended: int, sleeping: int) -> dict[str, Any]:
    """Add ``ended`` ended runs and ``sleeping`` sleeping ones for the newest app; analyse."""
    conn = await asyncpg.connect(dsn)
    try:
        app = await conn.fetchrow(
            "SELECT id, project_id FROM apps ORDER BY created_at DESC LIMIT 1"
        )
        t0 = time.monotonic()
        batches = [
            (ended, (_ENDED_RUNS, _ENDED_STEPS, _ENDED_EVENTS, _CHILDREN, _PARENT_STEPS,
                     _ENDED_CALLBACK_STEPS, _ENDED_CALLBACKS, _ENDED_EVENT_STEPS)),
            (sleeping, (_SLEEPING_RUNS, _SLEEPING_STEPS, _SLEEPING_EVENTS, _PENDING_CALLBACKS,
                        _WAITING_RUNS)),
        ]  # fmt: skip
        for n, statements in batches:
            if n <= 0:
                continue
            async with conn.transaction():
                await conn.execute(_IDS, n, 0)
                await conn.execute(statements[0], app["project_id"], app["id"])
                for sql in statements[1:]:
                    await conn.execute(sql, app["project_id"])
        if ended > 0:
            await conn.execute(_RECEIVED_EVENTS, app["project_id"], ended)
        took = time.monotonic() - t0
        # A database that grew over months has long been vacuumed: so is this one before the
        # workloads, or autovacuum of the new rows would be what they measure.
        t1 = time.monotonic()
        await conn.execute("VACUUM (ANALYZE) runs, steps, run_events, callbacks, events")
        vacuum = time.monotonic() - t1
        size = await conn.fetchval("SELECT pg_size_pretty(pg_database_size(current_database()))")
        # (On Citus the run loop runs the statements' Citus forms, each planned for its values
        # on the shards: their plans are checked by ``python -m tests.citus.plans`` instead.)
        citus = await conn.fetchval(Q["citus_present"])
        plans = {} if citus else await _plans(conn)
    finally:
        await conn.close()
    return {"ended": ended, "sleeping": sleeping, "fill_s": round(took, 1),
            "vacuum_s": round(vacuum, 1), "db_size": size, "plans": plans,
            "plans_checked": not citus}  # fmt: skip


# The run loop's statements (claims, begins, progress, suspends and ends, the waits' wake-ups) and
# the runs API's (start, read, history).
_LOOP_FILES = (
    "claims", "progress", "outcomes", "children", "gates", "history", "leases", "pull",
    "orchestrators", "runs", "waits",
)  # fmt: skip
# The tables that grow with the runs kept: a statement that reads one of them whole does not scale.
_LARGE = ("runs", "steps", "run_events", "callbacks", "events", "run_logs")


def _loop_statements() -> list[str]:
    from importlib import resources

    names = []
    for stem in _LOOP_FILES:
        text = (resources.files("stepline_server.store") / f"{stem}.sql").read_text()
        names += [line.split(":", 1)[1].strip() for line in text.splitlines()
                  if line.startswith("-- name:")]  # fmt: skip
    return names


async def _plans(conn: asyncpg.Connection) -> dict[str, list[str]]:
    """Each run-loop statement's large tables read whole (``Seq Scan on …``) in its generic plan;
    the statements that read none are left out."""
    found = {}
    for name in _loop_statements():
        scans = await _plan(conn, name)
        seq = [s for s in scans if s.startswith("Seq Scan") and s.split()[3] in _LARGE]
        if seq:
            found[name] = seq
    return found


async def _plan(conn: asyncpg.Connection, name: str) -> list[str]:
    """How the statement's generic plan reads its tables: the scan nodes, in order."""
    async with conn.transaction():
        await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        await conn.execute(f"PREPARE p AS {Q[name]}")
        try:
            types = await conn.fetchval(
                "SELECT parameter_types::text[] FROM pg_prepared_statements WHERE name = 'p'"
            )
            # the generic plan does not depend on the values: nulls of each type will do
            values = ", ".join(f"NULL::{t}" for t in types)
            rows = await conn.fetch(f"EXPLAIN EXECUTE p{f'({values})' if types else ''}")
        finally:
            await conn.execute("DEALLOCATE p")
        lines = [r[0] for r in rows]
    scans = [
        line.strip().removeprefix("->").strip().split("  (")[0]
        for line in lines
        if " Scan " in line or line.strip().startswith(("Seq Scan", "Index", "Bitmap"))
    ]
    return list(dict.fromkeys(scans))


async def scale(bench: Bench, dsn: str, runs: int, steps: int, sleep_ms: int, ended: int,
                sleeping: int) -> list[Result]:  # fmt: skip
    """The core workloads before and after the fill, and again while the sweeper deletes a day
    of runs past their retention; each row named for its database."""
    before = await _core(bench, runs, steps, sleep_ms)
    filled = await fill(dsn, ended, sleeping)
    after = await _core(bench, runs, steps, sleep_ms)
    old = min(ended, _DAY)
    await add_expired(dsn, old)
    sweeping, swept = await _while_sweeping(dsn, _core(bench, runs, steps, sleep_ms))
    label = f"@{_short(ended)}+{_short(sleeping)}"
    rows = [replace(r, name=r.name + "@empty") for r in before]
    rows += [replace(r, name=r.name + label) for r in after]
    rows += [replace(r, name=r.name + "@sweep") for r in sweeping]
    fill_extra = {**filled, "after_vs_empty": _ratios(rows, before, label)}
    sweep_extra = {**swept, "sweep_vs_empty": _ratios(rows, before, "@sweep")}
    n = ended + sleeping
    rows.append(Result("fill", n, n, filled["fill_s"], 0, [], extra=fill_extra))
    rows.append(Result("sweep", old, swept["runs"], swept["took_s"], 0, [], extra=sweep_extra))
    return rows


def _ratios(rows: list[Result], before: list[Result], label: str) -> dict[str, Any]:
    """Each core workload's steps/s and p50 on the database ``label`` names ÷ on the empty one."""
    by_name = {r.name: r for r in rows}
    ratios = {}
    for r in before:
        a, b = by_name[r.name + "@empty"].as_json(), by_name[r.name + label].as_json()
        p50_a, p50_b = a["latency_ms"]["p50"] or 0, b["latency_ms"]["p50"] or 0
        ratios[r.name] = {
            "steps_per_s": round(b["steps_per_s"] / max(a["steps_per_s"], 1e-9), 2),
            "p50_ms": round(p50_b / max(p50_a, 1e-9), 2),
        }
    return ratios


_DAY = 86_400  # runs: the fill's runs end one a second
_EXPIRED = "SELECT count(*) FROM runs WHERE ended_at < now() - $1::float8 * interval '1 day'"
_RETENTION_DAYS = 30.0  # the orchestrator's default (STEPLINE_RETENTION_DAYS)


async def add_expired(dsn: str, n: int) -> None:
    """Add ``n`` ended runs (with their steps and history) that ended just past the retention,
    one a second: the sweeper's next sweep deletes them all."""
    conn = await asyncpg.connect(dsn)
    try:
        app = await conn.fetchrow(
            "SELECT id, project_id FROM apps ORDER BY created_at DESC LIMIT 1"
        )
        async with conn.transaction():
            await conn.execute(_IDS, n, int(_RETENTION_DAYS * _DAY) + 60)
            await conn.execute(_ENDED_RUNS, app["project_id"], app["id"])
            for sql in (_ENDED_STEPS, _ENDED_EVENTS):
                await conn.execute(sql, app["project_id"])
        await conn.execute("VACUUM (ANALYZE) runs, steps, run_events")
    finally:
        await conn.close()


async def _while_sweeping(
    dsn: str, work: Coroutine[Any, Any, list[Result]]
) -> tuple[list[Result], dict[str, Any]]:
    """Run ``work`` while a sweep (the sweeper's own code, beside the orchestrator's sweeper
    passing every minute) deletes what is past retention: how many runs past retention were
    deleted while the work ran, and how long until none was left."""
    pool = await db.create_pool(dsn)
    try:
        async with pool.acquire() as conn:
            expired = await conn.fetchval(_EXPIRED, _RETENTION_DAYS)
        t0 = time.monotonic()
        sweep = asyncio.create_task(sweeper.sweep_once(pool, _RETENTION_DAYS))
        results = await work
        async with pool.acquire() as conn:
            during = expired - await conn.fetchval(_EXPIRED, _RETENTION_DAYS)
            await sweep
            left = await conn.fetchval(_EXPIRED, _RETENTION_DAYS)
        return results, {
            "runs": expired - left,
            "during_workloads": during,
            "took_s": round(time.monotonic() - t0, 1),
            "duty": sweeper.SWEEP_DUTY,
        }
    finally:
        await pool.close()


async def _core(bench: Bench, runs: int, steps: int, sleep_ms: int) -> list[Result]:
    results = await workloads.steps(bench, runs, steps)
    results += await workloads.latency(bench, 10, steps)
    results += await workloads.sleep(bench, runs, sleep_ms)
    results += await workloads.callback(bench, runs)
    return results


def _short(n: int) -> str:
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    return f"{n // 1000}k" if n >= 1000 and n % 1000 == 0 else str(n)
