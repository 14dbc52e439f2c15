"""The run state machine end to end: what a lease, a wake-up and a resumed execution carry, with
a real orchestrator invoking a real SDK app over HTTP."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

import stepline
from stepline_server.loops import repair
from tests.support import Stack, app_server, orchestrator_stack, until


async def step_status(stack: Stack, run_id: str, name: str) -> str | None:
    run = await stack.client.get_run(run_id)
    return next((s["status"] for s in run["steps"] if s["name"] == name), None)


async def callback_id(stack: Stack, run_id: str, name: str) -> str:
    run = await stack.client.get_run(run_id)
    return str(next(s["callbackId"] for s in run["steps"] if s["name"] == name))


async def test_a_parked_run_sees_a_callback_completed_while_it_slept(database_url: str) -> None:
    """A run parked on a sleep whose callback is completed while it sleeps, and whose sleep end
    comes in the same invocation (it was held by its concurrency cap meanwhile), goes on with
    the callback's body: the resumed execution adopts every change the invocation brings."""
    sl = stepline.Stepline("secret-sm")
    release = asyncio.Event()
    notified: list[str] = []

    @sl.workflow("capped", concurrency=stepline.Concurrency(limit=1))
    async def capped(ctx: stepline.Context, input: dict[str, Any]) -> Any:
        if input["role"] == "blocker":
            await ctx.step("hold", release.wait)
            return "blocker done"
        cb = await ctx.callback("approval", timeout="1m")
        await ctx.step("notify", lambda: notified.append(cb.id))
        await ctx.sleep("nap", "400ms")
        return {"approved": await cb.wait()}

    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        waiter = await stack.client.start_run("capped", {"role": "waiter"})
        rid = waiter["id"]
        await until(lambda: _is(step_status(stack, rid, "nap"), "sleeping"), "the nap")
        await until(lambda: asyncio.sleep(0, len(sl.parked)), "the parked execution")
        blocker = await stack.client.start_run("capped", {"role": "blocker"})
        await until(lambda: _is(step_status(stack, blocker["id"], "hold"), "running"), "hold")
        await stack.client.complete_callback(await callback_id(stack, rid, "approval"), "yes")
        await asyncio.sleep(0.6)  # the nap ends while the cap holds the run
        release.set()
        done = await stack.client.wait_run(rid, timeout=20)
        assert done["status"] == "completed", done
        assert done["output"] == {"approved": "yes"}
        assert (await stack.client.wait_run(blocker["id"], timeout=20))["status"] == "completed"
        assert len(notified) == 1


async def test_a_callbacks_fast_path_invokes_the_runs_generation(database_url: str) -> None:
    """A run continued as new whose callback is completed on the orchestrator that leases it at
    once is invoked as its current generation: the child it starts then is the new
    generation's, not the previous one's."""
    sl = stepline.Stepline("secret-sm")

    @sl.workflow("echo")
    async def echo(ctx: stepline.Context, input: Any) -> Any:
        return input

    @sl.workflow("gens")
    async def gens(ctx: stepline.Context, input: dict[str, int]) -> Any:
        cb = await ctx.callback("go", timeout="1m")
        await cb.wait()
        child = await ctx.invoke("child", "echo", {"generation": ctx.generation})
        if input["n"] == 1:
            ctx.continue_as_new({"n": 2})
        return {"generation": ctx.generation, "child": child}

    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        run = await stack.client.start_run("gens", {"n": 1})
        for generation in (1, 2):
            got = await until(_generation_waits(stack, run["id"], generation), "the wait")
            await stack.client.complete_callback(got, {"generation": generation})
        done = await stack.client.wait_run(run["id"], timeout=20)
    assert done["status"] == "completed", done
    assert done["output"] == {"generation": 2, "child": {"generation": 2}}


async def _is(status: Awaitable[str | None], wanted: str) -> bool:
    return await status == wanted


def _generation_waits(
    stack: Stack, run_id: str, generation: int
) -> Callable[[], Awaitable[str | None]]:
    """A probe: the id of the callback generation ``generation`` of the run waits on."""

    async def probe() -> str | None:
        run = await stack.client.get_run(run_id)
        if run["generation"] != generation:
            return None
        for s in run["steps"]:
            if s["name"] == "go" and s["status"] == "waiting":
                return str(s["callbackId"])
        return None

    return probe


async def test_deleting_an_app_fails_the_parents_waiting_on_its_children(database_url: str) -> None:
    """A run of one app waiting on a child run of another app is not left waiting when that
    app is deleted with its runs: the invoke step fails with ``child_deleted`` and the parent
    goes on (here it ends failed with that error)."""
    parents, children = stepline.Stepline("secret-parents"), stepline.Stepline("secret-children")

    @parents.workflow("parent")
    async def parent(ctx: stepline.Context, input: Any) -> Any:
        return await ctx.invoke("child", "forever", None)

    @children.workflow("forever")
    async def forever(ctx: stepline.Context, input: Any) -> Any:
        return await (await ctx.callback("never", timeout="1h")).wait()

    async with (
        orchestrator_stack(database_url) as stack,
        app_server(parents) as parents_url,
        app_server(children) as children_url,
    ):
        await stack.register(parents, parents_url, "parents")
        slug = await stack.register(children, children_url, "children")
        run = await stack.client.start_run("parent", None)
        await until(lambda: _is(step_status(stack, run["id"], "child"), "waiting"), "the child")
        child_id = next(s["childRunId"] for s in (await stack.client.get_run(run["id"]))["steps"])
        await until(lambda: _is(step_status(stack, child_id, "never"), "waiting"), "its wait")
        await stack.client.delete_app(slug)
        done = await stack.client.wait_run(run["id"], timeout=20)
    assert done["status"] == "failed", done
    [step] = done["steps"]
    assert step["status"] == "failed" and step["error"]["code"] == "child_deleted"


