"""An alert survives the orchestrator's SIGKILL: the notification recorded with the failed
run is delivered after a restart, under the id it was recorded with."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

import stepline
from stepline_server.store import apps, db, keys
from tests import processes
from tests.ports import free_port
from tests.receiver import Receiver
from tests.support import app_server

pytestmark = pytest.mark.slow

SECRET = "whsec_alert_crash"


def _explode() -> None:
    raise stepline.TerminalError("card declined")


def _app() -> stepline.Stepline:
    sl = stepline.Stepline(SECRET)

    @sl.workflow("boom", retries=stepline.Retries(attempts=1))
    async def boom(ctx: stepline.Context, input: Any) -> None:
        await ctx.step("explode", _explode)

    return sl


async def test_orchestrator_killed_right_after_a_run_failed_still_delivers_its_alert(
    database_url: str,
) -> None:
    """The run fails while the receiver is down; the orchestrator is killed with SIGKILL at
    once. The notification is in the database, pending; once the receiver is up and the
    orchestrator restarted, the receiver gets it with that id, and it is delivered."""
    port, hook_port = free_port(), free_port()
    env = {
        "DATABASE_URL": database_url,
        "STEPLINE_PORT": str(port),
        "STEPLINE_LEASE_SECONDS": "2",
        "STEPLINE_POLL_SECONDS": "0.5",
        "STEPLINE_LOG_LEVEL": "warning",
    }
    base = f"http://127.0.0.1:{port}"
    conn = await db.connect(database_url)
    orch = processes.spawn(env)
    try:
        await processes.until_up(base + "/healthz", orch)
        key = await keys.create_key(conn, "crash")
        async with (
            app_server(_app()) as app_url,
            stepline.AsyncClient(base, api_key=key) as client,
        ):
            row = await apps.create(conn, keys.DEFAULT_PROJECT, "app", app_url, SECRET)
            await client.sync_app(row["slug"])
            hook = f"http://127.0.0.1:{hook_port}/hook"
            alert = await client.create_alert(
                "ops", ["run.failed"], {"type": "webhook", "url": hook}
            )
            run = await client.start_run("boom", {})
            ended = await client.wait_run(run["id"], timeout=30)
            assert ended["status"] == "failed"
            processes.kill(orch)
            [pending] = await conn.fetch(
                "SELECT id, status FROM alert_notifications WHERE run_id = $1",
                uuid.UUID(run["id"]),
            )
            assert pending["status"] == "pending"
            async with Receiver().running(hook_port) as rx:
                orch = processes.spawn(env)
                await processes.until_up(base + "/healthz", orch)
                [got] = await rx.until(1, seconds=90)
                for _ in range(200):
                    [d] = (await client.list_alert_deliveries(alert["id"]))["deliveries"]
                    if d["status"] == "delivered":
                        break
                    await asyncio.sleep(0.05)
        body = stepline.verify_webhook(got.body, got.headers["stepline-signature"], alert["secret"])
        assert body["id"] == str(pending["id"]) == d["id"]
        assert body["run"]["id"] == run["id"] and d["status"] == "delivered"
    finally:
        processes.kill(orch)
        await conn.close()
