"""The one lease transition: every path that leases a run (due runs, capped and rate-limited
runs, pull polls, a run taken at once) holds the fence, the outage grace and pausing, and
answers the same claim."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from stepline_server.engine.transitions import Claim
from stepline_server.store import apps, claims, db, keys, leases, pull, runs

P = keys.DEFAULT_PROJECT
CLAIM_COLUMNS = {
    "id", "project_id", "app_id", "workflow", "status", "input", "options", "cancel_requested",
    "past_deadline", "lease_token", "invocation_id", "invoke_attempts", "undelivered_since",
    "wake_seq", "concurrency_key", "generation", "created_at", "pull", "priority", "due_in",
    "taken_over", "app_url", "app_secrets", "app_protocol",
}  # fmt: skip


async def _app(conn: db.Conn, workflows: list[tuple[str, dict[str, Any]]], kind: str = "push"):
    await keys.bootstrap(conn)
    url = None if kind == "pull" else "http://127.0.0.1:9/"
    app = await apps.create(conn, P, f"app-{kind}", url, "s", kind=kind)
    assert app is not None
    await apps.record_sync(conn, app, workflows, None)
    return app


async def _start(conn: db.Conn, workflow: str, value: Any = None) -> uuid.UUID:
    row = await runs.insert(conn, runs.NewRun(uuid.uuid4(), P, workflow, value))
    assert row is not None
    return uuid.UUID(str(row["id"]))


async def _lapse(conn: db.Conn, run_id: uuid.UUID) -> None:
    """The run's lease runs out (its holder's beats came late)."""
    await conn.execute(
        "UPDATE runs SET ready_at = now() - interval '1 second' WHERE id = $1", run_id
    )


async def test_a_capped_run_being_invoked_is_never_claimed_again_nor_counted_free(
    database_url: str,
) -> None:
    """A capped workflow's run whose lease lapsed while this orchestrator still invokes it is
    not claimed again by it, and it still fills the cap: the next run waits."""
    conn = await db.connect(database_url)
    try:
        await _app(conn, [("capped", {"concurrency": 1})])
        first = await _start(conn, "capped")
        [claim] = await claims.claim(conn, "here", 60, 10)
        assert claim["id"] == first
        second = await _start(conn, "capped")
        await _lapse(conn, first)
        again = await claims.claim(conn, "here", 60, 10, holding=[first])
        assert again == [], [r["id"] for r in again]
        row = await conn.fetchrow("SELECT lease_token FROM runs WHERE id = $1", first)
        assert row["lease_token"] == claim["lease_token"]
        # Another orchestrator, which is not invoking it, takes the lapsed lease over.
        [taken] = await claims.claim(conn, "there", 60, 10)
        assert taken["id"] == first and taken["taken_over"]
        assert second not in {taken["id"]}
    finally:
        await conn.close()


async def test_no_path_takes_over_a_lapsed_lease_just_after_an_outage(database_url: str) -> None:
    """Without takeovers (the database was just away), neither the claim of capped runs, nor
    a pull worker's poll, nor a run taken at once takes a lapsed lease; with them, each does."""
    conn = await db.connect(database_url)
    try:
        await _app(conn, [("capped", {"concurrency": 2}), ("free", {})])
        pull_app = await apps.create(conn, P, "pulled", None, "s", kind="pull")
        assert pull_app is not None
        await apps.record_sync(conn, pull_app, [("pulled", {})], None)
        capped, free, pulled = [await _start(conn, w) for w in ("capped", "free", "pulled")]
        assert len(await claims.claim(conn, "dead", 60, 10)) == 2
        assert len(await pull.claim(conn, pull_app["id"], "dead", 60, 10)) == 1
        for run_id in (capped, free, pulled):
            await _lapse(conn, run_id)

        assert await claims.claim(conn, "here", 60, 10, takeovers=False) == []
        assert await pull.claim(conn, pull_app["id"], "here", 60, 10, takeovers=False) == []
        quiet = leases.Lease("here", 60, (), takeovers=False)
        async with conn.transaction():
            assert await leases.take_now(conn, free, quiet) is None

        assert {r["id"] for r in await claims.claim(conn, "here", 60, 10)} == {capped, free}
        assert [r["id"] for r in await pull.claim(conn, pull_app["id"], "here", 60, 10)] == [pulled]
    finally:
        await conn.close()


