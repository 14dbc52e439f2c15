"""Long runs end to end: large results travel by reference and are fetched only when replay
reads them, continue_as_new starts generations under one run id, and the history limit fails a
run with its documented code."""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

import httpx
import pytest

import stepline
from stepline._transport import Transport
from tests.support import Stack, app_server, orchestrator_stack, serve

KB = 1024


class Counted:
    """ASGI wrapper counting each invocation's body bytes (the orchestrator's POSTs)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.bodies: list[int] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        index = len(self.bodies)
        self.bodies.append(0)

        async def counted() -> Any:
            message = await receive()
            self.bodies[index] += len(message.get("body", b""))
            return message

        await self.app(scope, counted, send)


class CountingFetches(Transport):
    """The SDK's transport, counting the results it fetched by reference."""

    def __init__(self) -> None:
        super().__init__()
        self.fetched: list[str] = []

    async def _get(self, url: str, headers: dict[str, str]) -> tuple[int, bytes]:
        self.fetched.append(url.rsplit("/", 1)[1].split("?")[0])
        return await super()._get(url, headers)


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


async def event_types(stack: Stack, run_id: str) -> list[str]:
    return [e["type"] async for e in stack.client.iter_run_events(run_id)]


@pytest.mark.parametrize("parked", [0, 256], ids=["replayed", "parked"])
async def test_twenty_large_steps_then_a_sleep_complete(database_url: str, parked: int) -> None:
    """Twenty 900 KB results (18 MB in all, past the 16 MiB an invocation may carry) and a
    sleep: the run completes, every step ran once, the invocation after the sleep is small and
    the workflow has every result whole: replayed, it reads each back by reference; kept
    running across the sleep (parked), it fetches none."""
    sl = stepline.Stepline("secret-long", parked_runs=parked)
    transport = CountingFetches()
    sl.runtime.transport = transport
    ran: dict[str, int] = {}

    def big(i: int) -> str:
        ran[f"s{i}"] = ran.get(f"s{i}", 0) + 1
        return chr(ord("a") + i) * (900 * KB)

    @sl.workflow("big")
    async def big_flow(ctx: stepline.Context, input: Any) -> list[int]:
        sizes = [len(await ctx.step(f"s{i}", big, i)) for i in range(20)]
        await ctx.sleep("nap", "100ms")
        return sizes

    counted = Counted(sl.asgi())
    async with orchestrator_stack(database_url) as stack, serve(counted) as app_url:
        await stack.register(sl, app_url + "/")
        synced = len(counted.bodies)  # the sync's describe call
        run = await stack.client.start_run("big", None)
        done = await stack.client.wait_run(run["id"], timeout=60)
    assert done["status"] == "completed", done["error"]
    assert done["output"] == [900 * KB] * 20
    assert ran == {f"s{i}": 1 for i in range(20)}
    invocations = counted.bodies[synced:]
    assert len(invocations) == 2
    assert invocations[1] < 64 * KB, invocations  # references, not 18 MB
    # Replayed, each result is read back once after the sleep; parked, the workflow has them.
    assert len(transport.fetched) == (20 if not parked else 0)
    assert done["history"]["steps"] == 21
    assert done["history"]["bytes"] >= 20 * 900 * KB


async def test_a_large_result_is_fetched_only_when_read_and_replays_equal(
    database_url: str,
) -> None:
    """A 400 KB step result and a 300 KB callback body come by reference: nothing is fetched
    while they are fresh, each is fetched once per invocation that replays it, a small result is
    never fetched, and the replayed values equal what the step returned and what was POSTed
    (every invocation replays: no execution is kept across the sleep)."""
    sl = stepline.Stepline("secret-long", parked_runs=0)
    transport = CountingFetches()
    sl.runtime.transport = transport
    value = {"rows": [{"i": i, "text": "é€😀" * 10, "x": i / 7} for i in range(3000)]}
    posted = {"blob": "z" * (300 * KB), "n": [1, 2.5, None, True]}
    seen: list[tuple[str, int, str]] = []

    @sl.workflow("lazy")
    async def lazy(ctx: stepline.Context, input: Any) -> dict[str, str]:
        fetched_before = len(transport.fetched)
        got = await ctx.step("big", lambda: value)
        small = await ctx.step("small", lambda: {"ok": True})
        seen.append(("big", len(transport.fetched) - fetched_before, digest(got)))
        await ctx.sleep("nap", "50ms")
        cb = await ctx.callback("cb")
        await ctx.step("announce", lambda: cb.url)
        body = await cb.wait()
        return {"big": digest(got), "small": digest(small), "body": digest(body)}

    async with orchestrator_stack(database_url) as stack, app_server(sl) as app_url:
        await stack.register(sl, app_url)
        run = await stack.client.start_run("lazy", None)

        async def announced() -> str | None:
            current = await stack.client.get_run(run["id"])
            step = next((s for s in current["steps"] if s["name"] == "cb"), None)
            return step["callbackId"] if step and step["status"] == "waiting" else None

        callback_id = None
        for _ in range(300):
            callback_id = await announced()
            if callback_id:
                break
            await asyncio.sleep(0.05)
        assert callback_id is not None
        before_post = list(transport.fetched)
        await stack.client.complete_callback(callback_id, posted)
        done = await stack.client.wait_run(run["id"], timeout=30)
    assert done["status"] == "completed", done["error"]
    assert done["output"] == {
        "big": digest(value),
        "small": digest({"ok": True}),
        "body": digest(posted),
    }
    # Fresh: nothing fetched; after the sleep: "big" once; after the callback: "big" and the body.
    assert [n for _, n, _ in seen] == [0, 1, 1]
    assert all(d == digest(value) for _, _, d in seen)
    assert len(before_post) == 1
    assert len(transport.fetched) == 3


