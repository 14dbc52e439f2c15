"""Delivery: an app that is away delays its runs and fails none; only when the delivery window
is spent does a run fail, with app_unreachable. Time limits hold while an invocation runs."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import httpx

import stepline
from tests.support import app_server, free_port, orchestrator_stack


async def test_a_redeploy_delays_runs_and_fails_none(database_url: str) -> None:
    """With the app down for a few seconds, runs that came due meanwhile complete once it is
    back, without using the workflow's retries (one attempt allowed); each failed delivery is
    in the history with the reason."""
    sl = stepline.Stepline("redeploy-secret")
    ran: Counter[str] = Counter()

    @sl.workflow("steady", retries=stepline.Retries(attempts=1))
    async def steady(ctx: stepline.Context, input: Any) -> Any:
        async def work(n: int) -> int:
            ran[f"{input['n']}"] += 1
            return n * 2

        return await ctx.step("double", work, input["n"])

    port = free_port()
    async with orchestrator_stack(database_url) as stack:
        async with app_server(sl, port) as url:
            await stack.register(sl, url)
        started = [await stack.client.start_run("steady", {"n": n}) for n in range(5)]
        await asyncio.sleep(2.5)  # the app is away (a redeploy)
        async with app_server(sl, port):
            done = [await stack.client.wait_run(r["id"], timeout=30) for r in started]
        assert [d["status"] for d in done] == ["completed"] * 5, done
        assert [d["output"] for d in done] == [n * 2 for n in range(5)]
        assert all(count == 1 for count in ran.values()) and len(ran) == 5
        events = [e async for e in stack.client.iter_run_events(started[0]["id"])]
        failed = [
            e
            for e in events
            if e["type"] == "invocation.ended" and e["data"]["outcome"] == "delivery_failed"
        ]
        assert failed and all("could not reach the app" in e["data"]["error"] for e in failed)
        assert events[-1]["type"] == "run.completed"


async def test_a_time_limit_holds_while_an_invocation_runs(database_url: str) -> None:
    """timeout="1s" and steps of 0.4 s: the run ends timedOut about a second in, no step
    starts after the deadline, and the invocation in flight cannot complete it."""
    sl = stepline.Stepline("deadline-secret")
    started: list[int] = []

    @sl.workflow("slow", timeout="1s")
    async def slow(ctx: stepline.Context, input: Any) -> str:
        for n in range(6):

            async def work(n: int = n) -> int:
                started.append(n)
                await asyncio.sleep(0.4)
                return n

            await ctx.step(f"s{n}", work)
        return "done"

    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        run = await stack.client.start_run("slow", None)
        done = await stack.client.wait_run(run["id"], timeout=30)
        assert done["status"] == "timedOut", done
        assert len(started) <= 3, started
        await asyncio.sleep(0.5)  # the step in flight ends: it records nothing
        after = await stack.client.get_run(run["id"])
        assert after["status"] == "timedOut" and after["output"] is None
        assert len(started) <= 3, started


async def test_a_workflow_sets_its_own_delivery_window(database_url: str) -> None:
    """delivery_window="1500ms" on the workflow: registered by sync, and its runs fail
    app_unreachable once the app has been away that long, while the orchestrator's default
    window is a day."""
    sl = stepline.Stepline("window-secret")

    @sl.workflow("impatient", delivery_window="1500ms")
    async def impatient(ctx: stepline.Context, input: Any) -> Any:
        return input

    port = free_port()
    async with orchestrator_stack(database_url) as stack:
        async with app_server(sl, port) as url:
            await stack.register(sl, url)
        [wf] = (await stack.client.list_workflows())["workflows"]
        assert wf["options"]["deliveryWindowMs"] == 1500
        run = await stack.client.start_run("impatient", 1)
        done = await stack.client.wait_run(run["id"], timeout=30)
    assert done["status"] == "failed" and done["error"]["code"] == "app_unreachable", done


async def test_a_runs_invocations_and_counters_tell_its_deliveries(database_url: str) -> None:
    """GET /v1/runs/{id}/invocations lists each invocation with its outcome, status and
    reason; the run counts its invocations, failed deliveries and completed steps."""
    sl = stepline.Stepline("invocations-secret")

    @sl.workflow("counted")
    async def counted(ctx: stepline.Context, input: Any) -> Any:
        await ctx.step("a", lambda: 1)
        await ctx.sleep("nap", "10ms")
        return await ctx.step("b", lambda: 2)

    port = free_port()
    async with orchestrator_stack(database_url) as stack:
        async with app_server(sl, port) as url:
            await stack.register(sl, url)
        run = await stack.client.start_run("counted", None)
        await asyncio.sleep(0.5)  # one delivery fails while the app is away
        async with app_server(sl, port):
            done = await stack.client.wait_run(run["id"], timeout=30)
        async with httpx.AsyncClient(base_url=stack.url) as http:
            answer = await http.get(
                f"/v1/runs/{run['id']}/invocations",
                headers={"authorization": f"Bearer {stack.api_key}"},
            )
    assert answer.status_code == 200
    invocations = answer.json()["invocations"]
    outcomes = [i["outcome"] for i in invocations]
    assert outcomes[0] == "delivery_failed" and outcomes[-2:] == ["suspended", "completed"]
    assert "could not reach the app" in invocations[0]["response"]
    assert invocations[-1]["httpStatus"] == 200 and invocations[-1]["response"] is None
    assert done["invocations"] == len(invocations)
    assert done["deliveryFailures"] == outcomes.count("delivery_failed")
    assert done["stepsCompleted"] == 3