async def test_a_run_taken_at_once_is_never_one_the_taker_invokes_or_another_holds(
    database_url: str,
) -> None:
    """Taking a run at once (a callback's fast path) leases it only when no live lease holds
    it and the taker is not invoking it already."""
    conn = await db.connect(database_url)
    try:
        await _app(conn, [("free", {})])
        run_id = await _start(conn, "free")
        [claim] = await claims.claim(conn, "other", 60, 10)
        async with conn.transaction():
            assert await leases.take_now(conn, run_id, leases.Lease("here", 60)) is None
        await _lapse(conn, run_id)
        mine = leases.Lease("other", 60, (run_id,))
        async with conn.transaction():
            assert await leases.take_now(conn, run_id, mine) is None
        async with conn.transaction():
            taken = await leases.take_now(conn, run_id, leases.Lease("here", 60))
        assert taken is not None and taken.claim.lease_token != claim["lease_token"]
    finally:
        await conn.close()


async def test_every_lease_answers_one_claim_with_the_runs_generation(database_url: str) -> None:
    """Due runs, capped runs, rate-limited runs, pull polls and a run taken at once all answer
    the same columns, the run's generation among them."""
    conn = await db.connect(database_url)
    try:
        await _app(
            conn,
            [
                ("free", {}),
                ("capped", {"concurrency": 1}),
                ("rated", {"rateLimit": {"limit": 5, "periodMs": 60000}}),
            ],
        )
        pull_app = await apps.create(conn, P, "pulled", None, "s", kind="pull")
        assert pull_app is not None
        await apps.record_sync(conn, pull_app, [("pulled", {})], None)
        for workflow in ("free", "capped", "rated", "pulled"):
            await _start(conn, workflow)
        await conn.execute("UPDATE runs SET generation = 3")
        claimed = list(await claims.claim(conn, "here", 60, 10))
        claimed += await pull.claim(conn, pull_app["id"], "here", 60, 10)
        taken_id = await _start(conn, "free")
        await conn.execute("UPDATE runs SET generation = 3 WHERE id = $1", taken_id)
        async with conn.transaction():
            taken = await leases.take_now(conn, taken_id, leases.Lease("here", 60))
        assert taken is not None
        # The run loop reads each claim as a typed record of the same columns.
        assert {f.name for f in dataclasses.fields(Claim)} == CLAIM_COLUMNS
        assert taken.claim.workflow == "free" and taken.claim.generation == 3
        assert taken.claim.lease_token is not None
        assert sorted(c["workflow"] for c in claimed) == ["capped", "free", "pulled", "rated"]
        for c in claimed:
            assert set(c.keys()) == CLAIM_COLUMNS, c["workflow"]
            assert c["generation"] == 3 and c["lease_token"] is not None
    finally:
        await conn.close()


async def test_a_paused_workflows_runs_are_set_aside_and_go_in_order_on_resume(
    database_url: str,
) -> None:
    """While a workflow is paused no claim leases its runs (they are set aside, no longer due);
    resumed, they are due again and go higher priority first, then oldest."""
    conn = await db.connect(database_url)
    try:
        await _app(conn, [("wf", {}), ("other", {})])
        await conn.execute("UPDATE workflows SET paused_at = now() WHERE name = 'wf'")
        old = await _start(conn, "wf")
        new = await _start(conn, "wf")
        urgent = runs.NewRun(uuid.uuid4(), P, "wf", None, priority=5)
        assert await runs.insert(conn, urgent) is not None
        other = await _start(conn, "other")
        assert [r["id"] for r in await claims.claim(conn, "here", 60, 10)] == [other]
        aside = await conn.fetch("SELECT paused, ready_at FROM runs WHERE workflow = 'wf'")
        assert all(r["paused"] and r["ready_at"] is None for r in aside)
        assert await claims.claim(conn, "here", 60, 10) == []
        await conn.execute("UPDATE workflows SET paused_at = NULL WHERE name = 'wf'")
        await conn.execute("UPDATE runs SET paused = false, ready_at = created_at WHERE paused")
        assert [r["id"] for r in await claims.claim(conn, "here", 60, 1)] == [urgent.id]
        assert [r["id"] for r in await claims.claim(conn, "here", 60, 1)] == [old]
        assert [r["id"] for r in await claims.claim(conn, "here", 60, 1)] == [new]
    finally:
        await conn.close()


