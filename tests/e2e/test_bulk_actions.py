"""Bulk actions over real HTTP: dry runs, operations that cancel or retry every run a filter
matched, their histories, skipped runs, cancelling an operation, bad filters, two
orchestrators."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest

import stepline
from stepline_server.asgi import build_app
from stepline_server.orchestrator import Orchestrator
from stepline_server.store import apps, db, keys, operations
from tests import support
from tests.support import (
    Stack,
    app_server,
    free_port,
    orchestrator_stack,
    serve,
)

SECRET = "secret-bulk"


def bulk_app() -> stepline.Stepline:
    """``breaks`` fails (until ``fixed``; then its step waits for ``gate`` when one is set),
    ``waits`` waits on a callback for a minute."""
    sl = stepline.Stepline(SECRET)
    state: dict[str, Any] = {"fixed": False, "gate": None}
    sl.state = state  # type: ignore[attr-defined]

    @sl.workflow("breaks")
    async def breaks(ctx: stepline.Context, input: Any) -> Any:
        await ctx.step("prepare", lambda: 1)

        async def work() -> str:
            if not state["fixed"]:
                raise stepline.TerminalError("bug in work")
            if state.get("gate") is not None:
                await state["gate"].wait()
            return "ok"

        return await ctx.step("work", work)

    @sl.workflow("waits")
    async def waits(ctx: stepline.Context, input: Any) -> Any:
        cb = await ctx.callback("approval", timeout="1m")
        return await cb.wait()

    return sl


async def until(check: Callable[[], Awaitable[Any]], what: str, timeout: float = 30) -> Any:
    """Poll ``check`` until it answers something true; fail naming ``what`` after ``timeout``."""
    for _ in range(int(timeout / 0.05)):
        value = await check()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def start_ended(stack: Stack, workflow: str, n: int, **kw: Any) -> list[dict[str, Any]]:
    runs = [await stack.client.start_run(workflow, {"i": i}, **kw) for i in range(n)]
    return [await stack.client.wait_run(r["id"], timeout=30) for r in runs]


async def start_waiting(stack: Stack, n: int, prefix: str = "w") -> list[dict[str, Any]]:
    runs = [
        await stack.client.start_run("waits", {"i": i}, run_key=f"{prefix}-{i}") for i in range(n)
    ]

    async def all_waiting() -> bool:
        for r in runs:
            steps = (await stack.client.get_run(r["id"]))["steps"]
            if not any(s["name"] == "approval" and s["status"] == "waiting" for s in steps):
                return False
        return True

    await until(all_waiting, "the runs to wait on their callbacks")
    return runs


async def ended_operation(stack: Stack, op_id: str) -> dict[str, Any]:
    async def ended() -> dict[str, Any] | None:
        op = await stack.client.get_operation(op_id)
        return op if op["status"] != "running" else None

    return await until(ended, f"operation {op_id} to end", 60)  # type: ignore[no-any-return]


async def by_events(stack: Stack, run_id: str, type: str) -> list[Any]:
    """The ``data.by`` of each of the run's history events of ``type``."""
    return [
        (e.get("data") or {}).get("by")
        async for e in stack.client.iter_run_events(run_id)
        if e["type"] == type
    ]


async def test_dry_run_counts_and_samples_and_changes_nothing(database_url: str) -> None:
    """A dry run answers how many runs the action would take and up to 20 of their ids, newest
    first; no run changes and no operation is made."""
    sl = bulk_app()
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        failed = await start_ended(stack, "breaks", 22)
        assert {r["status"] for r in failed} == {"failed"}
        answer = await stack.client.bulk_runs(
            "retry", {"workflow": "breaks", "status": "failed"}, dry_run=True
        )
        assert answer["matched"] == 22
        assert answer["sample"] == [r["id"] for r in reversed(failed)][:20]
        # Cancel takes running runs only: the failed ones match nothing.
        none = await stack.client.bulk_runs("cancel", {"workflow": "breaks"}, dry_run=True)
        assert none == {"matched": 0, "sample": []}
        assert (await stack.client.list_operations())["operations"] == []
        assert {(await stack.client.get_run(r["id"]))["status"] for r in failed} == {"failed"}


