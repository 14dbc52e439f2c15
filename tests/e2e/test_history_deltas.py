"""Invocations carry what changed: a long loop of steps and sleeps sends each invocation only the
steps written since the last one, an app that kept nothing fetches the whole history, results
the workflow changes never change what replay sees, and pull apps get the same."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

import stepline
from stepline._transport import Transport
from stepline.protocol import InvokeRequest
from tests.support import orchestrator_stack, serve, until, worker

ITERATIONS = 30


class Seen:
    """ASGI wrapper noting, for each invoke request, how many steps it carried and its base."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.invocations: list[tuple[int, str | None]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        payload = json.loads(body)
        if payload.get("kind") == "invoke":
            request = InvokeRequest.model_validate(payload)
            self.invocations.append((len(request.steps), request.history_base))
        sent = False

        async def replay() -> Any:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class CountingHistories(Transport):
    """The SDK's transport, counting the whole histories it fetched."""

    def __init__(self) -> None:
        super().__init__()
        self.histories = 0

    async def _get(self, url: str, headers: dict[str, str]) -> tuple[int, bytes]:
        if "/steps?" in url:
            self.histories += 1
        return await super()._get(url, headers)


def looping_app(ran: dict[str, int], **options: Any) -> stepline.Stepline:
    sl = stepline.Stepline("secret-deltas", **options)

    def work(i: int) -> dict[str, list[int]]:
        ran[f"w{i}"] = ran.get(f"w{i}", 0) + 1
        return {"seen": [i]}

    @sl.workflow("loop")
    async def loop(ctx: stepline.Context, input: int) -> int:
        total = 0
        for i in range(input):
            ran["passes"] = ran.get("passes", 0) + 1  # the loop's code, replayed or not
            got = await ctx.step(f"w{i}", work, i)
            got["seen"].append(-1)  # the workflow changes what it got: replay must not see it
            total += sum(got["seen"]) + 1
            await ctx.sleep(f"nap{i}", "5ms")
        return total

    return sl


async def test_a_loop_of_steps_and_sleeps_sends_only_what_changed(database_url: str) -> None:
    """Thirty iterations of a step and a sleep: the run completes with the right total, each
    step ran once, the first invocation carries the whole (empty) history and every later one
    only the step and sleep of the iteration before, laid over the history the app kept (no
    history is fetched)."""
    ran: dict[str, int] = {}
    sl = looping_app(ran)
    transport = CountingHistories()
    sl.runtime.transport = transport
    seen = Seen(sl.asgi())
    async with orchestrator_stack(database_url) as stack, serve(seen) as app_url:
        await stack.register(sl, app_url + "/")
        run = await stack.client.start_run("loop", ITERATIONS)
        done = await stack.client.wait_run(run["id"], timeout=60)
        invocations = [i async for i in stack.client.iter_run_invocations(run["id"])]
        page = await stack.client.list_run_invocations(run["id"], limit=5)
    assert done["status"] == "completed", done["error"]
    assert done["output"] == sum(range(ITERATIONS))
    assert ran.pop("passes") == ITERATIONS  # kept running across each sleep: never replayed
    assert ran == {f"w{i}": 1 for i in range(ITERATIONS)}
    assert sl.parked.resumed == ITERATIONS and len(sl.parked) == 0
    assert len(done["steps"]) == 2 * ITERATIONS
    outcomes = [i["outcome"] for i in invocations]
    assert outcomes == ["suspended"] * ITERATIONS + ["completed"]
    assert len(page["invocations"]) == 5 and page["nextCursor"]
    assert len(seen.invocations) == ITERATIONS + 1
    first, *later = seen.invocations
    assert first == (0, None)
    assert all(base is not None for _, base in later)
    # The step and sleep of the iteration before, and the sleep before it, settled as the
    # invocation began (written after its snapshot).
    assert max(steps for steps, _ in later) <= 3, seen.invocations
    assert transport.histories == 0
    assert len(sl.histories) == 0  # the run ended: its history is not kept


async def test_an_app_that_kept_no_history_fetches_it_whole(database_url: str) -> None:
    """The same loop in an app that keeps no history (as after a restart, or on another
    instance): each invocation that builds on an earlier one fetches the whole history once,
    and the run completes exactly as it does with the history kept."""
    ran: dict[str, int] = {}
    sl = looping_app(ran, history_cache_bytes=0)
    transport = CountingHistories()
    sl.runtime.transport = transport
    seen = Seen(sl.asgi())
    async with orchestrator_stack(database_url) as stack, serve(seen) as app_url:
        await stack.register(sl, app_url + "/")
        run = await stack.client.start_run("loop", 10)
        done = await stack.client.wait_run(run["id"], timeout=60)
    assert done["status"] == "completed", done["error"]
    assert done["output"] == sum(range(10))
    ran.pop("passes")
    assert ran == {f"w{i}": 1 for i in range(10)}
    assert transport.histories == 10  # every invocation but the first
    assert sum(1 for _, base in seen.invocations if base is not None) == 10


