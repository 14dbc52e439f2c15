"""A pull app for worker tests, run by ``stepline worker`` in its own process or in the test's.

``COUNT_FILE`` collects one line per step execution (``<step> <pid>``); a worker process with
``PULL_APP_HANG`` set hangs in the step (to be killed mid-step); the step of ``exit-in-step``
ends its worker's process every time it runs.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import stepline

sl = stepline.Stepline("pull-secret")


@sl.workflow("hang-once")
async def hang_once(ctx: stepline.Context, input: dict[str, Any]) -> str:
    async def work() -> str:
        with open(input["countFile"], "a") as f:
            f.write(f"work {os.getpid()}\n")
        if os.environ.get("PULL_APP_HANG"):
            await asyncio.sleep(3600)
        return "done"

    first = await ctx.step("work", work)
    await ctx.sleep("rest", "100ms")
    return str(await ctx.step("after", lambda: f"{first} after"))


@sl.workflow("slow-step")
async def slow_step(ctx: stepline.Context, input: dict[str, Any]) -> str:
    async def work() -> str:
        with open(input["countFile"], "a") as f:
            f.write(f"work {os.getpid()}\n")
        await asyncio.sleep(float(input["seconds"]))
        return "finished"

    return str(await ctx.step("work", work))


@sl.workflow("exit-in-step", delivery_window="4s")
async def exit_in_step(ctx: stepline.Context, input: dict[str, Any]) -> str:
    def work() -> str:
        with open(input["countFile"], "a") as f:
            f.write(f"work {os.getpid()}\n")
        os._exit(3)  # the worker dies with the try: its outcome is never sent

    return str(await ctx.step("work", work))