async def test_bulk_retry_acts_on_each_run_once_and_names_the_operation(
    database_url: str,
) -> None:
    """A bulk retry of failed runs retries each once through the run's own retry: the run's
    history has one ``run.retried`` with ``data.by = operation:<id>``; the operation completes
    with every run succeeded. The runs and ``stepline_runs_started_total`` say the same
    trigger, ``bulk``, which the run filter takes."""
    sl = bulk_app()
    async with (
        orchestrator_stack(database_url, bulk_batch_size=4) as stack,
        app_server(sl) as url,
    ):
        await stack.register(sl, url)
        failed = await start_ended(stack, "breaks", 10)
        sl.state["fixed"] = True  # type: ignore[attr-defined]
        op = await stack.client.bulk_runs("retry", {"workflow": "breaks", "status": "failed"})
        assert op["status"] == "running" and op["matched"] == 10 and op["action"] == "retry"
        assert op["filter"] == {"workflow": "breaks", "status": "failed"}
        done = await ended_operation(stack, op["id"])
        assert done["status"] == "completed", done
        assert (done["succeeded"], done["failed"], done["skipped"]) == (10, 0, 0)
        assert done["endedAt"] is not None and done["errors"] == []
        for r in failed:
            ended = await stack.client.wait_run(r["id"], timeout=30)
            assert ended["status"] == "completed" and ended["trigger"] == "bulk"
            assert await by_events(stack, r["id"], "run.retried") == [f"operation:{op['id']}"]
            # the run starts again, and that start names the operation too (the first did not)
            assert await by_events(stack, r["id"], "run.started") == [None, f"operation:{op['id']}"]
        async with httpx.AsyncClient() as http:
            metrics = (await http.get(stack.url + "/metrics")).text
        assert 'stepline_runs_started_total{trigger="bulk",workflow="breaks"} 10.0' in metrics
        assert 'stepline_runs_started_total{trigger="retry"' not in metrics
        # the filter takes that trigger (they all completed: a cancel matches none of them)
        by_trigger = await stack.client.bulk_runs("cancel", {"trigger": "bulk"}, dry_run=True)
        assert by_trigger == {"matched": 0, "sample": []}


async def test_bulk_retry_from_step_takes_runs_that_recorded_it(database_url: str) -> None:
    """``retryFromStep`` runs that step and those after it again; it needs ``fromStep``."""
    sl = bulk_app()
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        failed = await start_ended(stack, "breaks", 3)
        sl.state["fixed"] = True  # type: ignore[attr-defined]
        none = await stack.client.bulk_runs(
            "retryFromStep", {"status": ["failed", "timedOut"]}, from_step="nope", dry_run=True
        )
        assert none["matched"] == 0
        op = await stack.client.bulk_runs(
            "retryFromStep", {"workflow": "breaks"}, from_step="prepare"
        )
        assert op["fromStep"] == "prepare" and op["matched"] == 3
        done = await ended_operation(stack, op["id"])
        assert done["succeeded"] == 3
        for r in failed:
            assert (await stack.client.wait_run(r["id"], timeout=30))["status"] == "completed"
            events = [e async for e in stack.client.iter_run_events(r["id"])]
            retried = [e for e in events if e["type"] == "run.retried"]
            assert retried[0]["data"]["fromStep"] == "prepare"


async def test_bulk_cancel_by_run_key_prefix_and_created_window(database_url: str) -> None:
    """A bulk cancel takes the running runs its filter matches (a runKey prefix, a created
    window: createdAfter inclusive, createdBefore exclusive); each gets a ``run.cancelling``
    naming the operation, and the others run on."""
    sl = bulk_app()
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        a = await start_waiting(stack, 3, "a")
        b = await start_waiting(stack, 2, "b")
        first = a[0]["createdAt"]
        window = await stack.client.bulk_runs(
            "cancel", {"createdAfter": first, "createdBefore": a[2]["createdAt"]}, dry_run=True
        )
        assert window["matched"] == 2 and set(window["sample"]) == {a[0]["id"], a[1]["id"]}
        op = await stack.client.bulk_runs("cancel", {"runKey": "a-*", "status": "running"})
        assert op["matched"] == 3
        done = await ended_operation(stack, op["id"])
        assert done["succeeded"] == 3
        for r in a:
            ended = await stack.client.wait_run(r["id"], timeout=30)
            assert ended["status"] == "cancelled"
            assert await by_events(stack, r["id"], "run.cancelling") == [f"operation:{op['id']}"]
        for r in b:
            assert (await stack.client.get_run(r["id"]))["status"] == "running"
        exact = await stack.client.bulk_runs("cancel", {"runKey": "b-1"}, dry_run=True)
        assert exact["sample"] == [b[1]["id"]]


