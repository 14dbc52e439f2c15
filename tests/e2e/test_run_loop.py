"""The run loop end to end: a real orchestrator invoking a real SDK app over HTTP."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import stepline
from tests.support import app_server, hosted, orchestrator_stack


@pytest.fixture(params=["push", "pull"])
def kind(request: pytest.FixtureRequest) -> str:
    """The tests taking it run with the app pushed to (served) and pulled by a worker."""
    return str(request.param)


def make_app(counts: dict[str, int]) -> stepline.Stepline:
    sl = stepline.Stepline("secret-e2e")

    def bump(name: str) -> None:
        counts[name] = counts.get(name, 0) + 1

    @sl.workflow("three-steps")
    async def three(ctx: stepline.Context, input: dict[str, Any]) -> dict[str, Any]:
        def a() -> int:
            bump("a")
            return int(input["x"]) + 1

        async def b(v: int) -> int:
            bump("b")
            return v * 2

        x = await ctx.step("a", a)
        y = await ctx.step("b", b, x)
        z = await ctx.step("c", lambda: (bump("c"), y + 3)[1])
        return {"result": z}

    @sl.workflow("flaky", retries=stepline.Retries(attempts=5, initial_delay="50ms"))
    async def flaky(ctx: stepline.Context, input: Any) -> str:
        def first() -> str:
            bump("first")
            return "ok"

        def shaky() -> str:
            bump("shaky")
            if counts["shaky"] < 3:
                raise RuntimeError("not yet")
            return "done"

        await ctx.step("first", first)
        return await ctx.step("shaky", shaky)

    return sl


async def test_three_step_workflow_completes(database_url: str, kind: str) -> None:
    """A 3-step workflow completes with the right output, each step run once."""
    counts: dict[str, int] = {}
    sl = make_app(counts)
    async with orchestrator_stack(database_url) as stack, hosted(stack, sl, kind):
        run = await stack.client.start_run("three-steps", {"x": 4})
        assert run["status"] == "running"
        done = await stack.client.wait_run(run["id"], timeout=20)
        assert done["status"] == "completed", done
        assert done["output"] == {"result": 13}
        assert [s["name"] for s in done["steps"]] == ["a", "b", "c"]
        assert counts == {"a": 1, "b": 1, "c": 1}
        events = (await stack.client.list_run_events(run["id"]))["events"]
        types = [e["type"] for e in events]
        assert types[0] == "run.started" and types[-1] == "run.completed"
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        ended = [e for e in events if e["type"] == "invocation.ended"]
        assert ended and ended[0].get("httpStatus") == (200 if kind == "push" else None)
        assert "durationMs" in ended[0]


async def test_step_retries_without_rerunning_earlier_steps(database_url: str, kind: str) -> None:
    """A step failing twice then succeeding ran three times; the step before it ran once."""
    counts: dict[str, int] = {}
    sl = make_app(counts)
    async with orchestrator_stack(database_url) as stack, hosted(stack, sl, kind):
        run = await stack.client.start_run("flaky", None)
        done = await stack.client.wait_run(run["id"], timeout=20)
        assert done["status"] == "completed", done
        assert done["output"] == "done"
        assert counts == {"first": 1, "shaky": 3}
        shaky = next(s for s in done["steps"] if s["name"] == "shaky")
        assert shaky["attempt"] == 3
        types = [e["type"] for e in (await stack.client.list_run_events(run["id"]))["events"]]
        assert types.count("step.retrying") == 2


async def test_ten_runs_at_once_all_complete(database_url: str, kind: str) -> None:
    """Ten runs started together all complete with their own outputs."""
    counts: dict[str, int] = {}
    sl = make_app(counts)
    async with orchestrator_stack(database_url) as stack, hosted(stack, sl, kind):
        started = [await stack.client.start_run("three-steps", {"x": i}) for i in range(10)]
        done = await asyncio.gather(*(stack.client.wait_run(r["id"], timeout=30) for r in started))
        assert [d["output"] for d in done] == [{"result": (i + 1) * 2 + 3} for i in range(10)]


async def test_a_full_dispatcher_leaves_new_runs_to_its_claim(database_url: str) -> None:
    """With room for two invocations, six runs started at once are invoked two at a time: the
    first taken as they are created, the rest claimed as room frees. All complete, each step
    once, and no more than two invocations ever run together."""
    counts: dict[str, int] = {}
    now_running = 0
    most = 0
    both = asyncio.Event()
    sl = stepline.Stepline("secret-e2e")

    @sl.workflow("slow")
    async def slow(ctx: stepline.Context, input: int) -> int:
        async def work() -> int:
            nonlocal now_running, most
            counts[f"work-{input}"] = counts.get(f"work-{input}", 0) + 1
            now_running += 1
            most = max(most, now_running)
            if now_running == 2:
                both.set()
            # The first two wait for each other (so two ran at once, as a fact, not a timing);
            # a dispatcher that ran only one at a time would leave the first waiting here.
            await asyncio.wait_for(both.wait(), 10)
            now_running -= 1
            return input * 10

        return await ctx.step("work", work)  # type: ignore[no-any-return]

    async with (
        orchestrator_stack(database_url, max_inflight=2) as stack,
        app_server(sl) as app_url,
    ):
        await stack.register(sl, app_url)
        runs = await asyncio.gather(*(stack.client.start_run("slow", i) for i in range(6)))
        done = await asyncio.gather(*(stack.client.wait_run(r["id"], timeout=30) for r in runs))
        assert [d["output"] for d in done] == [i * 10 for i in range(6)]
        assert counts == {f"work-{i}": 1 for i in range(6)}
        assert most == 2
        for run in runs:
            history = (await stack.client.list_run_events(run["id"]))["events"]
            assert [e["type"] for e in history][:2] == ["run.started", "invocation.started"]
            assert [e["type"] for e in history].count("invocation.started") == 1


async def test_changed_code_fails_the_run_with_nondeterminism(database_url: str) -> None:
    """A deploy renames a step a sleeping run already passed: on replay the run fails with a
    nondeterminism error naming both steps, and nothing after them runs. (A deploy is a new
    process, which keeps no execution across the sleep: so is this app.)"""
    version = {"name": "charge"}
    ran: list[str] = []
    sl = stepline.Stepline("secret-e2e", parked_runs=0)

    @sl.workflow("evolving")
    async def evolving(ctx: stepline.Context, input: Any) -> str:
        await ctx.step(version["name"], lambda: ran.append(version["name"]))
        await ctx.sleep("pause", 0.5)
        await ctx.step("ship", lambda: ran.append("ship"))
        return "done"

    async with orchestrator_stack(database_url) as stack, app_server(sl) as app_url:
        await stack.register(sl, app_url)
        run = await stack.client.start_run("evolving", None)
        while not any(
            s["status"] == "sleeping" for s in (await stack.client.get_run(run["id"]))["steps"]
        ):
            await asyncio.sleep(0.05)
        version["name"] = "charge-card"  # the new deploy
        done = await stack.client.wait_run(run["id"], timeout=20)
        assert done["status"] == "failed", done
        assert done["error"]["code"] == "nondeterminism"
        assert "charge-card" in done["error"]["message"] and "charge" in done["error"]["message"]
        assert ran == ["charge"]


async def test_concurrency_caps_invocations_of_a_workflow(database_url: str, kind: str) -> None:
    """With concurrency=2, eight runs started together never have more than two invocations
    running at once, and all complete; a sleeping run holds no slot."""
    now_running = 0
    most = 0
    pair = asyncio.Event()
    sl = stepline.Stepline("secret-e2e")

    @sl.workflow("capped", concurrency=2)
    async def capped(ctx: stepline.Context, input: int) -> int:
        async def work() -> int:
            nonlocal now_running, most
            now_running += 1
            most = max(most, now_running)
            if now_running == 2:
                pair.set()
            await asyncio.wait_for(pair.wait(), 10)  # the first two run at once, as a fact
            now_running -= 1
            return input

        value = await ctx.step("work", work)
        await ctx.sleep("rest", 0.1)
        return value  # type: ignore[no-any-return]

    async with orchestrator_stack(database_url) as stack, hosted(stack, sl, kind):
        runs = await asyncio.gather(*(stack.client.start_run("capped", i) for i in range(8)))
        done = await asyncio.gather(*(stack.client.wait_run(r["id"], timeout=60) for r in runs))
        assert [d["output"] for d in done] == list(range(8))
        assert most == 2
        workflows = (await stack.client.list_workflows())["workflows"]
        assert next(w for w in workflows if w["name"] == "capped")["options"]["concurrency"] == 2