async def test_a_retried_run_gets_its_whole_history_again(database_url: str) -> None:
    """A run that failed is retried from a step: the steps from there are removed, so the
    invocation after the retry carries the whole history (no base), and the run completes."""
    sl = stepline.Stepline("secret-deltas")
    attempts = {"flaky": 0}

    def flaky() -> str:
        attempts["flaky"] += 1
        if attempts["flaky"] == 1:
            raise stepline.TerminalError("not yet")
        return "ok"

    @sl.workflow("retried")
    async def retried(ctx: stepline.Context, input: Any) -> str:
        await ctx.step("first", lambda: 1)
        await ctx.sleep("nap", "5ms")
        return str(await ctx.step("flaky", flaky))

    seen = Seen(sl.asgi())
    async with orchestrator_stack(database_url) as stack, serve(seen) as app_url:
        await stack.register(sl, app_url + "/")
        run = await stack.client.start_run("retried", None)
        failed = await stack.client.wait_run(run["id"], timeout=30)
        assert failed["status"] == "failed"
        before = len(seen.invocations)
        await stack.client.retry_run(run["id"], from_step="flaky")
        done = await stack.client.wait_run(run["id"], timeout=30)
    assert done["status"] == "completed", done["error"]
    assert done["output"] == "ok"
    assert seen.invocations[before] == (2, None)  # "first" and "nap", whole


async def test_a_pull_worker_lays_changes_over_its_history(database_url: str) -> None:
    """A pull app's worker runs the loop too: its polls bring only what changed, the run
    completes, each step ran once and no history is fetched."""
    ran: dict[str, int] = {}
    sl = looping_app(ran)
    transport = CountingHistories()
    sl.runtime.transport = transport
    async with orchestrator_stack(database_url) as stack:
        slug = await stack.register_pull("deltas")
        async with worker(stack, sl, slug):
            run = await stack.client.start_run("loop", 12)
            done = await stack.client.wait_run(run["id"], timeout=60)
    assert done["status"] == "completed", done["error"]
    assert done["output"] == sum(range(12))
    assert ran.pop("passes") == 12
    assert ran == {f"w{i}": 1 for i in range(12)}
    assert transport.histories == 0


async def test_a_pull_worker_reads_large_results_and_continues_as_new(database_url: str) -> None:
    """On a pull app, a 300 KB result comes by reference and is read back whole after a sleep,
    and continue_as_new starts each next generation: three generations complete under one run
    id, each step ran once."""
    sl = stepline.Stepline("secret-deltas")
    ran: list[int] = []

    def big(generation: int) -> str:
        ran.append(generation)
        return str(generation) * (300 * 1024)

    @sl.workflow("gens")
    async def gens(ctx: stepline.Context, input: dict[str, int]) -> dict[str, int]:
        got = await ctx.step("big", big, ctx.generation)
        await ctx.sleep("nap", "5ms")
        size = input["size"] + len(got)
        if ctx.generation < 3:
            ctx.continue_as_new({"size": size})
        return {"size": size, "generation": ctx.generation}

    async with orchestrator_stack(database_url) as stack:
        slug = await stack.register_pull("gens")
        async with worker(stack, sl, slug):
            run = await stack.client.start_run("gens", {"size": 0})
            done = await stack.client.wait_run(run["id"], timeout=60)
    assert done["status"] == "completed", done["error"]
    assert done["output"] == {"size": 3 * 300 * 1024, "generation": 3}
    assert ran == [1, 2, 3]
    assert done["generation"] == 3


async def test_without_parking_every_invocation_replays(database_url: str) -> None:
    """An app that keeps no execution across sleeps replays the loop from the top at each
    invocation (the loop's code runs 1 + 2 + ... + 11 times) and ends the same."""
    ran: dict[str, int] = {}
    sl = looping_app(ran, parked_runs=0)
    async with orchestrator_stack(database_url) as stack, serve(sl.asgi()) as app_url:
        await stack.register(sl, app_url + "/")
        run = await stack.client.start_run("loop", 10)
        done = await stack.client.wait_run(run["id"], timeout=60)
    assert done["status"] == "completed", done["error"]
    assert done["output"] == sum(range(10))
    assert ran.pop("passes") == sum(range(1, 11)) + 10
    assert ran == {f"w{i}": 1 for i in range(10)}
    assert sl.parked.resumed == 0


