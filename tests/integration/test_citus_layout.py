"""The Citus layout step: nothing on plain PostgreSQL; on a Citus cluster (``STEPLINE_TEST_CITUS``,
``tests/citus/run.sh``) every table laid out as ``store/citus.py`` lists, one run's rows on one
shard."""

from __future__ import annotations

import os
import uuid

import asyncpg
import pytest

from stepline_server.engine import bulk, ids
from stepline_server.store import (
    alerts,
    apps,
    citus,
    claims,
    db,
    deployments,
    keys,
    migrate,
    operations,
    orchestrators,
    runs,
)
from stepline_server.store.db import Q
from tests.citus import plans
from tests.citus.statements import probe

ON_CITUS = bool(os.environ.get("STEPLINE_TEST_CITUS"))

# The named statements Citus 13.2 refuses on the laid-out schema (docs/scaling.md says why,
# by cause; one with a Citus variant, store/citus.sql, is probed as its variant). A statement
# made acceptable leaves this list; a new one may not join it.
KNOWN_REFUSED: frozenset[str] = frozenset()
# (claim_due, lease_begin_now, heartbeat, begin_invocations, progress, suspend_runs and end_runs
# are not in the probe's list: on Citus the store runs their Citus forms, store/citus_loop.py,
# which the probe runs in their place.)

# The run transitions whose bodies Citus 13.2 refuses when delegated to a run's worker (called
# one run at a time, on a leased run, in a transaction, as the run loop calls them on Citus):
# each statement inside is still planned by Citus, and pinned to the run's shard. None is
# refused since migration 0034 (docs/scaling.md says what each needed).
KNOWN_REFUSED_TRANSITIONS: frozenset[str] = frozenset()


async def test_laying_out_does_nothing_on_plain_postgresql(database_url: str) -> None:
    if ON_CITUS:
        pytest.skip("the database has the citus extension")
    conn = await asyncpg.connect(database_url)
    try:
        assert not await citus.citus_present(conn)
        layout = await citus.lay_out(conn)
        assert not layout
        assert layout.changed == []
        # The migrations kept every unique index of the schema (none was changed for Citus).
        assert (
            await conn.fetchval(
                "SELECT count(*) FROM pg_indexes WHERE indexname IN ('runs_run_key', "
                "'runs_singleton') AND indexdef LIKE 'CREATE UNIQUE INDEX%'"
            )
            == 2
        )
    finally:
        await conn.close()


async def test_the_migrated_database_is_laid_out_by_run(database_url: str) -> None:
    if not ON_CITUS:
        pytest.skip("STEPLINE_TEST_CITUS names no Citus cluster")
    conn = await asyncpg.connect(database_url)
    try:
        tables = {
            r["table_name"]: (r["citus_table_type"], r["distribution_column"], r["colocation_id"])
            for r in await conn.fetch(
                "SELECT table_name::text, citus_table_type, distribution_column, colocation_id "
                "FROM citus_tables"
            )
        }
        for name in citus.REFERENCE:
            assert tables[name][0] == "reference", name
        for name, column, _ in citus.DISTRIBUTED:
            assert tables[name][:2] == ("distributed", column), name
        run_group = tables["runs"][2]
        colocated = {n for n, (_, _, group) in tables.items() if group == run_group}
        assert colocated == {n for n, _, with_ in citus.DISTRIBUTED if "runs" in (n, with_)}
        # Laying out again finds nothing left to do.
        assert not await citus.lay_out(conn)
        assert await migrate.apply_migrations(conn) == []
        # One run's rows hash to one shard: the shard of its id holds its steps and history.
        run_id = uuid.uuid4()
        shards = await conn.fetch(
            "SELECT d.shardminvalue, p.nodeport FROM unnest($2::text[]) AS t "
            "JOIN pg_dist_shard d ON d.shardid = "
            "get_shard_id_for_distribution_column(t::regclass, $1::uuid::text) "
            "JOIN pg_dist_shard_placement p ON p.shardid = d.shardid",
            run_id,
            ["runs", "steps", "run_events", "callbacks", "run_logs", "run_state"],
        )
        assert len(shards) == 6
        assert len({(r["shardminvalue"], r["nodeport"]) for r in shards}) == 1
    finally:
        await conn.close()


