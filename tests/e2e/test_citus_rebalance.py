"""A Citus cluster grows under running workflows: a worker is added and the shards rebalanced
(``citus_rebalance_start``) while runs sleep and wait on callbacks; every run completes with
the right output and no step runs twice. Only on a Citus cluster (``STEPLINE_TEST_CITUS``,
``tests/citus/README.md``); skipped on plain PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import httpx
import pytest

import stepline
from stepline_server.store import db, migrate
from tests.ports import free_port
from tests.support import app_server, orchestrator_stack

CLUSTER = os.environ.get("STEPLINE_TEST_CITUS")
CLUSTER_SH = Path(__file__).resolve().parents[2].parent / "shared" / "citus" / "cluster.sh"
RUNS = 24

pytestmark = pytest.mark.skipif(not CLUSTER, reason="STEPLINE_TEST_CITUS names no Citus cluster")


def moving_app(counts: dict[str, int], urls: dict[str, str]) -> stepline.Stepline:
    """A workflow that does a step, sleeps, hands out a callback URL, waits for it, and does a
    last step: each step counts its executions."""
    sl = stepline.Stepline("secret-rebalance")

    def bump(name: str, value: Any) -> Any:
        counts[name] = counts.get(name, 0) + 1
        return value

    @sl.workflow("moving")
    async def moving(ctx: stepline.Context, input: dict[str, Any]) -> Any:
        i = input["i"]
        first = await ctx.step("first", bump, f"first-{i}", i)
        await ctx.sleep("nap", timedelta(seconds=input["nap"]))
        cb = await ctx.callback("go", timeout="5m")

        def announce(url: str) -> str:
            urls[ctx.run_id] = url
            return bump(f"announce-{i}", url)

        await ctx.step("announce", announce, cb.url)
        body = await cb.wait()
        last = await ctx.step("last", bump, f"last-{i}", i * 10)
        return {"first": first, "body": body, "last": last}

    return sl


def _add_worker(database: str) -> int:
    """Start one more worker in the test cluster with this test's database on it, and add it
    to that database (``cluster.sh addworker``); its port."""
    port = free_port()
    subprocess.run(
        ["bash", str(CLUSTER_SH), "addworker", str(CLUSTER), str(port), database],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return port


def _cluster(*args: str) -> None:
    subprocess.run(["bash", str(CLUSTER_SH), *args], check=True, capture_output=True, timeout=120)


@pytest.fixture
async def own_database() -> Any:
    """A database of this test's own, made on every node by ``cluster.sh createdb`` and
    migrated (so laid out), not copied from the tests' template: a worker added to a copy
    fails, Citus propagating the template's database object to a node that lacks it."""
    assert CLUSTER is not None
    name = f"stepline_rebalance_{os.urandom(6).hex()}"
    await asyncio.to_thread(_cluster, "createdb", CLUSTER, name)
    port = Path(CLUSTER, "ports").read_text().split()[0]
    dsn = f"postgresql://postgres@127.0.0.1:{port}/{name}"
    conn = await asyncpg.connect(dsn)
    try:
        await migrate.apply_migrations(conn)
    finally:
        await conn.close()
    try:
        yield dsn
    finally:
        await asyncio.to_thread(_cluster, "dropdb", CLUSTER, name)


async def test_a_rebalance_under_sleeping_and_waiting_runs_loses_nothing(own_database: str) -> None:
    database_url = own_database
    counts: dict[str, int] = {}
    urls: dict[str, str] = {}
    sl = moving_app(counts, urls)
    database = urlsplit(database_url).path.lstrip("/")
    async with orchestrator_stack(database_url) as stack, app_server(sl) as app_url:
        await stack.register(sl, app_url)
        # Half sleep past the rebalance, half are waiting on their callback when it starts.
        ids = [
            (await stack.client.start_run("moving", {"i": i, "nap": 0.2 if i % 2 else 8}))["id"]
            for i in range(RUNS)
        ]
        for run_id in ids[1::2]:
            while run_id not in urls:
                await asyncio.sleep(0.05)

        port = await asyncio.to_thread(_add_worker, database)
        conn = await db.connect(database_url)
        try:
            # (citus_add_node made the schema's distributed functions and reference tables
            # there.)
            await conn.execute("SELECT citus_rebalance_start()")
            async with httpx.AsyncClient(timeout=30) as anon:
                # Callbacks completed while shards move; the others after their sleep.
                pending = set(ids)
                while pending:
                    for run_id in list(pending):
                        if run_id in urls:
                            answer = await anon.post(urls[run_id], json={"go": run_id})
                            assert answer.status_code == 200, answer.text
                            pending.discard(run_id)
                    await asyncio.sleep(0.1)
            await conn.execute("SELECT citus_rebalance_wait()")
            moved = await conn.fetchval(
                "SELECT count(*) FROM pg_dist_placement p JOIN pg_dist_node n"
                " ON n.groupid = p.groupid WHERE n.nodeport = $1",
                port,
            )
            assert moved > 0  # the new worker holds shards now
        finally:
            await conn.close()

        for i, run_id in enumerate(ids):
            done = await stack.client.wait_run(run_id, timeout=60)
            assert done["status"] == "completed", done
            assert done["output"] == {"first": i, "body": {"go": run_id}, "last": i * 10}
        for i in range(RUNS):
            assert (counts[f"first-{i}"], counts[f"announce-{i}"], counts[f"last-{i}"]) == (1, 1, 1)
