"""The schedules API end to end: a real orchestrator over HTTP driven with ``AsyncClient``, and
schedules declared in an SDK app's code."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

import stepline
from stepline_server.store import apps, keys
from tests.support import Stack, app_server, orchestrator_stack

YEARLY = "0 0 1 1 *"  # never due while a test runs


@pytest.fixture
async def stack(database_url: str) -> AsyncIterator[Stack]:
    """An orchestrator with the workflow ``report`` registered (its app answers nothing)."""
    async with orchestrator_stack(database_url) as s:
        async with s.orchestrator.pool.acquire() as conn:
            app = await apps.create(conn, keys.DEFAULT_PROJECT, "reports", "http://127.0.0.1:9/")
            assert app is not None
            await apps.record_sync(conn, app, [("report", {"retries": {"attempts": 1}})], None)
        yield s


async def api_error(call: Awaitable[Any], status: int, code: str) -> stepline.ApiError:
    with pytest.raises(stepline.ApiError) as info:
        await call
    assert (info.value.status, info.value.code) == (status, code), info.value
    return info.value


def raw(stack: Stack) -> httpx.AsyncClient:
    """A plain HTTP client with the API key, to see status codes."""
    return httpx.AsyncClient(
        base_url=stack.url, headers={"Authorization": f"Bearer {stack.api_key}"}, timeout=10
    )


async def test_schedule_lifecycle(stack: Stack) -> None:
    """Create, read, list, change, pause, resume, trigger and delete a schedule."""
    c = stack.client
    created = await c.create_schedule(
        "report", YEARLY, timezone="Europe/Paris", input={"k": 1}, overlap="skip"
    )
    sid = created["id"]
    assert sid.startswith("wfs_")
    assert (created["status"], created["version"], created["source"]) == ("active", 1, "api")
    assert (created["overlap"], created["misfire"], created["disableAfter"]) == (
        "skip",
        "fire_once",
        20,
    )
    assert created["nextFireAt"].endswith("Z") and created["lastFireAt"] is None
    assert await c.get_schedule(sid) == created

    changed = await c.update_schedule(sid, cron="0 6 1 1 *", timezone="UTC", disable_after=0)
    assert (changed["cron"], changed["version"], changed["disableAfter"]) == ("0 6 1 1 *", 2, 0)
    assert changed["nextFireAt"] != created["nextFireAt"]
    assert changed["nextFireAt"][4:] == "-01-01T06:00:00Z"

    paused = await c.pause_schedule(sid)
    assert (paused["status"], paused["nextFireAt"], paused["version"]) == ("paused", None, 3)
    resumed = await c.resume_schedule(sid)
    assert (resumed["status"], resumed["version"]) == ("active", 4)
    assert resumed["nextFireAt"] == changed["nextFireAt"]

    run = await c.trigger_schedule(sid)
    assert (run["workflow"], run["trigger"], run["scheduleId"], run["input"]) == (
        "report",
        "manual",
        sid,
        {"k": 1},
    )
    assert run["scheduledAt"] is not None
    assert (await c.get_run(run["id"]))["scheduleId"] == sid

    await c.delete_schedule(sid)
    await api_error(c.get_schedule(sid), 404, "not_found")
    await api_error(c.delete_schedule(sid), 404, "not_found")
    assert (await c.get_run(run["id"]))["id"] == run["id"]  # its runs stay


async def test_status_codes(stack: Stack) -> None:
    """Create and trigger answer 201, PATCH, pause and resume 200, DELETE 204."""
    async with raw(stack) as http:
        body = {"workflow": "report", "cron": "@yearly", "timezone": "UTC"}
        created = await http.post("/v1/schedules", json=body)
        assert created.status_code == 201, created.text
        sid = created.json()["id"]
        base = f"/v1/schedules/{sid}"
        assert (await http.patch(base, json={"input": None})).status_code == 200
        assert (await http.post(f"{base}/pause")).status_code == 200
        assert (await http.post(f"{base}/resume")).status_code == 200
        assert (await http.post(f"{base}/trigger")).status_code == 201
        assert (await http.delete(base)).status_code == 204


async def test_list_is_paginated(stack: Stack) -> None:
    """Schedules list oldest first, a page at a time, with a cursor to the next page."""
    ids = [(await stack.client.create_schedule("report", YEARLY))["id"] for _ in range(3)]
    first = await stack.client.list_schedules(limit=2)
    assert [s["id"] for s in first["schedules"]] == ids[:2]
    assert first["nextCursor"]
    second = await stack.client.list_schedules(limit=2, cursor=first["nextCursor"])
    assert [s["id"] for s in second["schedules"]] == ids[2:]
    assert second["nextCursor"] is None


@pytest.mark.parametrize(
    ("cron", "timezone", "field", "says"),
    [
        ("61 * * * *", "UTC", "cron", "not a valid cron"),
        ("* * *", "UTC", "cron", "expected 5"),
        ("@fortnightly", "UTC", "cron", "not supported"),
        ("@daily", "Mars/Olympus", "timezone", "not a known IANA time zone"),
    ],
)
async def test_invalid_cron_or_timezone_is_422_naming_it(
    stack: Stack, cron: str, timezone: str, field: str, says: str
) -> None:
    """A cron or time zone that does not parse is 422 validation_failed naming the field."""
    error = await api_error(
        stack.client.create_schedule("report", cron, timezone=timezone), 422, "validation_failed"
    )
    assert says in error.message
    assert list(error.details["fields"]) == [field]
    assert (await stack.client.list_schedules())["schedules"] == []


async def test_invalid_changes_are_422_and_change_nothing(stack: Stack) -> None:
    """A PATCH with a bad cron, a null field or no field is 422, and the schedule is unchanged."""
    c = stack.client
    sid = (await c.create_schedule("report", YEARLY))["id"]
    error = await api_error(
        c.update_schedule(sid, timezone="Nowhere/Land"), 422, "validation_failed"
    )
    assert list(error.details["fields"]) == ["timezone"]
    error = await api_error(c.update_schedule(sid, cron=None), 422, "validation_failed")
    assert list(error.details["fields"]) == ["cron"]
    await api_error(c.update_schedule(sid), 422, "validation_failed")
    await api_error(c.update_schedule(sid, overlap="sometimes"), 422, "validation_failed")
    assert (await c.get_schedule(sid))["version"] == 1


async def test_unknown_workflow_or_schedule_is_404(stack: Stack) -> None:
    """A schedule for an unregistered workflow, or an unknown schedule id, is 404 not_found."""
    c = stack.client
    await api_error(c.create_schedule("nope", "@daily"), 404, "not_found")
    for call in (
        c.get_schedule("wfs_0000000000"),
        c.pause_schedule("wfs_0000000000"),
        c.resume_schedule("wfs_0000000000"),
        c.trigger_schedule("wfs_0000000000"),
        c.update_schedule("not-an-id", input=1),
    ):
        await api_error(call, 404, "not_found")


async def test_pausing_a_disabled_schedule_is_409(stack: Stack) -> None:
    """Pause answers 409 invalid_state for a disabled schedule; resume re-enables it."""
    sid = (await stack.client.create_schedule("report", YEARLY))["id"]
    async with stack.orchestrator.pool.acquire() as conn:
        await conn.execute(
            "UPDATE schedules SET status = 'disabled', consecutive_failures = 20 WHERE id = $1",
            sid,
        )
    await api_error(stack.client.pause_schedule(sid), 409, "invalid_state")
    resumed = await stack.client.resume_schedule(sid)
    assert (resumed["status"], resumed["consecutiveFailures"]) == ("active", 0)


async def test_code_schedule_fires_through_the_running_loop(database_url: str) -> None:
    """A schedule declared with ``@sl.workflow(schedule=...)`` is registered by sync, and the
    running scheduler loop turns its due tick into a run that completes with a start lag."""
    sl = stepline.Stepline("secret-schedules")

    @sl.workflow("nightly", schedule={"cron": "* * * * *", "input": {"n": 1}})
    async def nightly(ctx: stepline.Context, input: dict[str, int]) -> int:
        return input["n"] + 1

    async with orchestrator_stack(database_url) as stack, app_server(sl) as app_url:
        await stack.register(sl, app_url)
        (schedule,) = (await stack.client.list_schedules())["schedules"]
        assert (schedule["workflow"], schedule["source"], schedule["input"]) == (
            "nightly",
            "code",
            {"n": 1},
        )
        # Rather than wait for a tick, move the schedule's cursor to just before the last one.
        now = datetime.now(UTC)
        if now.second >= 50:  # keep the next minute's tick out of the picture
            await asyncio.sleep(61 - now.second)
            now = datetime.now(UTC)
        tick = now.replace(second=0, microsecond=0)
        async with stack.orchestrator.pool.acquire() as conn:
            await conn.execute(
                "UPDATE schedules SET last_tick_at = $2, next_fire_at = $3 WHERE id = $1",
                schedule["id"],
                tick - timedelta(seconds=30),
                tick,
            )
        stack.orchestrator.scheduler.wake()
        async with raw(stack) as http:
            for _ in range(200):
                found = (await http.get("/v1/runs", params={"workflow": "nightly"})).json()
                if found["runs"]:
                    break
                await asyncio.sleep(0.05)
        (run,) = found["runs"]
        done = await stack.client.wait_run(run["id"], timeout=20)
        assert (done["status"], done["output"], done["trigger"]) == ("completed", 2, "schedule")
        assert (done["scheduleId"], done["scheduledAt"]) == (
            schedule["id"],
            tick.isoformat().replace("+00:00", "Z"),
        )
        assert isinstance(done["startLagMs"], int) and done["startLagMs"] >= 0
        assert (await stack.client.get_schedule(schedule["id"]))["lastFireAt"] == done[
            "scheduledAt"
        ]