async def test_citus_refuses_no_statement_beyond_the_known_ones(database_url: str) -> None:
    if not ON_CITUS:
        pytest.skip("STEPLINE_TEST_CITUS names no Citus cluster")
    refused, _, ran = await probe(database_url, generic=False)
    names = {name for names in refused.values() for name in names}
    assert names - KNOWN_REFUSED == set(), refused
    assert len(ran) > 100


async def test_a_run_key_names_one_run_by_its_id(database_url: str) -> None:
    """A keyed run's id is its key's (``ids.run_key_id``): a second insert with the key makes
    nothing, on plain PostgreSQL (the primary key, and the unique index on the key) and on
    Citus (the primary key alone: the index is not unique there); another environment's run
    of the same key is another run."""
    conn = await db.connect(database_url)
    try:
        made = {}
        project = await keys.create_project(conn, "keyed")
        assert project is not None
        for name in ("production", "staging"):
            env = await keys.find_environment(conn, project["id"], name)
            assert env is not None
            app = await apps.create(conn, env["id"], "app", "http://127.0.0.1:9/")
            assert app is not None
            await apps.record_sync(conn, app, [("keyed", {})], None)
            new = runs.NewRun(ids.run_key_id(env["id"], "k-1"), env["id"], "keyed", {"n": 1},
                              run_key="k-1")  # fmt: skip
            first = await runs.insert(conn, new, notify=False)
            assert first is not None and first["id"] == new.id
            assert await runs.insert(conn, new, notify=False) is None
            found = await runs.by_key(conn, env["id"], "k-1")
            assert found is not None and found["id"] == new.id
            made[name] = new.id
        assert made["production"] != made["staging"]
        unique = await conn.fetchval(
            "SELECT indexdef LIKE 'CREATE UNIQUE INDEX%' FROM pg_indexes "
            "WHERE indexname = 'runs_run_key'"
        )
        assert unique is (not ON_CITUS)
    finally:
        await conn.close()