@contextlib.asynccontextmanager
async def idle_stack(database_url: str, **settings: Any) -> AsyncIterator[Stack]:
    """An orchestrator whose loops do not run: the test works its operations' batches itself,
    with the loop's own :meth:`~stepline_server.loops.operations.OperationsLoop.work_once`."""
    port = free_port()
    orch = Orchestrator(support.test_settings(port=port, **settings), database_url, run_loops=False)
    async with serve(build_app(orch), port) as url:
        async with orch.pool.acquire() as conn:
            key = await keys.create_key(conn, "idle")
        async with stepline.AsyncClient(url, api_key=key) as client:
            yield Stack(orch, url, key, client)


async def failed_breaks(database_url: str, n: int) -> list[dict[str, Any]]:
    """``n`` failed runs of ``breaks``, made by an orchestrator that has stopped since."""
    sl = bulk_app()
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        return await start_ended(stack, "breaks", n)


async def test_a_run_that_no_longer_qualifies_is_skipped(database_url: str) -> None:
    """A run retried by hand after the operation fixed its set, before the operation reached
    it, is skipped, not failed; the others are retried."""
    failed = await failed_breaks(database_url, 3)
    async with idle_stack(database_url, bulk_batch_size=10) as idle:
        op = await idle.client.bulk_runs("retry", {"workflow": "breaks"})
        assert op["matched"] == 3
        await idle.client.retry_run(failed[1]["id"])
        await idle.orchestrator.operations.work_once()
        done = await idle.client.get_operation(op["id"])
        assert done["status"] == "completed"
        assert (done["succeeded"], done["skipped"], done["failed"]) == (2, 1, 0), done
        assert await by_events(idle, failed[1]["id"], "run.retried") == [None]
        assert await by_events(idle, failed[0]["id"], "run.retried") == [f"operation:{op['id']}"]


async def test_the_next_batch_waits_while_the_last_ones_runs_are_still_due(
    database_url: str,
) -> None:
    """Runs an operation retried count as ahead of other workflows' runs while they are due
    and no invocation has taken them (counted in the database): with a batch of 4 still due,
    the next batch waits and acts on nothing; once they are taken (leased) they count as being
    invoked, and the batch goes once they are no longer in the dispatcher."""
    failed = await failed_breaks(database_url, 10)
    async with idle_stack(database_url, bulk_batch_size=4) as idle:
        op = await idle.client.bulk_runs("retry", {"workflow": "breaks"})
        loop = idle.orchestrator.operations
        assert (await loop.work_once()).done == 4
        op_id = uuid.UUID(op["id"])
        async with idle.orchestrator.pool.acquire() as conn:
            assert await operations.ahead(conn, op_id, 20) == operations.Ahead(4, 0)
        held = await loop.work_once()
        assert held.held and held.done == 0
        assert (await idle.client.get_operation(op["id"]))["succeeded"] == 4
        retried = [r["id"] for r in failed[:4]]
        conn = await idle.conn()
        try:
            await conn.execute(
                "UPDATE runs SET lease_token = 't', ready_at = now() + interval '1 minute'"
                " WHERE id = ANY ($1::uuid[])",
                retried,
            )
            async with idle.orchestrator.pool.acquire() as c:
                assert await operations.ahead(c, op_id, 20) == operations.Ahead(0, 4)
            assert (await loop.work_once()).held
            await conn.execute(
                "UPDATE runs SET lease_token = NULL, ready_at = NULL WHERE id = ANY ($1::uuid[])",
                retried,
            )
        finally:
            await conn.close()
        assert (await loop.work_once()).done == 4
        assert (await idle.client.get_operation(op["id"]))["succeeded"] == 8


