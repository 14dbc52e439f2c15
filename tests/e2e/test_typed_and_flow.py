"""Typed workflows, events that start runs, and flow control, end to end over real HTTP."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from pydantic import BaseModel, field_validator

import stepline
from tests.support import app_server, orchestrator_stack


class Order(BaseModel):
    orderId: str
    amount: int


class Receipt(BaseModel):
    orderId: str
    total: int


async def test_a_typed_workflow_gets_models_and_bad_input_makes_no_run(database_url: str) -> None:
    """input: Order arrives as an Order; a step with type=Receipt returns a Receipt on the first
    execution and on replay; the schemas are registered; a bad input is 422 naming the field
    and makes no run; Client.start_run takes a model."""
    sl = stepline.Stepline("typed-secret", parked_runs=0)  # the invocation after the sleep replays
    seen: list[str] = []

    @sl.workflow("checkout")
    async def checkout(ctx: stepline.Context, input: Order) -> Receipt:
        seen.append(type(input).__name__)

        def bill(order_id: str, amount: int) -> Receipt:
            return Receipt(orderId=order_id, total=amount * 2)

        receipt = await ctx.step("bill", bill, input.orderId, input.amount, type=Receipt)
        seen.append(type(receipt).__name__)
        await ctx.sleep("pause", "10ms")  # a second invocation replays the step
        return receipt

    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        [wf] = (await stack.client.list_workflows())["workflows"]
        assert wf["inputSchema"]["properties"]["orderId"]["type"] == "string"
        assert wf["outputSchema"]["title"] == "Receipt"
        with pytest.raises(stepline.ApiError) as bad:
            await stack.client.start_run("checkout", {"orderId": 7})
        assert bad.value.status == 422 and bad.value.code == "validation_failed"
        assert set(bad.value.details["fields"]) == {"input.orderId", "input"}
        assert (await stack.client.list_runs())["runs"] == []
        run = await stack.client.start_run("checkout", Order(orderId="o-1", amount=21))
        done = await stack.client.wait_run(run["id"], timeout=30)
    assert done["status"] == "completed", done
    assert done["output"] == {"orderId": "o-1", "total": 42}
    assert seen == ["Order", "Receipt", "Order", "Receipt"]


class Unknown(Exception):
    """A validator's own exception class."""


class KnownOrder(BaseModel):
    orderId: str

    @field_validator("orderId")
    @classmethod
    def known(cls, value: str) -> str:
        if value.startswith("x"):
            raise Unknown(f"no such order {value}")
        return value


async def test_input_the_workflow_refuses_fails_the_run_at_once(database_url: str) -> None:
    """An input that passes the schema but that the model's validator refuses with its own
    exception fails the run on its first invocation with validation_failed naming the
    exception, with no delivery failure and without running the workflow."""
    sl = stepline.Stepline("refuse-secret")
    ran: list[str] = []

    @sl.workflow("ship")
    async def ship(ctx: stepline.Context, input: KnownOrder) -> str:
        ran.append(input.orderId)
        return input.orderId

    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        run = await stack.client.start_run("ship", {"orderId": "x-9"})
        done = await stack.client.wait_run(run["id"], timeout=30)
        events = [e async for e in stack.client.iter_run_events(run["id"])]
    assert done["status"] == "failed", done
    assert done["error"]["code"] == "validation_failed" and done["error"]["type"] == "Unknown"
    assert "no such order x-9" in done["error"]["message"]
    ended = [e["data"]["outcome"] for e in events if e["type"] == "invocation.ended"]
    assert ended == ["failed"] and ran == []


