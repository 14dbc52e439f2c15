"""Pausing a workflow or an app: runs are still started and woken, none is invoked while paused
(on any orchestrator), and resuming lets them go in their usual order."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

import stepline
from tests.support import Stack, app_server, orchestrator_stack, until


def build(order: list[str]) -> stepline.Stepline:
    sl = stepline.Stepline("secret-pause")

    @sl.workflow("work")
    async def work(ctx: stepline.Context, input: dict[str, Any]) -> Any:
        await ctx.step("do", lambda: order.append(input["tag"]))
        if input.get("wait"):
            return await (await ctx.callback("go", timeout="1m")).wait()
        return input["tag"]

    @sl.workflow("other")
    async def other(ctx: stepline.Context, input: Any) -> Any:
        return await ctx.step("do", lambda: order.append("other"))

    return sl


async def invocations(stack: Stack, run_id: str) -> int:
    events = [e async for e in stack.client.iter_run_events(run_id)]
    return sum(e["type"] == "invocation.started" for e in events)


async def test_a_paused_workflow_runs_nothing_until_resumed_then_goes_in_order(
    database_url: str,
) -> None:
    """Paused (on one orchestrator), the workflow's runs are started on another and never
    invoked while a run of another workflow completes on both; a callback for a paused run is
    accepted and recorded. Resumed, the runs go higher priority first, then oldest, and the
    callback's body reaches its run. Pausing twice and resuming twice change nothing more."""
    order: list[str] = []
    sl = build(order)
    async with (
        orchestrator_stack(database_url) as one,
        orchestrator_stack(database_url) as two,
        app_server(sl) as url,
    ):
        await one.register(sl, url)
        waiting = await two.client.start_run("work", {"tag": "waiting", "wait": True})
        await until(lambda: _callback(two, waiting["id"]), "the callback")
        paused = await one.client.pause_workflow("work")
        assert paused["paused"] and paused["pausedAt"] is not None
        again = await one.client.pause_workflow("work")
        assert again["pausedAt"] == paused["pausedAt"]
        listed = {w["name"]: w for w in (await two.client.list_workflows())["workflows"]}
        assert listed["work"]["paused"] and not listed["other"]["paused"]

        first = await two.client.start_run("work", {"tag": "first"})
        second = await one.client.start_run("work", {"tag": "second"})
        urgent = await two.client.start_run("work", {"tag": "urgent"}, priority=5)
        await two.client.complete_callback(await _callback(two, waiting["id"]), "body")
        for stack in (one, two):
            done = await stack.client.start_run("other", None)
            assert (await stack.client.wait_run(done["id"], timeout=20))["status"] == "completed"
        assert order == ["waiting", "other", "other"]
        for run in (first, second, urgent, waiting):
            shown = await one.client.get_run(run["id"])
            assert shown["status"] == "running" and shown["paused"], shown
        assert await invocations(one, first["id"]) == 0
        cb = (await one.client.get_run(waiting["id"]))["steps"][1]
        assert cb["status"] == "completed"

        resumed = await two.client.resume_workflow("work")
        assert not resumed["paused"] and resumed["pausedAt"] is None
        assert not (await two.client.resume_workflow("work"))["paused"]
        ended = [await one.client.wait_run(r["id"], timeout=20) for r in (first, second, urgent)]
        assert [r["status"] for r in ended] == ["completed"] * 3
        assert (await one.client.wait_run(waiting["id"], timeout=20))["output"] == "body"
        assert sorted(order[3:6]) == ["first", "second", "urgent"], order
        # The usual order is the claims': higher priority first, then oldest (two orchestrators
        # run what they claimed at once, so the steps' own order is not it).
        started = [r["startedAt"] for r in ended]
        assert started[2] <= started[0] <= started[1], started
        assert not (await one.client.get_run(first["id"]))["paused"]


async def test_a_paused_app_runs_nothing_and_the_routes_answer_errors(database_url: str) -> None:
    """Pausing an app holds every run of its workflows; resuming lets them go. An unknown
    workflow or app is 404, and a read key may not pause (403)."""
    order: list[str] = []
    sl = build(order)
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        slug = await stack.register(sl, url)
        app = await stack.client.pause_app(slug)
        assert app["paused"]
        held = await stack.client.start_run("other", None)
        probe = await stack.client.start_run("work", {"tag": "probe"})
        await asyncio.sleep(0)  # both are due now; nothing may invoke them
        assert (await stack.client.get_run(held["id"]))["paused"]
        assert (await stack.client.resume_app(slug))["paused"] is False
        done = await stack.client.wait_run(held["id"], timeout=20)
        assert done["status"] == "completed"
        assert (await stack.client.wait_run(probe["id"], timeout=20))["status"] == "completed"
        async with httpx.AsyncClient(base_url=stack.url, timeout=10) as http:
            auth = {"Authorization": f"Bearer {stack.api_key}"}
            for path in ("/v1/workflows/nope/pause", "/v1/apps/nope/resume"):
                answer = await http.post(path, headers=auth)
                assert answer.status_code == 404, answer.text
                assert answer.json()["error"]["code"] == "not_found"
            made = await http.post("/v1/keys", headers=auth, json={"name": "r", "role": "read"})
            read_key = made.json()["key"]
            answer = await http.post(
                "/v1/workflows/work/pause", headers={"Authorization": f"Bearer {read_key}"}
            )
            assert answer.status_code == 403, answer.text
        assert not (await stack.client.list_workflows())["workflows"][0]["paused"]


async def _callback(stack: Stack, run_id: str) -> str | None:
    run = await stack.client.get_run(run_id)
    for step in run["steps"]:
        if step["name"] == "go" and step["status"] == "waiting":
            return str(step["callbackId"])
    return None