async def test_cancelling_an_operation_stops_it_and_keeps_what_was_done(
    database_url: str,
) -> None:
    """``POST /v1/operations/{id}/cancel`` stops an operation between batches: the runs of the
    batches worked stay retried, the rest stay failed, and an ended operation cannot be
    cancelled again (409)."""
    failed = await failed_breaks(database_url, 5)
    async with idle_stack(database_url, bulk_batch_size=2) as idle:
        op = await idle.client.bulk_runs("retry", {"status": "failed"})
        await idle.orchestrator.operations.work_once()
        cancelled = await idle.client.cancel_operation(op["id"])
        assert cancelled["status"] == "cancelled" and cancelled["endedAt"] is not None
        assert (cancelled["matched"], cancelled["succeeded"]) == (5, 2)
        await idle.orchestrator.operations.work_once()  # finds no running operation
        after = await idle.client.get_operation(op["id"])
        assert after["succeeded"] == 2 and after["status"] == "cancelled"
        statuses = [(await idle.client.get_run(r["id"]))["status"] for r in failed]
        assert statuses == ["running", "running", "failed", "failed", "failed"]
        with pytest.raises(stepline.ApiError) as again:
            await idle.client.cancel_operation(op["id"])
        assert again.value.status == 409 and again.value.code == "invalid_state"


async def test_an_error_acting_on_one_run_is_recorded_and_undoes_that_run_alone(
    database_url: str,
) -> None:
    """When acting on one run raises (here the database refuses to change it), that run counts
    as failed with its error shown by ``GET /v1/operations/{id}``, it is left as it was, and
    the other runs of the batch are retried."""
    failed = await failed_breaks(database_url, 3)
    async with idle_stack(database_url, bulk_batch_size=10) as idle:
        op = await idle.client.bulk_runs("retry", {"workflow": "breaks"})
        conn = await idle.conn()
        try:
            # (On Citus a trigger on a distributed table is made on its shards when allowed;
            # on plain PostgreSQL the setting is a placeholder nothing reads.)
            await conn.execute("SELECT set_config('citus.enable_unsafe_triggers', 'on', false)")
            await conn.execute(
                "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS"
                " $$BEGIN RAISE EXCEPTION 'the disk is on fire'; END$$"
            )
            await conn.execute(
                "CREATE TRIGGER refuse BEFORE UPDATE ON runs FOR EACH ROW"
                f" WHEN (OLD.id = '{failed[1]['id']}') EXECUTE FUNCTION refuse()"
            )
            await idle.orchestrator.operations.work_once()
        finally:
            await conn.close()
        done = await idle.client.get_operation(op["id"])
        assert done["status"] == "completed"
        assert (done["succeeded"], done["failed"], done["skipped"]) == (2, 1, 0), done
        [error] = done["errors"]
        assert error["runId"] == failed[1]["id"] and "the disk is on fire" in error["message"]
        assert (await idle.client.get_run(failed[1]["id"]))["status"] == "failed"
        assert await by_events(idle, failed[1]["id"], "run.retried") == []
        assert (await idle.client.get_run(failed[0]["id"]))["status"] == "running"


async def test_operations_past_retention_are_deleted(database_url: str) -> None:
    """An operation that ended longer ago than runs are kept is deleted with its list of runs;
    a newer one stays."""
    async with idle_stack(database_url, retention_days=30) as idle:
        old = await idle.client.bulk_runs("cancel", {"workflow": "a"})
        new = await idle.client.bulk_runs("cancel", {"workflow": "b"})
        conn = await idle.conn()
        try:
            await conn.execute(
                "UPDATE operations SET created_at = now() - interval '32 days',"
                " ended_at = now() - interval '31 days' WHERE id = $1",
                uuid.UUID(old["id"]),
            )
        finally:
            await conn.close()
        assert await idle.orchestrator.operations.sweep_once() == 1
        listed = (await idle.client.list_operations())["operations"]
        assert [op["id"] for op in listed] == [new["id"]]