async def test_an_event_starts_one_run_however_often_it_is_sent(database_url: str) -> None:
    """on_event="order.created": an event starts one run with its data as input, trigger
    "event" and eventId; the same id sent again (to either of two orchestrators, at once)
    starts nothing more and answers the first send."""
    sl = stepline.Stepline("on-event-secret")

    @sl.workflow("welcome", on_event="order.created")
    async def welcome(ctx: stepline.Context, input: Any) -> Any:
        return {"hello": input["user"]}

    async with (
        orchestrator_stack(database_url) as one,
        orchestrator_stack(database_url) as two,
        app_server(sl) as url,
    ):
        await one.register(sl, url)
        sends = [
            client.send_event("order.created", {"user": "u1"}, id="evt-1")
            for client in (one.client, two.client, one.client)
        ]
        answers = await asyncio.gather(*sends)
        started = {tuple(a["startedRuns"]) for a in answers}
        assert len(started) == 1 and len(next(iter(started))) == 1, answers
        assert sum(1 for a in answers if a.get("deduplicated")) == 2
        assert {a["id"] for a in answers} == {"evt-1"}
        [run_id] = next(iter(started))
        done = await one.client.wait_run(run_id, timeout=30)
        runs = (await one.client.list_runs(workflow="welcome"))["runs"]
    assert done["status"] == "completed" and done["output"] == {"hello": "u1"}
    assert done["trigger"] == "event" and done["eventId"]
    assert [r["id"] for r in runs] == [run_id]


async def test_a_concurrency_key_runs_one_user_at_a_time_while_others_go_on(
    database_url: str,
) -> None:
    """Concurrency(limit=1, key="userId"), two orchestrators: the app never sees two runs of
    one user at once, yet runs of different users overlap; every run completes."""
    sl = stepline.Stepline("keyed-secret")
    inflight: Counter[str] = Counter()
    most: Counter[str] = Counter()
    overall = {"now": 0, "most": 0}

    @sl.workflow("per-user", concurrency=stepline.Concurrency(limit=1, key="userId"))
    async def per_user(ctx: stepline.Context, input: Any) -> Any:
        async def work() -> str:
            user = input["userId"]
            inflight[user] += 1
            overall["now"] += 1
            most[user] = max(most[user], inflight[user])
            overall["most"] = max(overall["most"], overall["now"])
            await asyncio.sleep(0.3)
            inflight[user] -= 1
            overall["now"] -= 1
            return user

        return await ctx.step("work", work)

    async with (
        orchestrator_stack(database_url) as one,
        orchestrator_stack(database_url) as two,
        app_server(sl) as url,
    ):
        await one.register(sl, url)
        started = []
        for n in range(8):
            client = (one.client, two.client)[n % 2]
            started.append(await client.start_run("per-user", {"userId": f"u{n % 2}", "n": n}))
        done = [await one.client.wait_run(r["id"], timeout=60) for r in started]
    assert [d["status"] for d in done] == ["completed"] * 8
    assert most == Counter({"u0": 1, "u1": 1}), most
    assert overall["most"] == 2, overall


async def test_a_singleton_key_answers_the_active_run(database_url: str) -> None:
    """singleton_key="userId": a second start for a user whose run has not ended answers that
    run (200, deduplicated); once it has ended, a new run starts; other users are not held."""
    sl = stepline.Stepline("singleton-secret")

    @sl.workflow("sync-user", singleton_key="userId")
    async def sync_user(ctx: stepline.Context, input: Any) -> Any:
        cb = await ctx.callback("go")
        await ctx.step("publish", lambda: cb.id)
        return await cb.wait()

    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        first = await stack.client.start_run("sync-user", {"userId": "u1"})
        again = await stack.client.start_run("sync-user", {"userId": "u1", "other": 1})
        other = await stack.client.start_run("sync-user", {"userId": "u2"})
        assert again["id"] == first["id"] and again["deduplicated"] is True
        assert other["id"] != first["id"]
        for _ in range(200):
            steps = {s["name"]: s for s in (await stack.client.get_run(first["id"]))["steps"]}
            if steps.get("publish", {}).get("status") == "completed":
                break
            await asyncio.sleep(0.05)
        await stack.client.complete_callback(steps["publish"]["output"], {"ok": 1})
        await stack.client.wait_run(first["id"], timeout=30)
        later = await stack.client.start_run("sync-user", {"userId": "u1"})
    assert later["id"] != first["id"] and later["status"] == "running"
