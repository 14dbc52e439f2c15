"""Test helpers: a real orchestrator and real SDK apps served by uvicorn on loopback ports."""

from __future__ import annotations

import asyncio
import contextlib
import io
import subprocess
import tarfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

import stepline
from stepline._worker import Worker
from stepline_server.asgi import build_app
from stepline_server.orchestrator import Orchestrator
from stepline_server.settings import Settings
from stepline_server.store import apps, db, keys
from tests.ports import free_port


def unpack_sdk(commit: str, folder: Path) -> None:
    """The SDK package as it was at ``commit`` of this repository, unpacked into ``folder``
    (``folder/sdk/stepline``): an older SDK for an app to run on."""
    root = Path(__file__).resolve().parents[1]
    archive = subprocess.run(
        ["git", "-C", str(root), "archive", "--format=tar", commit, "sdk/stepline"],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")


async def read_body(receive: Any) -> bytes:
    """The whole body of an ASGI request."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


async def lifespan(receive: Any, send: Any) -> None:
    """Answer an ASGI lifespan's startup and shutdown, for a test's bare ASGI app."""
    while (await receive())["type"] != "lifespan.shutdown":
        await send({"type": "lifespan.startup.complete"})
    await send({"type": "lifespan.shutdown.complete"})


@contextlib.asynccontextmanager
async def serve(app: Any, port: int | None = None) -> AsyncIterator[str]:
    """Serve an ASGI app with uvicorn on 127.0.0.1; yields its base URL."""
    port = port or free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="on",
        loop="asyncio",
        proxy_headers=False,  # as `stepline serve`: STEPLINE_TRUSTED_PROXIES decides
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError("server did not start")
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


@dataclass
class Stack:
    """An orchestrator on real HTTP with an API key and a client."""

    orchestrator: Orchestrator
    url: str
    api_key: str
    client: stepline.AsyncClient

    async def register(self, sl: stepline.Stepline, app_url: str, name: str = "app") -> str:
        """Register an SDK app under ``name`` with the Stepline's secret, and sync it."""
        secret = sl.signing_secrets[0]
        async with self.orchestrator.pool.acquire() as conn:
            row = await apps.create(conn, keys.DEFAULT_PROJECT, name, app_url, secret)
            assert row is not None
        await self.client.sync_app(row["slug"])
        return str(row["slug"])

    async def register_pull(self, name: str = "app") -> str:
        """Register a pull app under ``name`` (its worker syncs it); its slug."""
        app = await self.client.create_app(name, kind="pull")
        return str(app["slug"])

    async def conn(self) -> db.Conn:
        return await db.connect(self.orchestrator.dsn)


async def until(probe: Any, what: str, timeout: float = 20.0) -> Any:
    """Poll the coroutine function ``probe`` until it answers something truthy; fail after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def test_settings(**changes: Any) -> Settings:
    """Settings for tests: short leases and polls so recovery is quick."""
    base = Settings(lease_seconds=3.0, poll_seconds=0.5, invoke_timeout_seconds=10.0)
    return base.with_(**changes)


@contextlib.asynccontextmanager
async def orchestrator_stack(database_url: str, **settings: Any) -> AsyncIterator[Stack]:
    """A running orchestrator (API and loops) on a free port, with a key and a client."""
    port = free_port()
    s = test_settings(port=port, **settings)
    orch = Orchestrator(s, database_url)
    async with serve(build_app(orch), port) as url:
        async with orch.pool.acquire() as conn:
            key = await keys.create_key(conn, "test")
        async with stepline.AsyncClient(url, api_key=key) as client:
            yield Stack(orch, url, key, client)


@contextlib.asynccontextmanager
async def worker(
    stack: Stack, sl: stepline.Stepline, app: str, *, concurrency: int = 10
) -> AsyncIterator[Worker]:
    """A pull app's worker running in this process (as an asyncio task), synced before it
    yields; stopped (its invocations cancelled) on leaving."""
    w = Worker(sl, stack.url, stack.api_key, app, concurrency=concurrency, wait=5.0)
    await w.sync()
    task = asyncio.create_task(w.run())
    try:
        yield w
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await w.aclose()
        await sl.aclose()  # the progress calls' connections, as the handler's shutdown does


@contextlib.asynccontextmanager
async def hosted(stack: Stack, sl: stepline.Stepline, kind: str) -> AsyncIterator[str]:
    """``sl``'s workflows hosted as a ``push`` app (served on loopback and synced) or a
    ``pull`` app (a worker in this process); yields the app's slug."""
    if kind == "push":
        async with app_server(sl) as url:
            yield await stack.register(sl, url)
    else:
        slug = await stack.register_pull()
        async with worker(stack, sl, slug):
            yield slug


@contextlib.asynccontextmanager
async def app_server(sl: stepline.Stepline, port: int | None = None) -> AsyncIterator[str]:
    """Serve a Stepline's handler; yields the URL the orchestrator should invoke."""
    async with serve(sl.asgi(), port) as url:
        yield url + "/"
