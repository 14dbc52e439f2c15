"""A debounce and a batch survive the orchestrator's SIGKILL: every start and event it
acknowledged is in the run that fires after a restart, once."""

from __future__ import annotations

from typing import Any

import pytest

import stepline
from stepline_server.store import apps, db, keys
from tests import processes
from tests.ports import free_port
from tests.support import app_server

pytestmark = pytest.mark.slow

SECRET = "whsec_gathering_crash"


def _app(seen: list[Any]) -> stepline.Stepline:
    sl = stepline.Stepline(SECRET)

    @sl.workflow("digest", debounce=stepline.Debounce("2s", key="userId"))
    async def digest(ctx: stepline.Context, input: Any) -> Any:
        seen.append(("digest", input))
        return input

    @sl.workflow("mailer", on_event="email.queued", batch=stepline.Batch(50, "2s"))
    async def mailer(ctx: stepline.Context, input: list[Any]) -> int:
        seen.append(("mailer", input))
        return len(input)

    return sl


# A connection's stream writer is collected unclosed once the orchestrator it led to is gone
# (seen with a graceful stop too, and not yet traced to its pool): it says nothing of the runs.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_an_orchestrator_killed_while_starts_and_events_gather_loses_none(
    database_url: str,
) -> None:
    """Three debounced starts and five batched events are acknowledged, then the orchestrator
    is killed with SIGKILL before either gathering fires; a restarted one fires both: the
    debounced run starts once with the last input, the batch once with all five events."""
    port = free_port()
    env = {
        "DATABASE_URL": database_url,
        "STEPLINE_PORT": str(port),
        "STEPLINE_LEASE_SECONDS": "2",
        "STEPLINE_POLL_SECONDS": "0.5",
        "STEPLINE_LOG_LEVEL": "warning",
    }
    base = f"http://127.0.0.1:{port}"
    seen: list[Any] = []
    sl = _app(seen)
    conn = await db.connect(database_url)
    orch = processes.spawn(env)
    try:
        await processes.until_up(base + "/healthz", orch)
        key = await keys.create_key(conn, "crash")
        async with (
            app_server(sl) as app_url,
            stepline.AsyncClient(base, api_key=key) as client,
        ):
            row = await apps.create(conn, keys.DEFAULT_PROJECT, "app", app_url, SECRET)
            await client.sync_app(row["slug"])
            started = [await client.start_run("digest", {"userId": "u", "n": n}) for n in range(3)]
            sent = [await client.send_event("email.queued", {"n": n}) for n in range(5)]
            processes.kill(orch)  # before the 2 s of either gathering are over
            assert seen == []
            [run_id] = {s["id"] for s in started}
            [batch_id] = {s["startedRuns"][0] for s in sent}
            orch = processes.spawn(env)
            await processes.until_up(base + "/healthz", orch)
            digest = await client.wait_run(run_id, timeout=30)
            batch = await client.wait_run(batch_id, timeout=30)
        assert digest["status"] == "completed" and digest["output"] == {"userId": "u", "n": 2}
        assert batch["status"] == "completed" and batch["output"] == 5
        assert batch["input"] == [{"n": n} for n in range(5)]
        assert sorted(kind for kind, _ in seen) == ["digest", "mailer"]
        history = await client.list_run_events(run_id)
        [debounced] = [e for e in history["events"] if e["type"] == "run.debounced"]
        assert debounced["data"]["starts"] == 3
    finally:
        processes.kill(orch)
        await conn.close()
        await sl.aclose()  # its progress calls' connections