async def test_statements_reshaped_for_citus_run_on_rows(database_url: str) -> None:
    """The statements reshaped for Citus (docs/scaling.md, "Made acceptable") answer what
    they answered, with rows to read: on plain PostgreSQL and on Citus (the probe runs each
    once on empty tables, where Citus may choose another plan)."""
    conn = await db.connect(database_url)
    try:
        project = await keys.create_project(conn, "rows")
        assert project is not None
        env = await keys.find_environment(conn, project["id"], "production")
        assert env is not None
        env_id = env["id"]
        app = await apps.create(conn, env_id, "app", "http://127.0.0.1:9/")
        assert app is not None
        await apps.record_sync(conn, app, [("w", {"singletonKey": "k"})], None)
        await apps.record_sync(conn, app, [("w", {"singletonKey": "k"})], "d-1")  # upsert again
        await orchestrators.seen(conn, "o-1", 1.0)
        await orchestrators.seen(conn, "o-1", 2.0)

        # singleton_holder: the run not ended that holds an ended run's singleton key.
        ended = runs.NewRun(ids.new_id(), env_id, "w", {"k": "a"})
        assert await runs.insert(conn, ended, notify=False) is not None
        await conn.execute(
            "UPDATE runs SET status = 'completed', ended_at = now(), ready_at = NULL WHERE id = $1",
            ended.id,
        )
        active = runs.NewRun(ids.new_id(), env_id, "w", {"k": "a"})
        assert await runs.insert(conn, active, notify=False) is not None
        assert await conn.fetchval(Q["singleton_holder"], ended.id) == active.id
        assert await conn.fetchval(Q["singleton_holder"], active.id) is None
        assert await runs.steps(conn, active.id) == []

        # list_deployments: the current deployment counts the run not ended on it.
        listed = await deployments.listed(conn, app["id"])
        assert [(r["current"], r["running_runs"]) for r in listed] == [(True, 1)]
        # app_answered_with: the run is on the current deployment, so the app expects d-2.
        await apps.answered_with(conn, app["id"], "d-2", active.id)
        assert await conn.fetchval("SELECT deployment_id FROM apps WHERE id = $1", app["id"]) == (
            "d-2"
        )

        # A bulk operation over both runs: filled, claimed, a batch recorded, completed.
        op_id = uuid.uuid4()
        selection = bulk.Selection(statuses=("running", "completed"), workflow="w")
        op = await operations.create(conn, op_id, env_id, "cancel", {}, selection, None)
        assert (op["matched"], op["status"]) == (2, "running")
        async with conn.transaction():
            claimed = await operations.claim(conn)
            assert claimed is not None and claimed["id"] == op_id
            items = await operations.claim_runs(conn, op_id, 10)
            assert [i.run_id for i in items] == [ended.id, active.id]
            done = [operations.Done(items[0].position, "skipped"),
                    operations.Done(items[1].position, "succeeded")]  # fmt: skip
            op = await operations.record(conn, op_id, done)
        assert (op["succeeded"], op["skipped"], op["status"]) == (1, 1, "completed")
        assert op["ended_at"] is not None
        ahead = await operations.ahead(conn, op_id, 10)
        assert (ahead.waiting, ahead.invoking) == (1, 0)  # the active run, due, not leased
        empty = await operations.create(
            conn, uuid.uuid4(), env_id, "cancel", {}, bulk.Selection(statuses=()), None
        )
        assert (empty["matched"], empty["status"]) == (0, "completed")

        # The alerts outbox: a test notification, claimed, its attempt recorded.
        alert = await alerts.create(
            conn, env_id, "a", ["run.failed"], None, "webhook", "http://127.0.0.1:9/"
        )
        note = await alerts.record_test(conn, env_id, alert["id"])
        assert note is not None
        lease = uuid.uuid4()
        assert [r["id"] for r in await alerts.claim(conn, 10, lease, 30.0)] == [note["id"]]
        assert await alerts.record_attempt(conn, note["id"], lease, "pending", 500, "x", 60.0)
        row = await conn.fetchrow(
            "SELECT attempts, delivered_at, next_attempt_at > now() + interval '50 seconds' "
            "AS later FROM alert_notifications WHERE id = $1",
            note["id"],
        )
        assert (row["attempts"], row["delivered_at"], row["later"]) == (1, None, True)

        # Deleting the app locks its runs (lock_runs_in_order) and deletes them.
        await apps.delete(conn, env_id, app["id"])
        assert await conn.fetchval("SELECT count(*) FROM runs WHERE project_id = $1", env_id) == 0
    finally:
        await conn.close()


