"""What a run's history and replay promise end to end: a retry's backoff holds while another
branch moves the run, and failed steps keep their traceback."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import stepline
from tests.support import app_server, orchestrator_stack


async def test_a_retry_backoff_holds_when_another_branch_wakes_the_run(database_url: str) -> None:
    """One gather branch raises RetryableError(retry_after="1h"), the other waits for a
    callback: completing the callback re-invokes the run, but the step's next attempt does not
    run (before, it ran at once); the retrying step stays retrying with its wakeAt an hour out."""
    sl = stepline.Stepline("backoff-secret")
    tries: Counter[str] = Counter()

    @sl.workflow("patient-retry", retries=stepline.Retries(attempts=3))
    async def patient(ctx: stepline.Context, input: Any) -> Any:
        async def flaky() -> str:
            tries["flaky"] += 1
            raise stepline.RetryableError("not yet", retry_after="1h")

        async def waiter() -> Any:
            cb = await ctx.callback("cb")
            await ctx.step("publish", lambda: cb.id)
            return await cb.wait()

        return await asyncio.gather(ctx.step("flaky", flaky), waiter())

    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        run = await stack.client.start_run("patient-retry", None)
        for _ in range(200):
            detail = await stack.client.get_run(run["id"])
            steps = {s["name"]: s for s in detail["steps"]}
            published = steps.get("publish", {}).get("status") == "completed"
            if steps.get("flaky", {}).get("status") == "retrying" and published:
                break
            await asyncio.sleep(0.05)
        await stack.client.complete_callback(steps["publish"]["output"], {"ok": True})
        for _ in range(200):
            events = [e async for e in stack.client.iter_run_events(run["id"])]
            if sum(e["type"] == "invocation.ended" for e in events) >= 2:
                break
            await asyncio.sleep(0.05)
        detail = await stack.client.get_run(run["id"])
    flaky = {s["name"]: s for s in detail["steps"]}["flaky"]
    assert tries["flaky"] == 1, tries
    assert flaky["status"] == "retrying" and flaky["attempt"] == 1
    assert detail["status"] == "running"


async def test_a_failed_step_keeps_its_traceback(database_url: str) -> None:
    """A step that raises for good: GET /v1/runs/{id} shows the step's and the run's error with
    the Python traceback naming the function that raised."""
    sl = stepline.Stepline("traceback-secret")

    @sl.workflow("breaks", retries=stepline.Retries(attempts=1))
    async def breaks(ctx: stepline.Context, input: Any) -> None:
        def explode_here() -> None:
            raise ValueError("boom")

        await ctx.step("explode", explode_here)

    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        run = await stack.client.start_run("breaks", None)
        done = await stack.client.wait_run(run["id"], timeout=30)
    assert done["status"] == "failed"
    [step] = done["steps"]
    assert step["status"] == "failed" and "explode_here" in step["error"]["traceback"]
    assert "ValueError: boom" in step["error"]["traceback"]
    assert "explode_here" in done["error"]["traceback"]
    assert done["deploymentId"].startswith("code-")