async def test_continue_as_new_runs_generations(database_url: str) -> None:
    """Five generations of step, child run and sleep under one run id: the run completes with
    the sum, each generation's step ran once and started its own child, the run shows the last
    generation's steps and its number, and the history shows every continuation."""
    sl = stepline.Stepline("secret-long")
    ran: list[int] = []

    @sl.workflow("double")
    async def double(ctx: stepline.Context, input: int) -> int:
        return await ctx.step("twice", lambda: input * 2)

    @sl.workflow("loop")
    async def loop(ctx: stepline.Context, input: dict[str, int]) -> dict[str, int]:
        i = input["i"]
        await ctx.step("add", lambda: ran.append(i))
        doubled = await ctx.invoke("child", "double", i)
        await ctx.sleep("nap", "20ms")
        total = input["total"] + doubled
        if i + 1 < input["n"]:
            ctx.continue_as_new({"i": i + 1, "n": input["n"], "total": total})
        return {"total": total, "generation": ctx.generation}

    async with orchestrator_stack(database_url) as stack, app_server(sl) as app_url:
        await stack.register(sl, app_url)
        run = await stack.client.start_run("loop", {"i": 0, "n": 5, "total": 0})
        done = await stack.client.wait_run(run["id"], timeout=60)
        types = await event_types(stack, run["id"])
        continued = [
            e["data"]
            async for e in stack.client.iter_run_events(run["id"])
            if e["type"] == "run.continuedAsNew"
        ]
    assert done["status"] == "completed", done["error"]
    assert done["output"] == {"total": 2 * (0 + 1 + 2 + 3 + 4), "generation": 5}
    assert ran == [0, 1, 2, 3, 4]
    assert done["generation"] == 5
    assert done["input"] == {"i": 4, "n": 5, "total": 2 * (0 + 1 + 2 + 3)}
    assert [s["name"] for s in done["steps"]] == ["add", "child", "nap"]
    assert len({s["childRunId"] for s in done["steps"] if s["name"] == "child"}) == 1
    assert types.count("run.continuedAsNew") == 4
    assert [c["generation"] for c in continued] == [2, 3, 4, 5]
    assert all(c["steps"] == 3 for c in continued)
    assert types[-1] == "run.completed"