async def test_the_run_transitions_on_a_leased_run(database_url: str) -> None:
    """On Citus: a run is leased on its shard (``citus_lease_run``), the claim leases the others
    on the shards that hold them, and each delegated run transition called on the leased run (in a
    transaction, rolled back) is refused only when known (a transition made acceptable leaves
    the list). On plain PostgreSQL the transitions' own tests run them."""
    if not ON_CITUS:
        pytest.skip("STEPLINE_TEST_CITUS names no Citus cluster")
    pool = await db.create_pool(database_url, min_size=1, max_size=1)
    try:
        async with pool.acquire() as conn:
            assert db.on_citus(conn)
            project = await keys.create_project(conn, "transitions")
            assert project is not None
            env = await keys.find_environment(conn, project["id"], "production")
            assert env is not None
            app = await apps.create(conn, env["id"], "app", "http://127.0.0.1:9/")
            assert app is not None
            await apps.record_sync(conn, app, [("w", {})], None)
            new = runs.NewRun(ids.new_id(), env["id"], "w", {"n": 1})
            assert await runs.insert(conn, new, notify=False) is not None
            run, env_id = new.id, env["id"]
            lease = await conn.fetchrow(Q["citus_lease_run"], run, "o-1", 30.0, [], True, True)
            assert lease is not None and lease["id"] == run
            # The dispatcher's claim (per shard on Citus) leases the other due runs, whatever
            # their shards, not the one leased; then nothing is due on any shard.
            others = [runs.NewRun(ids.new_id(), env["id"], "w", {"n": n}) for n in range(4)]
            for other in others:
                assert await runs.insert(conn, other, notify=False) is not None
            claimed = await claims.claim(conn, "o-2", 30.0, 10)
            assert sorted(r["id"] for r in claimed) == sorted(o.id for o in others)
            assert {r["lease_token"] is not None for r in claimed} == {True}
            assert await conn.fetch(Q["citus_due_candidates"], 0.0, 5, [], True) == []
            assert await claims.claim(conn, "o-3", 30.0, 10) == []
            token, invocation = lease["lease_token"], lease["invocation_id"]
            change = {"ord": 1, "name": "a", "kind": "run", "status": "completed",
                      "attempt": 1, "output": 1, "ended": True}  # fmt: skip
            calls: dict[str, tuple[str, tuple[object, ...]]] = {
                "run_keep_lease": ("SELECT run_keep_lease($1, $2, $3, 30)", (token,)),
                "run_begin": (
                    "SELECT * FROM run_begin($1, $2, $3, $4, 1, true, 0, 1000, 'd')",
                    (token, invocation),
                ),
                "run_progress": (
                    "SELECT * FROM run_progress($1, $2, $3, $4, $5, 0, null, 0, $6, null, "
                    "null, 10, 1000)",
                    (token, invocation, [{"type": "step.completed", "step_name": "a"}], [change]),
                ),
                "run_suspend": ("SELECT run_suspend($1, $2, $3, true)", (token,)),
                "run_release": ("SELECT run_release($1, $2, $3, 10)", (token,)),
                "run_end": (
                    "SELECT * FROM run_end($1, $2, $3, 'failed', null, '{}', 'run.failed', null)",
                    (token,),
                ),
                "run_wake": ("SELECT run_wake($1, $2, '[]')", ()),
                "run_request_cancel": ("SELECT run_request_cancel($1, $2)", ()),
                "run_continue": ("SELECT * FROM run_continue($1, $2, $3, '{}')", (token,)),
                "run_hold": ("SELECT run_hold($1, $2)", ()),
                "run_unhold": ("SELECT run_unhold($1, $2)", ()),
                "run_defer": ("SELECT run_defer($1, $2, now())", ()),
                "run_resume": ("SELECT run_resume($1, $2)", ()),
                "run_move": ("SELECT run_move($1, $2, $3)", (uuid.uuid4(),)),
                "run_repair": ("SELECT run_repair($1, $2, 'x')", ()),
                "run_gather_input": ("SELECT run_gather_input($1, $2, '{}', false)", ()),
                "run_fire": ("SELECT run_fire($1, $2, '[]')", ()),
                "append_run_events": (
                    "SELECT append_run_events($1, $2, $3)",
                    ([{"type": "run.repaired"}],),
                ),
            }
            refused = set()
            for name, (sql, args) in calls.items():
                tr = conn.transaction()
                await tr.start()
                try:
                    await conn.fetch(sql, run, env_id, *args)
                except asyncpg.FeatureNotSupportedError:
                    refused.add(name)
                await tr.rollback()
            assert refused == KNOWN_REFUSED_TRANSITIONS
    finally:
        await pool.close()


# The statements that move or read one run, as the store runs them on Citus (the Citus forms
# of the group statements in their place): each must be one shard's task. (complete_callback
# finds its callback by id, on every shard, and its run then: docs/scaling.md.)
ONE_RUN_STATEMENTS = (
    "citus_lease_run", "citus_begin", "citus_progress", "citus_suspend", "citus_end",
    "citus_keep_lease", "wake", "request_cancel", "restart_run", "continue_run",
    "append_events", "invoke_failed", "debounce_input", "batch_input", "fail_step",
    "resolve_child_step", "cancel_waits", "delete_steps_for_retry", "join_gathering",
    "get_run", "run_steps", "state_record", "insert_run",
)  # fmt: skip


async def test_the_statements_moving_one_run_are_one_shards_task(database_url: str) -> None:
    """On Citus: the plan of each statement that moves one run (explained with placeholder
    values, custom plans) has every distributed scan run as one task: one shard's."""
    if not ON_CITUS:
        pytest.skip("STEPLINE_TEST_CITUS names no Citus cluster")
    conn = await db.connect(database_url)
    try:
        found = {name: str(await plans.spans(conn, name)) for name in ONE_RUN_STATEMENTS}
    finally:
        await conn.close()
    assert {n: s for n, s in found.items() if not s.startswith("one shard")} == {}
