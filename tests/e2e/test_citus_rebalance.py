"""A Citus cluster grows under running workflows: a worker is added and the shards rebalanced
(``citus_rebalance_start``) while runs sleep and wait on callbacks; every run completes with
the right output and no step runs twice. Only where Citus runs the tests
(``STEPLINE_TEST_CITUS``, ``tests/citus/README.md``), on a cluster of the test's own; skipped on
plain PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

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


def _cluster(*args: str) -> None:
    subprocess.run(["bash", str(CLUSTER_SH), *args], check=True, capture_output=True, timeout=180)


def _two_free_ports() -> int:
    """A port with the next one free too (a coordinator and its worker)."""
    while True:
        port = free_port()
        if port + 1 < 32000:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
            return port


@dataclass
class OwnCluster:
    folder: str
    dsn: str
    database: str


@pytest.fixture
async def own_cluster() -> Any:
    """A Citus cluster of this test's own (a coordinator and one worker, ``cluster.sh start``)
    with a database made on both and migrated (so laid out): the worker this test adds stays in
    its cluster, which is stopped at the end, and the cluster the other tests share keeps its
    nodes."""
    # (A folder of its own under the system's temporary folder, open to the postgres user the
    # servers run as: pytest's tmp_path is under a folder only root may enter.)
    top = Path(tempfile.mkdtemp(prefix="stepline-rebalance-"))
    top.chmod(0o755)
    folder = top / "cluster"
    port = _two_free_ports()
    await asyncio.to_thread(_cluster, "start", str(folder), str(port), "1")
    try:
        name = "stepline_rebalance"
        await asyncio.to_thread(_cluster, "createdb", str(folder), name)
        dsn = f"postgresql://postgres@127.0.0.1:{port}/{name}"
        conn = await asyncpg.connect(dsn)
        try:
            # Four shards a table (not 32): the rebalance then moves a few shards of each
            # colocation group, in seconds rather than minutes, and moves them all the same.
            await conn.execute(f'ALTER DATABASE "{name}" SET citus.shard_count = 4')
            await conn.close()
            conn = await asyncpg.connect(dsn)
            await migrate.apply_migrations(conn)
        finally:
            await conn.close()
        yield OwnCluster(str(folder), dsn, name)
    finally:
        await asyncio.to_thread(_cluster, "stop", str(folder))
        shutil.rmtree(top, ignore_errors=True)


async def test_a_rebalance_under_sleeping_and_waiting_runs_loses_nothing(
    own_cluster: OwnCluster,
) -> None:
    database_url = own_cluster.dsn
    counts: dict[str, int] = {}
    urls: dict[str, str] = {}
    sl = moving_app(counts, urls)
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

        # One more worker, started and added to the database (cluster.sh addworker).
        port = free_port()
        await asyncio.to_thread(
            _cluster, "addworker", own_cluster.folder, str(port), own_cluster.database
        )
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