async def test_operations_list_is_paginated(database_url: str) -> None:
    """``GET /v1/operations`` lists operations newest first, a page at a time."""
    async with idle_stack(database_url) as idle:
        made = [await idle.client.bulk_runs("cancel", {"workflow": f"w{i}"}) for i in range(3)]
        assert {op["status"] for op in made} == {"completed"}  # nothing matched
        first = await idle.client.list_operations(limit=2)
        assert [op["id"] for op in first["operations"]] == [made[2]["id"], made[1]["id"]]
        rest = await idle.client.list_operations(limit=2, cursor=first["nextCursor"])
        assert [op["id"] for op in rest["operations"]] == [made[0]["id"]]
        assert rest["nextCursor"] is None


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"action": "cancel", "filter": {"status": "sleeping"}}, 422, "filter.status"),
        ({"action": "cancel", "filter": {"status": []}}, 422, "filter.status"),
        ({"action": "cancel", "filter": {"colour": "red"}}, 422, "filter.colour"),
        ({"action": "cancel", "filter": {"trigger": "cron"}}, 422, "filter.trigger"),
        ({"action": "cancel", "filter": {"runKey": "a*b*"}}, 422, "filter.runKey"),
        ({"action": "cancel", "filter": {"createdAfter": "2026-01-01T00:00:00"}}, 422,
         "filter.createdAfter"),
        ({"action": "cancel", "filter": {"createdAfter": "2026-02-01T00:00:00Z",
                                         "createdBefore": "2026-01-01T00:00:00Z"}}, 422,
         "filter.createdBefore"),
        ({"action": "cancel", "filter": {"app": "no-such-app"}}, 422, "filter.app"),
        ({"action": "cancel", "filter": {"createdBefore": "9999-12-31T23:59:59-01:00"}}, 422,
         "filter.createdBefore"),
        ({"action": "explode", "filter": {}}, 422, "action"),
        ({"action": "cancel"}, 422, "filter"),
        ({"action": "retryFromStep", "filter": {}}, 422, "fromStep"),
        ({"action": "retry", "filter": {}, "fromStep": "a"}, 422, "fromStep"),
        ({"action": "retry", "filter": {}, "dryRun": "yes"}, 422, "dryRun"),
    ],
)  # fmt: skip
async def test_bad_bulk_requests_are_refused_and_change_nothing(
    database_url: str, body: dict[str, Any], status: int, field: str
) -> None:
    """A filter that cannot select runs is a 422 naming the field, in the API's error shape;
    no operation is made."""
    async with idle_stack(database_url) as idle:
        async with httpx.AsyncClient(base_url=idle.url) as http:
            answer = await http.post(
                "/v1/runs/bulk", json=body, headers={"Authorization": f"Bearer {idle.api_key}"}
            )
            assert answer.status_code == status, answer.text
            error = answer.json()["error"]
            assert error["code"] == "validation_failed" and field in error["details"]["fields"]
        assert (await idle.client.list_operations())["operations"] == []


async def test_bulk_needs_a_write_key_and_json(database_url: str) -> None:
    """Every bulk request, a dry run included, needs a write key (403 for a read key); a body
    that is not JSON is a 400; an unknown operation is a 404."""
    async with idle_stack(database_url) as idle:
        async with idle.orchestrator.pool.acquire() as conn:
            read_key = await keys.create_key(conn, "reader", role="read")
        async with httpx.AsyncClient(base_url=idle.url) as http:
            dry = {"action": "cancel", "filter": {}, "dryRun": True}
            refused = await http.post(
                "/v1/runs/bulk", json=dry, headers={"Authorization": f"Bearer {read_key}"}
            )
            assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
            auth = {"Authorization": f"Bearer {idle.api_key}"}
            bad = await http.post(
                "/v1/runs/bulk", content=b"{nope", headers=auth | {"content-type": "x"}
            )
            assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
            missing = await http.get(f"/v1/operations/{uuid.uuid4()}", headers=auth)
            assert missing.status_code == 404
            assert (await http.get("/v1/operations/nope", headers=auth)).status_code == 404
            listed = await http.get(
                "/v1/operations", headers={"Authorization": f"Bearer {read_key}"}
            )
            assert listed.status_code == 200


async def test_two_orchestrators_act_on_each_run_once(database_url: str) -> None:
    """Two orchestrators on one database work one operation's batches (each claimed with
    ``SKIP LOCKED``): every run is retried once."""
    sl = bulk_app()
    async with (
        orchestrator_stack(database_url, bulk_batch_size=3, bulk_rest_seconds=0.0) as one,
        orchestrator_stack(database_url, bulk_batch_size=3, bulk_rest_seconds=0.0) as two,
        app_server(sl) as url,
    ):
        await one.register(sl, url)
        failed = await start_ended(one, "breaks", 12)
        op = await two.client.bulk_runs("retry", {"workflow": "breaks"})
        done = await ended_operation(one, op["id"])
        assert done["succeeded"] == 12, done
        for r in failed:
            assert await by_events(one, r["id"], "run.retried") == [f"operation:{op['id']}"]


