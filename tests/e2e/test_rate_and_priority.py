"""Rate limits and priorities end to end: orchestrators, a real app over HTTP, the API."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest

import stepline
from stepline_server.store import apps, keys
from tests.e2e.test_egress import internal_service
from tests.support import Stack, app_server, orchestrator_stack, serve


def at(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def api(stack: Stack) -> httpx.AsyncClient:
    """Plain HTTP to the stack's API with its key."""
    auth = {"authorization": f"Bearer {stack.api_key}"}
    return httpx.AsyncClient(base_url=stack.url, headers=auth)


async def invocations(stack: Stack, run_id: str) -> list[dict[str, Any]]:
    """GET /v1/runs/{id}/invocations, oldest first."""
    async with api(stack) as http:
        response = await http.get(f"/v1/runs/{run_id}/invocations")
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()["invocations"]
    return found


async def test_a_rate_limit_spreads_starts_over_its_windows_and_loses_none(
    database_url: str,
) -> None:
    """RateLimit(limit=2, period="1s"), seven runs started at once on two orchestrators: no
    window of a second holds more than two starts (the runs' startedAt, each at or before its
    first invocation), the starts span three periods, every run completes, each invoked once."""
    sl = stepline.Stepline("rate-secret")
    calls: Counter[int] = Counter()

    @sl.workflow("limited", rate_limit=stepline.RateLimit(limit=2, period="1s"))
    async def limited(ctx: stepline.Context, input: Any) -> Any:
        calls[input["n"]] += 1
        return await ctx.step("work", lambda: input["n"])

    async with (
        orchestrator_stack(database_url) as one,
        orchestrator_stack(database_url) as two,
        app_server(sl) as url,
    ):
        await one.register(sl, url)
        [wf] = (await one.client.list_workflows())["workflows"]
        assert wf["options"]["rateLimit"] == {"limit": 2, "periodMs": 1000}
        started = await asyncio.gather(
            *((one.client, two.client)[n % 2].start_run("limited", {"n": n}) for n in range(7))
        )
        done = [await one.client.wait_run(r["id"], timeout=60) for r in started]
        firsts = [(await invocations(one, d["id"]))[0] for d in done]
    assert [d["status"] for d in done] == ["completed"] * 7
    assert calls == Counter(range(7))
    starts = sorted(at(d["startedAt"]) for d in done)
    for t in starts:
        in_window = [s for s in starts if t - timedelta(seconds=1) < s <= t]
        assert len(in_window) <= 2, starts
    assert starts[-1] - starts[0] >= timedelta(seconds=3), starts
    for d, first in zip(done, firsts, strict=True):
        assert at(first["startedAt"]) >= at(d["startedAt"])


async def test_a_rate_limit_key_limits_each_value_on_its_own(database_url: str) -> None:
    """RateLimit(limit=1, period="1h", key="userId"): the first run of each user starts and
    completes; the second of u1 waits (running, never invoked, no startedAt) while u2 and u3
    are not held back by it; cancelled, it ends cancelled at once instead of waiting its turn."""
    sl = stepline.Stepline("rate-key-secret")

    @sl.workflow("per-user", rate_limit=stepline.RateLimit(limit=1, period="1h", key="userId"))
    async def per_user(ctx: stepline.Context, input: Any) -> Any:
        return input["userId"]

    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        client = stack.client
        first = await client.start_run("per-user", {"userId": "u1"})
        second = await client.start_run("per-user", {"userId": "u1"})
        others = [await client.start_run("per-user", {"userId": u}) for u in ("u2", "u3")]
        done = [await client.wait_run(r["id"], timeout=30) for r in (first, *others)]
        waiting = await client.get_run(second["id"])
        never = await invocations(stack, second["id"])
        await client.cancel_run(second["id"])
        cancelled = await client.wait_run(second["id"], timeout=30)
    assert [d["status"] for d in done] == ["completed"] * 3
    assert [d["output"] for d in done] == ["u1", "u2", "u3"]
    assert waiting["status"] == "running" and waiting["startedAt"] is None
    assert never == []
    assert cancelled["status"] == "cancelled"


