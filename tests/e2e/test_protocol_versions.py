"""Protocol versions: an app speaking the oldest supported protocol (the SDK as it was before
history deltas, taken from this repository's history) gets whole histories and its runs
complete; an app of today declares its version and gets deltas."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

import stepline
from tests.ports import free_port
from tests.support import orchestrator_stack, read_body, serve, unpack_sdk

ROOT = Path(__file__).resolve().parents[2]
OLDEST_SDK = "7a8814b"  # the last commit whose SDK speaks protocol 1 (whole histories only)

APP = textwrap.dedent(
    """
    import stepline

    sl = stepline.Stepline("secret-old-protocol")

    @sl.workflow("stepping")
    async def stepping(ctx, input):
        total = 0
        for i in range(4):
            total += await ctx.step(f"add-{i}", lambda i=i: i + 1)
            await ctx.sleep(f"nap-{i}", "30ms")
        return {"total": total, "sdk": stepline.__file__}

    app = sl.asgi()
    """
)


class Bases:
    """ASGI wrapper noting each invocation's ``historyBase`` (None: a whole history)."""

    def __init__(self, app: Any, bases: list[str | None]) -> None:
        self.app, self.bases = app, bases

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        body = await read_body(receive)
        request = json.loads(body)
        if request.get("kind") == "invoke":
            self.bases.append(request.get("historyBase"))
        sent = False

        async def again() -> Any:
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, again, send)


@pytest.fixture(scope="module")
def old_sdk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The SDK package as it was at OLDEST_SDK, unpacked into a folder of its own."""
    folder = tmp_path_factory.mktemp("old-sdk")
    unpack_sdk(OLDEST_SDK, folder)
    (folder / "oldapp.py").write_text(APP)
    yield folder


@asynccontextmanager
async def old_app(folder: Path) -> AsyncIterator[str]:
    """The app above, served by uvicorn in a process whose ``stepline`` is the old SDK."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": f"{folder}{os.pathsep}{folder / 'sdk'}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "oldapp:app", "--port", str(port), "--log-level",
         "warning"],
        cwd=folder,
        env=env,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/"
    try:
        async with httpx.AsyncClient() as http:
            for _ in range(300):
                try:
                    await http.get(url)
                    break
                except httpx.TransportError:
                    await asyncio.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def test_an_app_of_the_oldest_protocol_gets_whole_histories(
    database_url: str, old_sdk: Path
) -> None:
    """The old SDK declares no protocol version: the orchestrator records version 1 and sends
    it every invocation's whole history (it would take a delta for the whole one), so a run of
    four steps and sleeps completes; a run of an app of today, version 2, gets deltas."""
    async with orchestrator_stack(database_url) as stack, old_app(old_sdk) as url:
        async with stack.orchestrator.pool.acquire() as conn:
            from stepline_server.store import apps, keys

            row = await apps.create(conn, keys.DEFAULT_PROJECT, "old", url, "secret-old-protocol")
            assert row is not None
        await stack.client.sync_app(row["slug"])
        shown = await stack.client.get_app(row["slug"])
        assert shown["protocolVersion"] == 1
        run = await stack.client.start_run("stepping", None)
        done = await stack.client.wait_run(run["id"], timeout=30)
        assert done["status"] == "completed", done
        assert done["output"]["total"] == 10
        assert done["output"]["sdk"].startswith(str(old_sdk))

    sl = stepline.Stepline("secret-new-protocol")
    bases: list[str | None] = []

    @sl.workflow("stepping-now")
    async def stepping_now(ctx: stepline.Context, input: object) -> int:
        total = 0
        for i in range(3):
            total += await ctx.step(f"add-{i}", lambda i=i: i + 1)
            await ctx.sleep(f"nap-{i}", "30ms")
        return total

    async with orchestrator_stack(database_url) as stack, serve(Bases(sl.asgi(), bases)) as url:
        slug = await stack.register(sl, url + "/", "new")
        assert (await stack.client.get_app(slug))["protocolVersion"] == 2
        run = await stack.client.start_run("stepping-now", None)
        done = await stack.client.wait_run(run["id"], timeout=30)
    assert done["status"] == "completed" and done["output"] == 6
    assert bases[0] is None and all(b is not None for b in bases[1:]) and len(bases) > 1