def _spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        args,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


async def _until_up(url: str, proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
    async with httpx.AsyncClient() as http:
        for _ in range(int(timeout / 0.05)):
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
            try:
                await http.get(url)
                return
            except httpx.HTTPError:
                await asyncio.sleep(0.05)
    raise TimeoutError(url)


@pytest.mark.slow
async def test_operation_resumes_after_orchestrator_sigkill_acting_on_each_run_once(
    database_url: str,
) -> None:
    """An orchestrator process killed with SIGKILL in the middle of a bulk retry: once one is
    started again the operation goes on and completes, and every run was retried exactly once
    (one ``run.retried`` naming the operation in each run's history)."""
    sl = bulk_app()
    port = free_port()
    env = {
        "DATABASE_URL": database_url,
        "STEPLINE_PORT": str(port),
        "STEPLINE_LEASE_SECONDS": "2",
        "STEPLINE_POLL_SECONDS": "0.5",
        "STEPLINE_LOG_LEVEL": "warning",
        "STEPLINE_BULK_BATCH_SIZE": "5",
        "STEPLINE_BULK_REST_SECONDS": "0.3",
    }
    serve_cmd = [sys.executable, "-m", "stepline_server.cli.main", "serve"]
    base = f"http://127.0.0.1:{port}"
    conn = await db.connect(database_url)
    orch = _spawn(serve_cmd, env)
    try:
        await _until_up(base + "/healthz", orch)
        key = await keys.create_key(conn, "crash")
        async with (
            app_server(sl) as app_url,
            stepline.AsyncClient(base, api_key=key) as client,
        ):
            app = await client.create_app("local", app_url)
            await conn.execute(
                "UPDATE apps SET signing_secrets = $1 WHERE id = $2",
                [SECRET],
                uuid.UUID(app["id"]),
            )
            await client.sync_app(app["slug"])
            started = [await client.start_run("breaks", {"i": i}) for i in range(40)]
            for r in started:
                assert (await client.wait_run(r["id"], timeout=30))["status"] == "failed"
            op = await client.bulk_runs("retry", {"workflow": "breaks", "status": "failed"})
            assert op["matched"] == 40

            async def midway() -> bool:
                now = await client.get_operation(op["id"])
                return 0 < now["succeeded"] < now["matched"]

            await until(midway, "the operation to be part done")
            _kill(orch)
            killed_at = (await conn.fetchrow(
                "SELECT succeeded FROM operations WHERE id = $1", uuid.UUID(op["id"])
            ))["succeeded"]  # fmt: skip
            assert 0 < killed_at < 40
            orch = _spawn(serve_cmd, env)
            await _until_up(base + "/healthz", orch)
            stack = Stack(None, base, key, client)  # type: ignore[arg-type]
            done = await ended_operation(stack, op["id"])
            assert done["status"] == "completed"
            assert (done["succeeded"], done["failed"], done["skipped"]) == (40, 0, 0), done
            by = f"operation:{op['id']}"
            rows = await conn.fetch(
                "SELECT run_id, count(*) AS n, count(*) FILTER (WHERE data->>'by' = $1) AS mine"
                " FROM run_events WHERE type = 'run.retried' GROUP BY run_id",
                by,
            )
            assert {r["run_id"] for r in rows} == {uuid.UUID(r["id"]) for r in started}
            assert {(r["n"], r["mine"]) for r in rows} == {(1, 1)}
    finally:
        _kill(orch)
        await conn.close()


@contextlib.asynccontextmanager
async def failed_breaks_in(
    stack: Stack, environment: str, n: int
) -> AsyncIterator[tuple[str, list[str], dict[str, Any]]]:
    """A write key of ``environment``, ``n`` failed runs of ``breaks`` there and the state of
    its app (``bulk_app``, registered in that environment and served until the block ends)."""
    sl = bulk_app()
    async with stack.orchestrator.pool.acquire() as conn:
        env = await keys.find_environment(conn, keys.DEFAULT_PROJECT, environment)
        assert env is not None
        key = await keys.create_key(conn, environment, env["id"])
    async with stepline.AsyncClient(stack.url, api_key=key) as client, app_server(sl) as url:
        async with stack.orchestrator.pool.acquire() as conn:
            app = await apps.create(conn, env["id"], "app", url, SECRET)
            assert app is not None
        await client.sync_app(app["slug"])
        runs = [await client.start_run("breaks", {"i": i}) for i in range(n)]
        ended = [await client.wait_run(r["id"], timeout=30) for r in runs]
        assert {r["status"] for r in ended} == {"failed"}
        yield key, [r["id"] for r in runs], sl.state  # type: ignore[attr-defined]


async def test_an_operation_held_in_one_environment_lets_another_environments_go(
    database_url: str,
) -> None:
    """Operations take turns, environment by environment: once a big bulk retry in one
    environment has worked a batch (and waits for room), the next batch goes to a small one
    created after it in another environment, which completes while the big one has runs left."""
    async with (
        orchestrator_stack(database_url) as maker,
        failed_breaks_in(maker, "production", 6) as (_, big_runs, _),
        failed_breaks_in(maker, "staging", 2) as (staging_key, _, _),
    ):
        pass
    async with (
        idle_stack(database_url, bulk_batch_size=2) as idle,
        stepline.AsyncClient(idle.url, api_key=staging_key) as staging,
    ):
        big = await idle.client.bulk_runs("retry", {"workflow": "breaks"})
        small = await staging.bulk_runs("retry", {"workflow": "breaks"})
        assert (big["matched"], small["matched"]) == (6, 2)
        loop = idle.orchestrator.operations
        assert (await loop.work_once()).done == 2  # the big one's first batch, still due
        await loop.work_once()
        done = await staging.get_operation(small["id"])
        assert (done["status"], done["succeeded"]) == ("completed", 2), done
        still = await idle.client.get_operation(big["id"])
        assert (still["status"], still["succeeded"]) == ("running", 2), still
        assert await by_events(idle, big_runs[2], "run.retried") == []


async def test_operations_of_two_environments_go_side_by_side_on_two_orchestrators(
    database_url: str,
) -> None:
    """A big bulk retry in one environment whose retried runs are held in their invocations
    (so it waits for room), and a small one in another environment created after it: the small
    one completes while the big one has runs left; then a second orchestrator joins, the runs
    are let go, the big one completes, and every run of both was retried exactly once, by its
    operation."""
    settings = {"bulk_batch_size": 2, "bulk_rest_seconds": 0.0}
    async with (
        orchestrator_stack(database_url, **settings) as one,
        failed_breaks_in(one, "production", 12) as (_, big_runs, production),
        failed_breaks_in(one, "staging", 2) as (staging_key, small_runs, staging_app),
        stepline.AsyncClient(one.url, api_key=staging_key) as staging,
    ):
        gate = asyncio.Event()
        production.update(fixed=True, gate=gate)
        staging_app["fixed"] = True
        try:
            big = await one.client.bulk_runs("retry", {"workflow": "breaks"})
            small = await staging.bulk_runs("retry", {"workflow": "breaks"})
            done = await ended_operation(Stack(one.orchestrator, one.url, "", staging), small["id"])
            assert (done["status"], done["succeeded"]) == ("completed", 2), done
            still = await one.client.get_operation(big["id"])
            assert still["status"] == "running" and still["succeeded"] < 12, still
            async with orchestrator_stack(database_url, **settings) as two:
                gate.set()
                finished = await ended_operation(two, big["id"])
        finally:
            gate.set()
        assert (finished["status"], finished["succeeded"]) == ("completed", 12), finished
        conn = await one.conn()
        try:
            rows = await conn.fetch(
                "SELECT run_id, count(*) AS n, min(data->>'by') AS by FROM run_events"
                " WHERE type = 'run.retried' GROUP BY run_id"
            )
        finally:
            await conn.close()
        by = {str(r["run_id"]): (r["n"], r["by"]) for r in rows}
        assert by == {r: (1, f"operation:{big['id']}") for r in big_runs} | {
            r: (1, f"operation:{small['id']}") for r in small_runs
        }
