"""Rate limits and priorities in the claim, against real PostgreSQL (races with two
connections and a transaction held open)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

from stepline_server.store import apps, claims, db, keys, runs
from tests.integration.test_races import blocked_or_done, close_all, connections

PROJECT = keys.DEFAULT_PROJECT
LIMITED = {"rateLimit": {"limit": 1, "periodMs": 3_600_000}}
PERIOD_1H = timedelta(hours=1)


async def registered(conn: db.Conn, workflows: list[tuple[str, dict[str, Any]]]) -> None:
    await keys.bootstrap(conn)
    app = await apps.create(conn, PROJECT, "a", "http://127.0.0.1:9/", "s")
    await apps.record_sync(conn, app, workflows, None)


async def start(conn: db.Conn, workflow: str, input: Any = None, priority: int = 0) -> uuid.UUID:
    run_id = uuid.uuid4()
    await runs.insert(conn, runs.NewRun(run_id, PROJECT, workflow, input, priority=priority))
    return run_id


async def test_two_claims_at_once_never_exceed_a_rate_limit(database_url: str) -> None:
    """Limit 1 an hour: one orchestrator leases a run in a transaction still open while a second
    run comes due and another orchestrator claims; the second waits for the first, sees the
    window full and leaves its run unstarted, due again an hour after the first started."""
    first, second, watcher = conns = await connections(database_url, 3)
    try:
        await registered(first, [("limited", LIMITED)])
        one = await start(first, "limited")
        two = await start(watcher, "limited")
        await watcher.execute(
            "UPDATE runs SET ready_at = now() + interval '1 h' WHERE id = $1", two
        )
        async with first.transaction():
            [claim] = await claims.claim(first, "first", 60, 10)
            assert claim["id"] == one
            await watcher.execute("UPDATE runs SET ready_at = now() WHERE id = $1", two)
            claiming = asyncio.ensure_future(claims.claim(second, "second", 60, 10))
            assert await blocked_or_done(watcher, second.get_server_pid(), claiming)
        assert await claiming == []
        rows = {
            r["id"]: r
            for r in await watcher.fetch(
                "SELECT id, started_at, ready_at, lease_token FROM runs WHERE workflow = 'limited'"
            )
        }
        assert rows[two]["started_at"] is None and rows[two]["lease_token"] is None
        assert rows[two]["ready_at"] == rows[one]["started_at"] + PERIOD_1H
    finally:
        await close_all(conns)


async def test_a_rate_limit_counts_per_key_value_and_not_later_invocations(
    database_url: str,
) -> None:
    """Limit 1 an hour per userId: one run of u1 and one of u2 start, the second of u1 waits;
    the started run of u1, due again (a later invocation), is claimed at once."""
    conn = await db.connect(database_url)
    try:
        options = {"rateLimit": {"limit": 1, "periodMs": 3_600_000, "key": "userId"}}
        await registered(conn, [("per-user", options)])
        a1 = await start(conn, "per-user", {"userId": "u1"})
        a2 = await start(conn, "per-user", {"userId": "u1"})
        b1 = await start(conn, "per-user", {"userId": "u2"})
        claimed = {r["id"] for r in await claims.claim(conn, "o", 60, 10)}
        assert claimed == {a1, b1}
        assert await claims.claim(conn, "o", 60, 10) == []
        waiting = await conn.fetchrow("SELECT started_at, ready_at FROM runs WHERE id = $1", a2)
        assert waiting["started_at"] is None and waiting["ready_at"] is not None
        await conn.execute("UPDATE runs SET lease_token = NULL, ready_at = now() WHERE id = $1", a1)
        assert [r["id"] for r in await claims.claim(conn, "o", 60, 10)] == [a1]
    finally:
        await conn.close()


async def test_due_runs_are_claimed_higher_priority_first(database_url: str) -> None:
    """Runs due in the order low, high, default, highest: a claim of two takes the two highest,
    the next the default one, the last the lowest."""
    conn = await db.connect(database_url)
    try:
        await registered(conn, [("wf", {})])
        low = await start(conn, "wf", priority=-5)
        high = await start(conn, "wf", priority=10)
        default = await start(conn, "wf")
        highest = await start(conn, "wf", priority=100)
        order = []
        for n in (2, 1, 1):
            order.append([r["id"] for r in await claims.claim(conn, "o", 60, n)])
        assert order == [[highest, high], [default], [low]]
    finally:
        await conn.close()


async def test_the_claim_reads_an_index_however_many_runs_wait(database_url: str) -> None:
    """With 20,000 runs asleep (ready later, each with its sleeping step) at three priorities
    and ten due, the claim's plan (generic, as the pool runs it) reads runs and steps through
    indexes only: no sequential scan of either."""
    conn = await db.connect(database_url)
    try:
        await registered(conn, [("wf", {})])
        app_id = await conn.fetchval("SELECT id FROM apps")
        await conn.execute(
            """INSERT INTO runs (id, project_id, app_id, workflow, ready_at, priority, started_at)
               SELECT gen_random_uuid(), $1, $2, 'wf', now() + interval '1 h', g % 3 - 1, now()
               FROM generate_series(1, 20000) g""",
            PROJECT,
            app_id,
        )
        await conn.execute(
            """INSERT INTO steps (run_id, name, project_id, kind, status, position, wake_at)
               SELECT id, 'nap', project_id, 'sleep', 'sleeping', 1, ready_at FROM runs""",
        )
        for n in range(10):
            await start(conn, "wf", priority=n % 2)
        await conn.execute("ANALYZE runs, steps")
        for name, value in db.SESSION_SETTINGS.items():
            await conn.execute(f"SET {name} = '{value}'")
        async with conn.transaction():
            await conn.execute(
                f"PREPARE claim(int, text, float8, float8, bool, uuid[]) AS {db.Q['claim_due']}"
            )
            plan = "\n".join(
                r[0]
                for r in await conn.fetch("EXPLAIN EXECUTE claim(64, 'o', 30, 0.05, true, '{}')")
            )
            claimed = await conn.fetch("EXECUTE claim(64, 'o', 30, 0.05, true, '{}')")
        assert "Seq Scan" not in plan, plan
        assert "runs_ready_priority" in plan, plan
        assert len(claimed) == 10
    finally:
        await conn.close()


async def test_a_rate_limited_run_goes_by_priority_and_never_waits_past_its_deadline(
    database_url: str,
) -> None:
    """Limit 1 an hour and a time limit of a minute, runs of priority 0, 5 and -1 due together:
    the claim starts the one of priority 5; the two left come due at their deadlines (to be
    ended timedOut then), not an hour later."""
    conn = await db.connect(database_url)
    try:
        await registered(conn, [("limited", {**LIMITED, "timeoutMs": 60_000})])
        others = [await start(conn, "limited")]
        urgent = await start(conn, "limited", priority=5)
        others.append(await start(conn, "limited", priority=-1))
        [claim] = await claims.claim(conn, "o", 60, 10)
        assert claim["id"] == urgent
        rows = await conn.fetch(
            "SELECT ready_at, deadline_at, started_at FROM runs WHERE id = ANY($1::uuid[])",
            others,
        )
        assert [r["started_at"] for r in rows] == [None, None]
        assert all(r["ready_at"] == r["deadline_at"] for r in rows), rows
    finally:
        await conn.close()
