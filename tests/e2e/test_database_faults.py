"""The database goes away under a running orchestrator: its connections are cut again and
again while invocations run. Loops ride it out, healthy invocations keep their leases, and
nothing runs twice or is lost."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest

import stepline
from tests.support import hosted, orchestrator_stack


async def cut_connections(database_url: str, times: int, every: float) -> int:
    """Terminate every connection to the database ``times`` times, ``every`` seconds apart
    (as a PostgreSQL restart would); answers how many were cut."""
    admin = await asyncpg.connect(database_url)
    name = urlsplit(database_url).path.lstrip("/")
    cut = 0
    try:
        for _ in range(times):
            await asyncio.sleep(every)
            cut += await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = $1 AND pid <> pg_backend_pid()",
                name,
            )
    finally:
        await admin.close()
    return cut


@pytest.mark.parametrize("kind", ["push", "pull"])
async def test_connections_cut_while_steps_run_take_no_lease_and_lose_nothing(
    database_url: str, kind: str
) -> None:
    """Lease 2 s, steps of 2 s, every connection cut every 0.3 s for 2.4 s: each step runs
    once, every run completes with its output, and no try counts as a delivery failure (the
    database's restart is ours, not the app's, for a push app as for a pull app's worker)."""
    sl = stepline.Stepline("db-faults-secret")
    ran: Counter[str] = Counter()

    @sl.workflow("patient")
    async def patient(ctx: stepline.Context, input: Any) -> Any:
        async def slow(tag: str) -> str:
            ran[tag] += 1
            await asyncio.sleep(2.0)
            return tag

        first = await ctx.step("first", slow, f"{input}-a")
        second = await ctx.step("second", slow, f"{input}-b")
        return [first, second]

    async with (
        orchestrator_stack(database_url, lease_seconds=2.0) as stack,
        hosted(stack, sl, kind),
    ):
        started = [await stack.client.start_run("patient", n) for n in range(3)]
        assert await cut_connections(database_url, times=8, every=0.3) > 0
        done = [await stack.client.wait_run(r["id"], timeout=60) for r in started]
    assert [d["status"] for d in done] == ["completed"] * 3, done
    assert [d["deliveryFailures"] for d in done] == [0] * 3, done
    assert [d["output"] for d in done] == [[f"{n}-a", f"{n}-b"] for n in range(3)]
    assert ran == Counter({f"{n}-{x}": 1 for n in range(3) for x in "ab"}), ran
