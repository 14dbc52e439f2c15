"""Two orchestrators on one database share the work and never run a step twice."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from typing import Any

import httpx

import stepline
from stepline_server.store import db
from tests.support import app_server, orchestrator_stack


async def test_two_orchestrators_split_runs_without_duplicates(database_url: str) -> None:
    """30 runs of 3 steps and a short sleep, with two orchestrators claiming: every step ran
    exactly once and every run was invoked exactly twice (before and after its sleep)."""
    ran: Counter[str] = Counter()
    sl = stepline.Stepline("two-orch")

    @sl.workflow("count")
    async def count(ctx: stepline.Context, input: int) -> int:
        total = 0
        for name in ("a", "b", "c"):

            def work(name: str = name) -> int:
                ran[f"{input}:{name}"] += 1
                return 1

            total += await ctx.step(name, work)
            if name == "b":
                await ctx.sleep("pause", 0.3)
        return total

    async with (
        orchestrator_stack(database_url) as one,
        orchestrator_stack(database_url) as two,
        app_server(sl) as url,
    ):
        await one.register(sl, url)
        runs = await asyncio.gather(*(one.client.start_run("count", i) for i in range(30)))
        done = await asyncio.gather(*(two.client.wait_run(r["id"], timeout=60) for r in runs))
        assert [d["status"] for d in done] == ["completed"] * 30
        assert ran == Counter({f"{i}:{n}": 1 for i in range(30) for n in "abc"})
        conn = await db.connect(database_url)
        try:
            leased = await conn.fetchval("SELECT count(*) FROM runs WHERE lease_token IS NOT NULL")
            assert leased == 0
            invocations = await conn.fetch(
                "SELECT run_id, count(*) AS n FROM run_events WHERE type = 'invocation.started'"
                " GROUP BY run_id"
            )
            assert len(invocations) == 30 and all(r["n"] == 2 for r in invocations)
        finally:
            await conn.close()


async def test_stale_invocation_writes_are_refused(database_url: str) -> None:
    """A progress call with a token that no longer holds the lease is 409 and writes nothing."""
    sl = stepline.Stepline("stale")

    @sl.workflow("one")
    async def one_step(ctx: stepline.Context, input: Any) -> int:
        return await ctx.step("x", lambda: 1)  # type: ignore[no-any-return]

    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        run = await stack.client.start_run("one", None)
        await stack.client.wait_run(run["id"], timeout=20)
        body = {"runId": run["id"], "updates": [{"name": "y", "kind": "run", "action": "start"}]}
        invocation = str(uuid.uuid4())
        stale = stack.orchestrator.signer.invocation_token(invocation, "not-the-lease")
        async with httpx.AsyncClient(base_url=stack.url) as http:
            answer = await http.post(
                f"/v1/invocations/{invocation}/progress",
                json=body,
                headers={"authorization": f"Bearer {stale}"},
            )
            assert answer.status_code == 409
            assert answer.json()["error"]["code"] == "stale_invocation"
            forged = await http.post(
                f"/v1/invocations/{invocation}/progress",
                json=body,
                headers={"authorization": "Bearer not-a-token-it-made"},
            )
            assert forged.status_code == 401
            unsigned = await http.post(f"/v1/invocations/{uuid.uuid4()}/progress", json=body)
            assert unsigned.status_code == 401
        final = await stack.client.get_run(run["id"])
        assert [s["name"] for s in final["steps"]] == ["x"]
