"""The REST contract: run keys, search, history, auth and every kind of bad input."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

import stepline
from stepline_server.store import keys
from tests.support import Stack, app_server, orchestrator_stack


def make_app() -> stepline.Stepline:
    sl = stepline.Stepline("secret-contract")

    @sl.workflow("echo")
    async def echo(ctx: stepline.Context, input: Any) -> Any:
        return await ctx.step("echo", lambda: input)

    @sl.workflow("other")
    async def other(ctx: stepline.Context, input: Any) -> Any:
        return None

    return sl


async def _raw(stack: Stack, method: str, path: str, **kw: Any) -> httpx.Response:
    headers = {"authorization": f"Bearer {stack.api_key}", **kw.pop("headers", {})}
    async with httpx.AsyncClient(base_url=stack.url) as http:
        return await http.request(method, path, headers=headers, **kw)


def _error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"]["code"] == code, body
    assert body["error"]["message"]
    return body["error"]  # type: ignore[no-any-return]


async def _runs_count(stack: Stack) -> int:
    return len((await stack.client.list_runs(limit=500))["runs"])


async def test_run_key_answers_201_200_409(database_url: str) -> None:
    """A run key starts one run: same workflow and input answer 200, anything else 409."""
    sl = make_app()
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        first = await _raw(
            stack, "POST", "/v1/runs", json={"workflow": "echo", "input": {"a": 1}, "runKey": "k-1"}
        )
        assert first.status_code == 201
        again = await _raw(
            stack, "POST", "/v1/runs", json={"workflow": "echo", "input": {"a": 1}, "runKey": "k-1"}
        )
        assert again.status_code == 200
        assert again.json()["id"] == first.json()["id"]
        conflict = await _raw(
            stack, "POST", "/v1/runs", json={"workflow": "echo", "input": {"a": 2}, "runKey": "k-1"}
        )
        _error(conflict, 409, "run_key_conflict")
        other = await _raw(
            stack,
            "POST",
            "/v1/runs",
            json={"workflow": "other", "input": {"a": 1}, "runKey": "k-1"},
        )
        _error(other, 409, "run_key_conflict")
        assert await _runs_count(stack) == 1
        done = await stack.client.wait_run(first.json()["id"], timeout=20)
        assert done["output"] == {"a": 1}
        assert done["runKey"] == "k-1"


async def test_search_runs_filters_and_paginates(database_url: str) -> None:
    """Runs are searched by workflow, status and run key, newest first, page by page."""
    sl = make_app()
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        ids = [(await stack.client.start_run("echo", i, run_key=f"r{i}"))["id"] for i in range(5)]
        await stack.client.start_run("other", None)
        for run_id in ids:
            await stack.client.wait_run(run_id, timeout=20)
        page = await stack.client.list_runs(workflow="echo", limit=2)
        assert [r["id"] for r in page["runs"]] == ids[::-1][:2]
        assert page["nextCursor"]
        seen = [r["id"] async for r in stack.client.iter_runs(workflow="echo")]
        assert seen == ids[::-1]
        by_key = await stack.client.list_runs(run_key="r3")
        assert [r["id"] for r in by_key["runs"]] == [ids[3]]
        completed = await stack.client.list_runs(status="completed", workflow="echo")
        assert len(completed["runs"]) == 5
        future = await stack.client.list_runs(created_after="2999-01-01T00:00:00Z")
        assert future["runs"] == []


async def test_bad_input_is_refused_and_changes_nothing(database_url: str) -> None:
    """Invalid JSON, wrong types, bad names and keys, big bodies and unknown workflows get
    the error shape of openapi.yaml, and no run is created."""
    sl = make_app()
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        post = "/v1/runs"
        _error(await _raw(stack, "POST", post, content=b"{not json"), 400, "invalid_json")
        _error(await _raw(stack, "POST", post, json=[1, 2]), 422, "validation_failed")
        err = _error(
            await _raw(stack, "POST", post, json={"workflow": 5}), 422, "validation_failed"
        )
        assert "workflow" in err["details"]["fields"]
        _error(
            await _raw(stack, "POST", post, json={"workflow": "bad name!"}),
            422,
            "validation_failed",
        )
        err = _error(
            await _raw(stack, "POST", post, json={"workflow": "echo", "runKey": "no spaces"}),
            422,
            "validation_failed",
        )
        assert "runKey" in err["details"]["fields"]
        _error(await _raw(stack, "POST", post, json={"workflow": "missing"}), 404, "not_found")
        big = {"workflow": "echo", "input": "x" * (1024 * 1024 + 10)}
        _error(await _raw(stack, "POST", post, json=big), 413, "payload_too_large")
        _error(await _raw(stack, "GET", "/v1/runs?limit=0"), 422, "validation_failed")
        _error(await _raw(stack, "GET", "/v1/runs?status=nope"), 422, "validation_failed")
        _error(await _raw(stack, "GET", "/v1/runs?cursor=garbage"), 422, "validation_failed")
        _error(await _raw(stack, "GET", "/v1/runs/not-a-uuid"), 404, "not_found")
        _error(
            await _raw(stack, "POST", "/v1/apps", json={"name": "x", "url": "ftp://x"}),
            422,
            "validation_failed",
        )
        _error(await _raw(stack, "POST", "/v1/events", json={"data": {}}), 422, "validation_failed")
        _error(await _raw(stack, "GET", "/v1/nowhere"), 404, "not_found")
        _error(await _raw(stack, "DELETE", "/v1/runs"), 405, "method_not_allowed")
        assert await _runs_count(stack) == 0
        # The loops are unharmed: a good run still completes.
        run = await stack.client.start_run("echo", "fine")
        assert (await stack.client.wait_run(run["id"], timeout=20))["output"] == "fine"


async def test_api_keys_guard_every_route(database_url: str) -> None:
    """No key or a bad key is 401; another project's run is 404, never revealed."""
    sl = make_app()
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        run = await stack.client.start_run("echo", 1)
        async with httpx.AsyncClient(base_url=stack.url) as http:
            for path in ("/v1/runs", f"/v1/runs/{run['id']}", "/v1/apps", "/v1/workflows"):
                _error(await http.get(path), 401, "unauthorized")
                _error(
                    await http.get(path, headers={"authorization": "Bearer nope"}),
                    401,
                    "unauthorized",
                )
            assert (await http.get("/healthz")).status_code == 200
            assert (await http.get("/readyz")).json() == {"status": "ok"}
            assert "stepline_invocations_inflight" in (await http.get("/metrics")).text
        conn = await stack.conn()
        try:
            other_project = await keys.create_project(conn, "other")
            assert other_project is not None
            other_key = await keys.create_key(conn, "other", other_project["id"])
        finally:
            await conn.close()
        async with stepline.AsyncClient(stack.url, api_key=other_key) as other:
            with pytest.raises(stepline.ApiError) as info:
                await other.get_run(run["id"])
            assert info.value.status == 404 and info.value.code == "not_found"
            assert (await other.list_runs())["runs"] == []


