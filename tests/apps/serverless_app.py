"""A FastAPI app with Stepline mounted, for the serverless tests (served one event loop, or one
process, per request): each step's side effect appends ``<run key> <step>`` to the file
``STEPLINE_TEST_EFFECTS`` names; ``STEPLINE_SIGNING_SECRET`` signs."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import httpx
from fastapi import FastAPI

import stepline


def effect(key: str, name: str) -> str:
    """A side effect whose every execution is counted."""
    with open(os.environ["STEPLINE_TEST_EFFECTS"], "a") as f:
        f.write(f"{key} {name}\n")
    return name


async def async_effect(key: str, name: str) -> str:
    await asyncio.sleep(0.001)
    return effect(key, name)


def approve(key: str, url: str) -> str:
    """POST the approval to the callback's URL (as a person clicking a link would)."""
    effect(key, "ask")
    httpx.post(url, json={"approved": True, "by": key}).raise_for_status()
    return "asked"


def make_app() -> tuple[stepline.Stepline, FastAPI]:
    """A Stepline with the ``trip`` workflow, mounted at ``/stepline`` in a FastAPI app."""
    sl = stepline.Stepline()

    @sl.workflow("trip", retries=stepline.Retries(attempts=1))
    async def trip(ctx: stepline.Context, input: dict[str, Any]) -> dict[str, Any]:
        key = input["key"]
        done = [await ctx.step("book", effect, key, "book")]
        for n in range(2):
            await ctx.sleep(f"rest-{n}", "20ms")
            done.append(await ctx.step(f"leg-{n}", async_effect, key, f"leg-{n}"))

        async def branch(n: int) -> str:
            await ctx.sleep(f"nap-{n}", "20ms")
            return await ctx.step(f"after-nap-{n}", effect, key, f"after-nap-{n}")

        done += await asyncio.gather(branch(0), branch(1))
        approval = await ctx.callback("approval", timeout="1m")
        await ctx.step("ask", approve, key, approval.url)
        try:
            decision = await approval.wait()
        finally:
            for _ in range(3):  # cleaning up, stopped or not, takes a few turns of the loop
                await asyncio.sleep(0)
        ctx.log.info("approved", by=decision["by"])
        return {"done": done, "approved": decision["approved"]}

    app = FastAPI()
    app.mount("/stepline", sl.asgi())
    return sl, app


sl, app = make_app()
