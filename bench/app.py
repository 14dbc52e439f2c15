"""The benchmark's workflow app, served by uvicorn in its own process (``bench.app:app``).

The SDK handler is mounted at ``/stepline/`` behind a small ASGI middleware that counts the
requests the orchestrator sends (invocations) and their body bytes; the SDK's progress calls go
through its default transport, wrapped to count their bytes both ways. ``GET /stats`` answers the
counters (and the callback URLs announced by the ``callback`` workflow), ``POST /stats/reset``
zeroes them. The signing secret comes from ``STEPLINE_SIGNING_SECRET``; with
``STEPLINE_BENCH_CODEC`` set (``python -m bench --codec``) the app encrypts every value.

Workflows (all steps are trivial ``async`` functions, so the figures are the engine's overhead):

- ``steps``, ``long``: ``input["n"]`` sequential steps.
- ``long-sleep``: ``input["n"]`` iterations of a step and a 10 ms sleep (with ``input["every"]``,
  the run continues as new after each ``every`` iterations).
- ``big``: ``input["n"]`` steps each returning ``input["kb"]`` KB of text, then a 10 ms sleep.
- ``fanout``: ``input["n"]`` steps gathered in parallel.
- ``sleep``: ``ctx.now`` before, a durable sleep of ``input["ms"]``, ``ctx.now`` after.
- ``callback``: a callback, a step that announces its URL to the load generator, then the wait.
- ``idle``: a durable sleep of ``input["ms"]`` (long), counted when first reached.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import stepline
from stepline._transport import Transport

COUNTERS = (
    "invocations",
    "invoke_request_bytes",
    "invoke_response_bytes",
    "progress_calls",
    "progress_request_bytes",
    "progress_response_bytes",
    "idle_reached",
    "largest_invoke_body",
)


class Stats:
    """Counters shared by the middleware, the progress client's hooks and the workflows."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self.active = 0
        self.callbacks: dict[str, str] = {}

    def reset(self) -> None:
        self.counts = dict.fromkeys(COUNTERS, 0)
        self.callbacks = {}

    def snapshot(self) -> dict[str, Any]:
        return {**self.counts, "active": self.active, "callbacks": dict(self.callbacks)}


STATS = Stats()


class CountingMiddleware:
    """Counts each HTTP request to ``app``, its body bytes in and out, and those in flight."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        counts = STATS.counts
        size = 0

        async def counted_receive() -> Message:
            nonlocal size
            message = await receive()
            if message["type"] == "http.request":
                size += len(message.get("body", b""))
                counts["invoke_request_bytes"] += len(message.get("body", b""))
                counts["largest_invoke_body"] = max(counts["largest_invoke_body"], size)
            return message

        async def counted_send(message: Message) -> None:
            if message["type"] == "http.response.body":
                counts["invoke_response_bytes"] += len(message.get("body", b""))
            await send(message)

        counts["invocations"] += 1
        STATS.active += 1
        try:
            await self.app(scope, counted_receive, counted_send)
        finally:
            STATS.active -= 1


class CountingTransport(Transport):
    """The SDK's default progress transport, counting the bytes of each call both ways."""

    async def _post(self, url: str, content: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        status, answer = await super()._post(url, content, headers)
        STATS.counts["progress_calls"] += 1
        STATS.counts["progress_request_bytes"] += len(content)
        STATS.counts["progress_response_bytes"] += len(answer)
        return status, answer


# python -m bench --codec: every value the app sends is encrypted (a fixed benchmark key).
CODEC = (
    stepline.Encryption(keys={"bench": bytes(range(32))})
    if os.environ.get("STEPLINE_BENCH_CODEC")
    else None
)
sl = stepline.Stepline(codec=CODEC)
sl.runtime.transport = CountingTransport()


async def trivial(i: int) -> int:
    """The step every workload runs: no work, so only the engine's cost is measured."""
    return i


@sl.workflow("steps")
async def steps(ctx: stepline.Context, input: dict[str, Any]) -> int:
    for i in range(int(input["n"])):
        await ctx.step(f"s{i}", trivial, i)
    return int(input["n"])


@sl.workflow("keyed", concurrency=stepline.Concurrency(limit=1, key="key"))
async def keyed(ctx: stepline.Context, input: dict[str, Any]) -> int:
    """The ``steps`` workflow with one run at a time per value of ``key``."""
    for i in range(int(input["n"])):
        await ctx.step(f"s{i}", trivial, i)
    return int(input["n"])


@sl.workflow("long")
async def long(ctx: stepline.Context, input: dict[str, Any]) -> int:
    for i in range(int(input["n"])):
        await ctx.step(f"s{i}", trivial, i)
    return int(input["n"])


@sl.workflow("long-sleep")
async def long_sleep(ctx: stepline.Context, input: dict[str, Any]) -> int:
    n, every = int(input["n"]), int(input.get("every") or 0)
    for i in range(int(input.get("from") or 0), n):
        await ctx.step(f"s{i}", trivial, i)
        await ctx.sleep(f"z{i}", "10ms")
        if every and (i + 1) % every == 0 and i + 1 < n:
            ctx.continue_as_new({"n": n, "every": every, "from": i + 1})
    return n


async def blob(i: int, kb: int) -> str:
    return chr(ord("a") + i % 26) * (kb * 1000)


@sl.workflow("big")
async def big(ctx: stepline.Context, input: dict[str, Any]) -> int:
    kb = int(input["kb"])
    sizes = [len(await ctx.step(f"b{i}", blob, i, kb)) for i in range(int(input["n"]))]
    await ctx.sleep("nap", "10ms")
    return sum(sizes)


@sl.workflow("fanout")
async def fanout(ctx: stepline.Context, input: dict[str, Any]) -> int:
    results = await asyncio.gather(*(ctx.step(f"s{i}", trivial, i) for i in range(input["n"])))
    return len(results)


@sl.workflow("sleep")
async def sleep(ctx: stepline.Context, input: dict[str, Any]) -> dict[str, Any]:
    before = await ctx.now("before")
    await ctx.sleep("nap", f"{int(input['ms'])}ms")
    after = await ctx.now("after")
    return {"before": before.isoformat(), "after": after.isoformat(), "ms": input["ms"]}


@sl.workflow("callback")
async def callback(ctx: stepline.Context, input: Any) -> Any:
    cb = await ctx.callback("cb", timeout="30m")

    async def announce(run_id: str, url: str) -> str:
        STATS.callbacks[run_id] = url
        return url

    await ctx.step("announce", announce, ctx.run_id, cb.url)
    return await cb.wait()


@sl.workflow("breaks")
async def breaks(ctx: stepline.Context, input: Any) -> None:
    """A trivial step, then a terminal error: the failed runs ``bulk`` retries."""
    await ctx.step("s0", trivial, 0)
    raise stepline.TerminalError("breaks on purpose")


@sl.workflow("idle")
async def idle(ctx: stepline.Context, input: dict[str, Any]) -> None:
    STATS.counts["idle_reached"] += 1
    await ctx.sleep("nap", f"{int(input['ms'])}ms")


async def stats(request: Request) -> Response:
    return JSONResponse(STATS.snapshot())


async def reset(request: Request) -> Response:
    STATS.reset()
    return JSONResponse(STATS.snapshot())


app = Starlette(
    routes=[
        Route("/stats", stats, methods=["GET"]),
        Route("/stats/reset", reset, methods=["POST"]),
        Mount("/stepline", app=CountingMiddleware(sl.asgi())),
    ]
)