async def test_history_lists_invocations_and_steps_in_order(database_url: str) -> None:
    """The history has each invocation with status, duration and deployment, and each step's
    start and outcome, in seq order."""
    sl = stepline.Stepline("secret-contract", deployment_id="deploy-42")

    @sl.workflow("two")
    async def two(ctx: stepline.Context, input: Any) -> int:
        a = await ctx.step("a", lambda: 1)
        return await ctx.step("b", lambda: a + 1)  # type: ignore[no-any-return]

    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        run = await stack.client.start_run("two", None)
        await stack.client.wait_run(run["id"], timeout=20)
        events = [e async for e in stack.client.iter_run_events(run["id"])]
        got = [(e["type"], e.get("stepName")) for e in events]
        assert got == [
            ("run.started", None),
            ("invocation.started", None),
            ("step.started", "a"),
            ("step.completed", "a"),
            ("step.started", "b"),
            ("step.completed", "b"),
            ("invocation.ended", None),
            ("run.completed", None),
        ]
        ended = events[6]
        assert ended["httpStatus"] == 200 and ended["deploymentId"] == "deploy-42"
        assert ended["durationMs"] >= 0 and ended["invocationId"] == events[1]["invocationId"]
        later = await stack.client.list_run_events(run["id"], after=6)
        assert [e["seq"] for e in later["events"]] == [7, 8]
        async with httpx.AsyncClient(base_url=stack.url) as http:
            metrics = (await http.get("/metrics")).text
        assert 'stepline_invocations_total{outcome="completed"} 1.0' in metrics
        assert 'stepline_runs_started_total{trigger="api",workflow="two"} 1.0' in metrics
        assert "stepline_progress_calls_total 3.0" in metrics  # two calls and the answer