async def test_runs_of_a_serial_workflow_go_in_priority_order(database_url: str) -> None:
    """Concurrency 1: while a first run holds the slot, runs started with priorities 0, -5, 10,
    0, 50 and -100 wait; once it ends they are invoked highest priority first, runs of equal
    priority oldest first, and each run shows its priority."""
    sl = stepline.Stepline("priority-secret")
    holding = asyncio.Event()
    release = asyncio.Event()
    order: list[str] = []

    @sl.workflow("serial", concurrency=1)
    async def serial(ctx: stepline.Context, input: Any) -> Any:
        async def work() -> str:
            order.append(input["name"])
            if input["name"] == "first":
                holding.set()
                await release.wait()
            return str(input["name"])

        return await ctx.step("work", work)

    priorities = [("a", 0), ("b", -5), ("c", 10), ("d", 0), ("e", 50), ("f", -100)]
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        client = stack.client
        first = await client.start_run("serial", {"name": "first"})
        await asyncio.wait_for(holding.wait(), 30)
        started = [
            await client.start_run("serial", {"name": name}, priority=p) for name, p in priorities
        ]
        release.set()
        done = [await client.wait_run(r["id"], timeout=60) for r in (first, *started)]
    assert [d["status"] for d in done] == ["completed"] * 7
    assert order == ["first", "e", "c", "a", "d", "b", "f"]
    assert [r["priority"] for r in started] == [p for _, p in priorities]
    assert done[0]["priority"] == 0


@pytest.mark.parametrize("priority", [101, -101, 1.5, "1", True, None])
async def test_a_priority_out_of_range_or_not_an_integer_is_refused(
    database_url: str, priority: Any
) -> None:
    """priority must be an integer from -100 to 100: anything else is 422 naming the field,
    and no run is made."""
    sl = stepline.Stepline("priority-bad-secret")

    @sl.workflow("wf")
    async def wf(ctx: stepline.Context, input: Any) -> Any:
        return None

    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        async with api(stack) as http:
            response = await http.post(
                "/v1/runs", json={"workflow": "wf", "input": None, "priority": priority}
            )
        runs = (await stack.client.list_runs())["runs"]
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "validation_failed"
    assert "priority" in error["details"]["fields"]
    assert runs == []


async def test_a_sync_describing_a_cap_and_a_rate_limit_registers_nothing(
    database_url: str,
) -> None:
    """An app (not the SDK, which refuses it) describing a workflow with both a concurrency cap
    and a rate limit: the sync fails saying so, and no workflow is registered."""
    described = {
        "workflows": [
            {"name": "both", "concurrency": 1, "rateLimit": {"limit": 1, "periodMs": 1000}}
        ]
    }
    calls: Counter[str] = Counter()
    body = json.dumps(described).encode()
    async with (
        orchestrator_stack(database_url) as stack,
        serve(internal_service(calls, status=200, body=body)) as url,
        api(stack) as http,
    ):
        async with stack.orchestrator.pool.acquire() as conn:
            row = await apps.create(conn, keys.DEFAULT_PROJECT, "both", f"{url}/", None)
        synced = await http.post(f"/v1/apps/{row['slug']}/sync")
        workflows = (await stack.client.list_workflows())["workflows"]
    assert synced.status_code == 502, synced.text
    assert "both a concurrency cap and a rate limit" in synced.json()["error"]["message"]
    assert workflows == []


async def test_a_child_run_takes_its_parents_priority(database_url: str) -> None:
    """A run started with priority 5 invokes a child: the child run has priority 5 too."""
    sl = stepline.Stepline("priority-child-secret")

    @sl.workflow("parent")
    async def parent(ctx: stepline.Context, input: Any) -> Any:
        return await ctx.invoke("child", "child", {"n": 1})

    @sl.workflow("child")
    async def child(ctx: stepline.Context, input: Any) -> Any:
        return input["n"]

    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        run = await stack.client.start_run("parent", None, priority=5)
        done = await stack.client.wait_run(run["id"], timeout=30)
        [step] = done["steps"]
        kid = await stack.client.get_run(step["childRunId"])
    assert done["status"] == "completed" and done["output"] == 1
    assert (done["priority"], kid["priority"]) == (5, 5)