async def test_a_retry_whose_singleton_key_is_taken_answers_409(database_url: str) -> None:
    """Retrying a failed run while another run of its singleton key has not ended answers 409
    (invalid_state) and changes nothing; once that run ends, the retry goes."""
    sl = stepline.Stepline("secret-singleton")
    release = asyncio.Event()

    @sl.workflow("one-per-user", singleton_key="userId")
    async def one(ctx: stepline.Context, input: dict[str, Any]) -> Any:
        if input.get("fail"):
            raise stepline.TerminalError("no")
        await ctx.step("hold", release.wait)
        return "held"

    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        failed = await stack.client.start_run("one-per-user", {"userId": "u", "fail": True})
        assert (await stack.client.wait_run(failed["id"], timeout=20))["status"] == "failed"
        active = await stack.client.start_run("one-per-user", {"userId": "u"})
        assert active["id"] != failed["id"]
        try:
            await stack.client.retry_run(failed["id"])
        except stepline.ApiError as exc:
            assert exc.status == 409 and exc.code == "invalid_state", exc
            assert str(active["id"]) in str(exc)
        else:
            raise AssertionError("the retry was accepted")
        assert (await stack.client.get_run(failed["id"]))["status"] == "failed"
        release.set()
        assert (await stack.client.wait_run(active["id"], timeout=20))["status"] == "completed"
        retried = await stack.client.retry_run(failed["id"])
        assert retried["status"] == "running"


async def test_a_run_left_without_a_way_forward_is_found_and_invoked_again(
    database_url: str,
) -> None:
    """A run made stuck by hand (its callback's step completed behind the orchestrator's back:
    no lease, no due time, no open wait) is found by the way-forward check, invoked again,
    counted in stepline_runs_repaired_total and named in its history; runs with a way forward
    (one waiting on a callback) are left alone."""
    sl = stepline.Stepline("secret-repair")

    @sl.workflow("waits")
    async def waits(ctx: stepline.Context, input: Any) -> Any:
        return await (await ctx.callback("cb")).wait()

    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        stuck = await stack.client.start_run("waits", None)
        fine = await stack.client.start_run("waits", None)
        for run in (stuck, fine):
            await until(lambda r=run: _is(step_status(stack, r["id"], "cb"), "waiting"), "cb")
        conn = await stack.conn()
        try:
            await conn.execute(
                "UPDATE steps SET status = 'completed', output = '\"by hand\"' WHERE run_id = $1",
                uuid.UUID(stuck["id"]),
            )
        finally:
            await conn.close()
        o = stack.orchestrator
        repaired = await repair.check_once(o.pool, o.metrics)
        assert [str(r["id"]) for r in repaired] == [stuck["id"]]
        done = await stack.client.wait_run(stuck["id"], timeout=20)
        assert done["status"] == "completed" and done["output"] == "by hand"
        assert await repair.check_once(o.pool, o.metrics) == []
        assert (await stack.client.get_run(fine["id"]))["status"] == "running"
        types = [e["type"] async for e in stack.client.iter_run_events(stuck["id"])]
        assert "run.repaired" in types
        async with httpx.AsyncClient() as http:
            text = (await http.get(stack.url + "/metrics")).text
        assert 'stepline_runs_repaired_total{workflow="waits"} 1.0' in text


async def test_a_start_with_a_run_key_still_names_the_run_after_it_continued_as_new(
    database_url: str,
) -> None:
    """Found by the model test: the same start (run key and input) sent again after the run
    continued as new answers that run (200), not a run-key conflict; another input still
    conflicts."""
    sl = stepline.Stepline("secret-key-gen")

    @sl.workflow("renews")
    async def renews(ctx: stepline.Context, input: dict[str, int]) -> Any:
        if input["n"] < 2:
            ctx.continue_as_new({"n": input["n"] + 1})
        return (await (await ctx.callback("hold")).wait(), ctx.generation)

    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        first = await stack.client.start_run("renews", {"n": 1}, run_key="renewing-1")
        await until(lambda: _is(step_status(stack, first["id"], "hold"), "waiting"), "gen 2")
        again = await stack.client.start_run("renews", {"n": 1}, run_key="renewing-1")
        assert again["id"] == first["id"] and again["generation"] == 2
        try:
            await stack.client.start_run("renews", {"n": 5}, run_key="renewing-1")
        except stepline.ApiError as exc:
            assert exc.status == 409 and exc.code == "run_key_conflict"
        else:
            raise AssertionError("another input was accepted under the run key")
