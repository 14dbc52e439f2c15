"""An SDK app for crash tests, run in its own process: side effects append to a file.

``STEPLINE_SIGNING_SECRET`` signs, ``COUNT_FILE`` collects one line per step execution.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import stepline

sl = stepline.Stepline()


def _record(name: str) -> None:
    with open(os.environ["COUNT_FILE"], "a") as f:
        f.write(name + "\n")


@sl.workflow(
    "slow-steps", retries=stepline.Retries(attempts=10, initial_delay="100ms", max_delay="1s")
)
async def slow_steps(ctx: stepline.Context, input: dict[str, Any]) -> list[int]:
    results = []
    for i in range(int(input["steps"])):

        async def work(i: int = i) -> int:
            await asyncio.sleep(float(input.get("delay", 0.3)))
            _record(f"s{i}")
            return i * i

        results.append(await ctx.step(f"s{i}", work))
    return results


app = sl.asgi()
