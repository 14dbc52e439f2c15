"""The orchestrator's server exits at once with a pull worker's long poll in flight (what
Ctrl-C of ``stepline serve`` or ``stepline dev`` does), and the worker says why a poll failed
without a line per request."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import httpx
import pytest

import stepline
from stepline._worker import Worker
from stepline.cli.worker import configure_logging
from stepline_server.asgi import build_app
from stepline_server.cli import servers, tenancy
from stepline_server.orchestrator import Orchestrator
from stepline_server.store import db, keys
from tests import support
from tests.ports import free_port


async def test_a_waiting_poll_does_not_hold_up_the_servers_exit(database_url: str) -> None:
    """With a worker's poll waiting (60 s asked), asking the server to exit answers the poll
    (204, nothing claimed) and the server stops well before the poll's wait is over."""
    port = free_port()
    orch = Orchestrator(support.test_settings(port=port), database_url)
    server = servers.server(build_app(orch), "127.0.0.1", port)
    serving = asyncio.create_task(server.serve())
    while not server.started:
        assert not serving.done()
        await asyncio.sleep(0.01)
    url = f"http://127.0.0.1:{port}"
    async with orch.pool.acquire() as conn:
        key = await keys.create_key(conn, "t")
    async with stepline.AsyncClient(url, api_key=key) as client:
        app = await client.create_app("workers", kind="pull")
    async with httpx.AsyncClient(base_url=url, timeout=90) as http:
        poll = asyncio.create_task(
            http.post(
                f"/v1/apps/{app['slug']}/poll",
                params={"wait": "60s"},
                headers={"Authorization": f"Bearer {key}"},
            )
        )
        while orch.dispatcher.pollers.waiting == 0:  # until the poll waits in the server
            assert not poll.done()
            await asyncio.sleep(0.01)
        server.should_exit = True  # what Ctrl-C does (servers.stop_on_signals)
        await asyncio.wait_for(serving, timeout=30)
        answer = await asyncio.wait_for(poll, timeout=30)
    assert answer.status_code == 204


async def test_the_worker_logs_why_a_poll_failed(caplog: pytest.LogCaptureFixture) -> None:
    """A poll that cannot reach the orchestrator is logged with its reason; the worker's
    command line keeps httpx's per-request lines out."""
    sl = stepline.Stepline("whsec_t")
    worker = Worker(sl, "http://127.0.0.1:9", "sl_key", "app", wait=1.0)

    class StopOnFailure(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("poll_failed"):
                worker.stop()

    stopper = StopOnFailure()
    logging.getLogger("stepline").addHandler(stopper)
    try:
        with caplog.at_level(logging.INFO, logger="stepline"):
            await asyncio.wait_for(worker._poll_until_stopped(), timeout=30)
    finally:
        logging.getLogger("stepline").removeHandler(stopper)
        await worker.aclose()
    failed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("poll_failed")]
    assert failed and "connect" in failed[0].lower() and "polling again in" in failed[0]
    configure_logging()
    assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)


async def test_stepline_dev_keeps_its_key(database_url: str, tmp_path: Path) -> None:
    """The dev key is made once and given again on the next start; a revoked one is replaced
    by a new one."""
    conn = await db.connect(database_url)
    try:
        await keys.bootstrap(conn)
        first = await tenancy.dev_key(conn, tmp_path)
        assert await tenancy.dev_key(conn, tmp_path) == first
        assert (tmp_path / tenancy.DEV_KEY_FILE).stat().st_mode & 0o777 == 0o600
        row = await keys.find_key(conn, first)
        assert row is not None and row["role"] == "owner"
        await keys.revoke_key(conn, row["id"], None)
        second = await tenancy.dev_key(conn, tmp_path)
        assert second != first and await keys.find_key(conn, second) is not None
        named = [
            r for r in await keys.project_keys(conn, keys.DEFAULT_PROJECT) if r["name"] == "dev"
        ]
        assert len(named) == 1  # one active dev key, not one per start
    finally:
        await conn.close()