class LosesAnAnswer:
    """ASGI wrapper that runs the app's third invocation but answers 503 in place of its
    answer (lost on the way, as far as the orchestrator knows)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.invocations = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        self.invocations += 1
        if self.invocations != 3:
            await self.app(scope, receive, send)
            return

        async def swallow(message: Any) -> None:
            pass

        await self.app(scope, receive, swallow)
        body = b'{"error": {"code": "unavailable", "message": "lost"}}'
        await send({"type": "http.response.start", "status": 503,
                    "headers": [(b"content-type", b"application/json")]})  # fmt: skip
        await send({"type": "http.response.body", "body": body})


async def test_an_answer_lost_after_a_sleep_replays_the_run(database_url: str) -> None:
    """The answer of an invocation that suspended on a sleep never reaches the orchestrator
    (neither the result of its step nor the sleep is recorded): the next invocation does not go
    on with the execution kept in memory, which believes them recorded, but replays; the run
    completes, the step whose end was lost runs again (as any step whose end was not recorded)
    and every other step once."""
    ran: dict[str, int] = {}
    sl = looping_app(ran)
    app = LosesAnAnswer(sl.asgi())
    async with orchestrator_stack(database_url) as stack, serve(app) as app_url:
        await stack.register(sl, app_url + "/")
        run = await stack.client.start_run("loop", 4)
        done = await stack.client.wait_run(run["id"], timeout=60)
        history = [e["type"] async for e in stack.client.iter_run_events(run["id"])]
    assert done["status"] == "completed", done["error"]
    assert done["output"] == sum(range(4))
    assert ran == {"passes": 6, "w0": 1, "w1": 2, "w2": 1, "w3": 1}  # the second was lost
    assert history.count("invocation.started") == 6
    # Six invocations: the second's answer was lost, the third replayed (two passes of the
    # loop's code), every other one went on with the execution kept across its sleep.
    assert sl.parked.resumed == 4


async def test_executions_kept_are_let_go_past_the_count_and_the_age(database_url: str) -> None:
    """With room for one parked run, a second run that parks lets the first go: the first
    replays after its sleep, the second goes on parked; with no time to keep any, every
    invocation replays. Every run completes, each step once."""
    ran: dict[str, int] = {}
    sl = looping_app(ran, parked_runs=1)

    @sl.workflow("slow")
    async def slow(ctx: stepline.Context, input: Any) -> str:
        ran["slow-passes"] = ran.get("slow-passes", 0) + 1
        await ctx.step("first", lambda: "x")
        await ctx.sleep("long", "1s")
        return "slow"

    async with orchestrator_stack(database_url) as stack, serve(sl.asgi()) as app_url:
        await stack.register(sl, app_url + "/")
        first = await stack.client.start_run("slow", None)
        while len(sl.parked) == 0:  # parked, asleep for a second
            await asyncio.sleep(0.01)
        second = await stack.client.start_run("loop", 2)
        done_second = await stack.client.wait_run(second["id"], timeout=30)
        done_first = await stack.client.wait_run(first["id"], timeout=30)
        assert (done_first["output"], done_second["output"]) == ("slow", sum(range(2)))
        assert ran.pop("slow-passes") == 2  # let go, it replayed after its sleep
        assert sl.parked.resumed == 2  # the loop's two invocations after a sleep

        sl.parked.max_seconds = 0.0  # kept no time at all
        third = await stack.client.start_run("loop", 3)
        done_third = await stack.client.wait_run(third["id"], timeout=30)
    assert done_third["output"] == sum(range(3))
    assert sl.parked.resumed == 2
    assert ran.pop("passes") == 2 + (1 + 2 + 3 + 3)  # the second run's, then every replay
    assert ran == {"w0": 2, "w1": 2, "w2": 1}  # one step run per run


async def test_a_worker_that_declares_no_protocol_polls_whole_histories(database_url: str) -> None:
    """A run's first invocation answered by a worker of today's SDK (it reads deltas); the next
    polled by a worker that declares no protocol in its poll (an SDK from before deltas came in
    their form) carries the whole history, as a list."""
    sl = stepline.Stepline("secret-deltas")

    @sl.workflow("nap")
    async def nap(ctx: stepline.Context, input: object) -> str:
        await ctx.step("first", lambda: 1)
        await ctx.sleep("nap", "2s")
        return "ok"

    async with orchestrator_stack(database_url) as stack:
        slug = await stack.register_pull("deltas")
        async with worker(stack, sl, slug):
            run = await stack.client.start_run("nap", None)

            async def suspended() -> bool:
                events = [e async for e in stack.client.iter_run_events(run["id"])]
                return any(e.get("data", {}).get("outcome") == "suspended" for e in events)

            await until(suspended, "the first invocation's answer")
        async with httpx.AsyncClient(base_url=stack.url) as http:
            answer = await http.post(
                f"/v1/apps/{slug}/poll",
                params={"wait": "10s", "limit": "1"},
                headers={"Authorization": f"Bearer {stack.api_key}"},
                timeout=30,
            )
    assert answer.status_code == 200, answer.text
    [body] = answer.json()["invocations"]
    assert body["runId"] == run["id"] and isinstance(body["steps"], list)
    assert "historyBase" not in body
    assert [(s["name"], s["status"]) for s in body["steps"]] == [
        ("first", "completed"),
        ("nap", "completed"),
    ]