async def test_the_history_limit_fails_a_run(database_url: str) -> None:
    """A loop of step and sleep past the steps limit, and a result past the bytes limit, each
    end the run failed with history_limit_exceeded before the app is invoked again; a run near
    the limit says so in its detail."""
    sl = stepline.Stepline("secret-long")
    calls: list[int] = []

    @sl.workflow("forever")
    async def forever(ctx: stepline.Context, input: Any) -> None:
        for i in range(100):
            await ctx.step(f"s{i}", lambda i=i: calls.append(i))
            await ctx.sleep(f"nap{i}", "10ms")

    @sl.workflow("heavy")
    async def heavy(ctx: stepline.Context, input: Any) -> None:
        await ctx.step("blob", lambda: "x" * 5000)
        await ctx.sleep("nap", "10ms")
        await ctx.step("after", lambda: calls.append(-1))

    @sl.workflow("near")
    async def near(ctx: stepline.Context, input: Any) -> None:
        for i in range(5):
            await ctx.step(f"s{i}", lambda: None)
        await ctx.sleep("nap", "1h")

    async with (
        orchestrator_stack(database_url, history_max_steps=6, history_max_bytes=4000) as stack,
        app_server(sl) as app_url,
    ):
        await stack.register(sl, app_url)
        near_run = await stack.client.start_run("near", None)
        long_run = await stack.client.start_run("forever", None)
        heavy_run = await stack.client.start_run("heavy", None)
        done = await stack.client.wait_run(long_run["id"], timeout=30)
        heavy_done = await stack.client.wait_run(heavy_run["id"], timeout=30)
        types = await event_types(stack, long_run["id"])
        for _ in range(300):  # until it sleeps, its five steps recorded
            near_now = await stack.client.get_run(near_run["id"])
            if len(near_now["steps"]) == 6:
                break
            await asyncio.sleep(0.05)
    assert near_now["status"] == "running" and len(near_now["steps"]) == 6
    assert "history_limit_exceeded" in near_now["history"]["warning"]
    assert done["status"] == "failed"
    assert done["error"]["code"] == "history_limit_exceeded"
    assert len(done["steps"]) == 8  # s0..s3 and their sleeps: over 6 at the next invocation
    assert calls[:4] == [0, 1, 2, 3] and 4 not in calls
    assert done["history"]["steps"] == 8 and done["history"]["maxSteps"] == 6
    assert types[-3:] == ["invocation.started", "invocation.ended", "run.failed"]
    assert heavy_done["status"] == "failed"
    assert heavy_done["error"]["code"] == "history_limit_exceeded"
    assert -1 not in calls


async def test_the_result_route_refuses_what_it_cannot_answer(database_url: str) -> None:
    """Without the invocation's token: 401; a token for an invocation that holds no run: 409
    stale_invocation; a position or run id that is not one: 422 naming the field. Each in the
    error shape."""
    invocation = "6f1c2a9e-0d7b-4c53-9a43-1b2c3d4e5f60"
    run_id = "0b7f6d0e-3c1a-4a55-9a57-2f3c8e2f1a10"
    async with orchestrator_stack(database_url) as stack:
        token = stack.orchestrator.signer.invocation_token(invocation, "some-lease")
        good = {"Authorization": f"Bearer {token}"}
        base = f"{stack.url}/v1/invocations/{invocation}/results"
        async with httpx.AsyncClient(timeout=10) as http:
            no_token = await http.get(f"{base}/3?runId={run_id}")
            api_key = await http.get(
                f"{base}/3?runId={run_id}", headers={"Authorization": f"Bearer {stack.api_key}"}
            )
            stale = await http.get(f"{base}/3?runId={run_id}", headers=good)
            bad_position = await http.get(f"{base}/x3?runId={run_id}", headers=good)
            bad_run = await http.get(f"{base}/3?runId=nope", headers=good)
    assert (no_token.status_code, no_token.json()["error"]["code"]) == (401, "unauthorized")
    assert (api_key.status_code, api_key.json()["error"]["code"]) == (401, "unauthorized")
    assert (stale.status_code, stale.json()["error"]["code"]) == (409, "stale_invocation")
    assert bad_position.status_code == 422
    assert "position" in bad_position.json()["error"]["details"]["fields"]
    assert bad_run.status_code == 422
    assert "runId" in bad_run.json()["error"]["details"]["fields"]


async def test_the_history_route_refuses_what_it_cannot_answer(database_url: str) -> None:
    """The SDK's fetch of a whole history: without the invocation's token 401, for an
    invocation that holds no run 409 stale_invocation, for a run id that is not one 422 naming
    it; each in the error shape."""
    invocation = "6f1c2a9e-0d7b-4c53-9a43-1b2c3d4e5f61"
    run_id = "0b7f6d0e-3c1a-4a55-9a57-2f3c8e2f1a11"
    async with orchestrator_stack(database_url) as stack:
        token = stack.orchestrator.signer.invocation_token(invocation, "some-lease")
        good = {"Authorization": f"Bearer {token}"}
        url = f"{stack.url}/v1/invocations/{invocation}/steps"
        async with httpx.AsyncClient(timeout=10) as http:
            no_token = await http.get(f"{url}?runId={run_id}")
            stale = await http.get(f"{url}?runId={run_id}", headers=good)
            bad_run = await http.get(f"{url}?runId=nope", headers=good)
            no_run = await http.get(url, headers=good)
    assert (no_token.status_code, no_token.json()["error"]["code"]) == (401, "unauthorized")
    assert (stale.status_code, stale.json()["error"]["code"]) == (409, "stale_invocation")
    for refused in (bad_run, no_run):
        assert refused.status_code == 422
        assert "runId" in refused.json()["error"]["details"]["fields"]