async def test_a_run_taken_at_once_is_leased_and_begun_in_one_statement(
    database_url: str,
) -> None:
    """Taking a run at once is one statement: the run is leased, what came due is settled
    (the begin reads the lease written before it in the same statement) and invocation.started
    is recorded once; the steps come back in recorded order with the claim. (On a pooled
    connection, as the orchestrator's: the schema's enums are read as text there.)"""
    pool = await db.create_pool(database_url, min_size=1, max_size=1)
    async with pool.acquire() as conn:
        await _app(conn, [("free", {})])
        run_id = await _start(conn, "free", {"n": 1})
        await conn.execute(
            """INSERT INTO steps (run_id, name, project_id, kind, status, position, output,
                                  wake_at)
               VALUES ($1, 'b', $2, 'run', 'completed', 1, '{"x": 1}', NULL),
                      ($1, 'a', $2, 'sleep', 'sleeping', 2, NULL, now() - interval '1 second')""",
            run_id, P,
        )  # fmt: skip
        # (A first take on the connection also reads the claim's composite type: not counted.)
        async with conn.transaction():
            assert await leases.take_now(conn, await _start(conn, "free"), leases.Lease("x", 60))
        statements: list[str] = []

        def log(record: Any) -> None:
            statements.append(record.query)

        async with conn.transaction():
            conn.add_query_logger(log)
            taken = await leases.take_now(conn, run_id, leases.Lease("here", 60))
            conn.remove_query_logger(log)
        assert statements == [db.Q["lease_begin_now"]]
        assert taken is not None and taken.begun is not None
        claim = taken.claim
        assert claim.id == run_id and claim.input == {"n": 1} and claim.workflow == "free"
        assert [(s["name"], s["status"]) for s in taken.begun.steps] == [
            ("b", "completed"),
            ("a", "completed"),  # the sleep came due: settled by the begin
        ]
        assert taken.begun.steps[0]["output"] == {"x": 1}
        assert taken.begun.history_base is None and taken.begun.history_steps == 2
        row = await conn.fetchrow(
            "SELECT lease_token, lease_owner, history_invocation FROM runs WHERE id = $1", run_id
        )
        assert row is not None
        assert (row["lease_token"], row["lease_owner"]) == (claim.lease_token, "here")
        assert row["history_invocation"] == claim.invocation_id
        started = await conn.fetch(
            """SELECT invocation_id, data FROM run_events
               WHERE run_id = $1 AND type = 'invocation.started'""",
            run_id,
        )
        assert [(r["invocation_id"], r["data"]) for r in started] == [
            (claim.invocation_id, {"attempt": 1})
        ]
    await pool.close()


async def test_a_run_taken_at_once_past_its_deadline_or_not_leasable_is_not_begun(
    database_url: str,
) -> None:
    """A run past its deadline is leased (to be ended) but not begun; a run another holds,
    or a pull app's, is neither; none records invocation.started."""
    conn = await db.connect(database_url)
    try:
        await _app(conn, [("free", {})])
        pull_app = await apps.create(conn, P, "pulled", None, "s", kind="pull")
        assert pull_app is not None
        await apps.record_sync(conn, pull_app, [("pulled", {})], None)
        late = await _start(conn, "free")
        await conn.execute(
            "UPDATE runs SET deadline_at = now() - interval '1 second' WHERE id = $1", late
        )
        held = await _start(conn, "free")
        await conn.execute(
            "UPDATE runs SET lease_token = 'theirs', ready_at = now() + interval '1 minute'"
            " WHERE id = $1",
            held,
        )
        pulled = await _start(conn, "pulled")
        async with conn.transaction():
            taken = await leases.take_now(conn, late, leases.Lease("here", 60))
            assert await leases.take_now(conn, held, leases.Lease("here", 60)) is None
            assert await leases.take_now(conn, pulled, leases.Lease("here", 60)) is None
        assert taken is not None and taken.begun is None
        assert taken.claim.past_deadline and taken.claim.lease_token is not None
        assert not await conn.fetchval(
            "SELECT count(*) FROM run_events WHERE type = 'invocation.started'"
        )
    finally:
        await conn.close()
