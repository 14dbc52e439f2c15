"""Alerts end to end: a real orchestrator, a real app and a real webhook receiver on loopback.
Each notification type reaches the receiver, signed, and is tried again until answered."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest

import stepline
from stepline._worker import Worker
from stepline_server.store import alerts, keys
from tests.receiver import Receiver
from tests.support import Stack, app_server, orchestrator_stack

SECRET = "whsec_alerts_app"


def _explode() -> None:
    raise stepline.TerminalError("card declined")


def build_app() -> stepline.Stepline:
    sl = stepline.Stepline(SECRET)

    @sl.workflow("boom", retries=stepline.Retries(attempts=1))
    async def boom(ctx: stepline.Context, input: Any) -> None:
        await ctx.step("explode", _explode)

    @sl.workflow("slow", timeout="1s")
    async def slow(ctx: stepline.Context, input: Any) -> None:
        await ctx.sleep("nap", "1h")

    @sl.workflow("quick")
    async def quick(ctx: stepline.Context, input: Any) -> int:
        return await ctx.step("one", lambda: 1)

    @sl.workflow("waiting")
    async def waiting(ctx: stepline.Context, input: Any) -> Any:
        cb = await ctx.callback("approval", timeout="1h")
        return await cb.wait()

    return sl


@dataclass
class Env:
    stack: Stack
    app_url: str

    @property
    def client(self) -> stepline.AsyncClient:
        return self.stack.client

    async def alert(self, url: str, on: list[str], **extra: Any) -> dict[str, Any]:
        kind = extra.pop("kind", "webhook")
        return await self.client.create_alert(
            "ops", on, {"type": kind, "url": url}, workflow=extra.get("workflow")
        )

    async def ended(self, run_id: str) -> dict[str, Any]:
        run = await self.client.wait_run(run_id, timeout=30)
        assert run["status"] not in ("running", "cancelling"), run
        return run

    async def deliveries(
        self, alert_id: str, check: Callable[[list[dict[str, Any]]], bool]
    ) -> list[dict[str, Any]]:
        for _ in range(600):
            page = await self.client.list_alert_deliveries(alert_id)
            if check(page["deliveries"]):
                return list(page["deliveries"])
            await asyncio.sleep(0.05)
        raise AssertionError(f"deliveries never got there: {page}")


def delivered(n: int) -> Callable[[list[dict[str, Any]]], bool]:
    return lambda ds: len(ds) >= n and all(d["status"] == "delivered" for d in ds)


@pytest.fixture
async def env(database_url: str) -> AsyncIterator[Env]:
    async with orchestrator_stack(database_url) as stack, app_server(build_app()) as url:
        await stack.register(build_app(), url)
        yield Env(stack, url)


async def test_run_failed_is_signed_and_sent_again_after_a_503_with_the_same_id(
    env: Env,
) -> None:
    """A failed run's notification reaches a receiver that answers 503 first: it is sent again
    with the same id and body, signed with the alert's secret (verify_webhook accepts it and
    refuses another secret), and the deliveries list shows two attempts, delivered."""
    async with Receiver(answers=[503]).running() as rx:
        alert = await env.alert(rx.url, ["run.failed"], workflow="boom")
        assert alert["secret"].startswith("whsec_")
        run = await env.client.start_run("boom", {})
        ended = await env.ended(run["id"])
        assert ended["status"] == "failed"
        first, second = await rx.until(2)
        [d] = await env.deliveries(alert["id"], delivered(1))
    assert first.body == second.body
    body = stepline.verify_webhook(
        second.body, second.headers["stepline-signature"], alert["secret"]
    )
    assert body["id"] == d["id"] and body["type"] == "run.failed"
    assert body["alert"] == {"id": alert["id"], "name": "ops"}
    assert body["environment"]["name"] == "production"
    assert set(body["project"]) == {"id", "name"}
    assert body["run"]["id"] == run["id"] and body["run"]["workflow"] == "boom"
    assert body["run"]["status"] == "failed" and body["run"]["error"] == ended["error"]
    assert body["run"]["url"] == f"{env.stack.url}/ui/runs/{run['id']}"
    assert body["app"]["name"] == "app"
    with pytest.raises(stepline.SteplineError):
        stepline.verify_webhook(second.body, second.headers["stepline-signature"], "whsec_other")
    assert d["attempts"] == 2 and d["lastHttpStatus"] == 200 and d["lastError"] is None
    assert d["type"] == "run.failed" and d["deliveredAt"] is not None


async def test_run_timed_out(env: Env) -> None:
    """A run past its time limit sends run.timedOut."""
    async with Receiver().running() as rx:
        alert = await env.alert(rx.url, ["run.timedOut", "run.failed"])
        run = await env.client.start_run("slow", {})
        assert (await env.ended(run["id"]))["status"] == "timedOut"
        [got] = await rx.until(1)
        await env.deliveries(alert["id"], delivered(1))
    assert got.json["type"] == "run.timedOut" and got.json["run"]["status"] == "timedOut"


async def test_app_unreachable(env: Env) -> None:
    """A run whose app cannot be reached within its delivery window fails with
    app_unreachable and sends app.unreachable (and run.failed, which the alert also lists)."""
    far = stepline.Stepline(SECRET)

    @far.workflow("far", delivery_window="1s")
    async def far_away(ctx: stepline.Context, input: Any) -> None:
        await ctx.step("never", lambda: None)

    async with Receiver().running() as rx:
        alert = await env.alert(rx.url, ["app.unreachable", "run.failed"])
        async with app_server(far) as url:
            await env.stack.register(far, url, name="far")
        run = await env.client.start_run("far", {})
        ended = await env.ended(run["id"])
        assert ended["error"]["code"] == "app_unreachable"
        await rx.until(2)
        await env.deliveries(alert["id"], delivered(2))
    got = sorted(r.json["type"] for r in rx.received)
    assert got == ["app.unreachable", "run.failed"]
    assert all(r.json["app"]["name"] == "far" for r in rx.received)


async def test_run_stuck_recorded_by_the_repair_check_is_delivered(env: Env) -> None:
    """record_run_stuck (what the check for runs without a way forward calls) sends run.stuck
    once for the run, however often it is called."""
    async with Receiver().running() as rx:
        alert = await env.alert(rx.url, ["run.stuck"])
        run = await env.client.start_run("waiting", {})
        conn = await env.stack.conn()
        try:
            for _ in range(2):
                await alerts.record_run_stuck(conn, keys.DEFAULT_PROJECT, uuid.UUID(run["id"]))
        finally:
            await conn.close()
        [got] = await rx.until(1)
        await env.deliveries(alert["id"], delivered(1))
    assert got.json["type"] == "run.stuck" and got.json["run"]["id"] == run["id"]
    assert got.json["run"]["status"] == "running"


async def test_schedule_disabled(env: Env) -> None:
    """A schedule disabled by its runs' failures sends schedule.disabled with the schedule."""
    async with Receiver().running() as rx:
        alert = await env.alert(rx.url, ["schedule.disabled"])
        sched = await env.client.create_schedule("boom", "0 0 1 1 *", disable_after=1)
        run = await env.client.trigger_schedule(sched["id"])
        assert (await env.ended(run["id"]))["status"] == "failed"
        [got] = await rx.until(1)
        await env.deliveries(alert["id"], delivered(1))
    assert (await env.client.get_schedule(sched["id"]))["status"] == "disabled"
    body = got.json
    assert body["type"] == "schedule.disabled"
    assert body["schedule"] == {"id": sched["id"], "workflow": "boom", "cron": "0 0 1 1 *"}
    assert body["run"]["id"] == run["id"]


async def test_schedule_sla_breached(env: Env) -> None:
    """A scheduled run not started within its schedule's SLA (a pull app's, with no worker
    polling) sends schedule.slaBreached once."""
    sl = stepline.Stepline(SECRET)

    @sl.workflow("pulled")
    async def pulled(ctx: stepline.Context, input: Any) -> None:
        return None

    slug = await env.stack.register_pull("puller")
    w = Worker(sl, env.stack.url, env.stack.api_key, slug)
    await w.sync()
    await w.aclose()
    async with Receiver().running() as rx:
        alert = await env.alert(rx.url, ["schedule.slaBreached"], workflow="pulled")
        sched = await env.client.create_schedule("pulled", "0 0 1 1 *", sla="1s")
        run = await env.client.trigger_schedule(sched["id"])
        [got] = await rx.until(1)
        await env.deliveries(alert["id"], delivered(1))
    assert got.json["type"] == "schedule.slaBreached"
    assert got.json["run"]["id"] == run["id"] and got.json["schedule"]["id"] == sched["id"]
    assert (await env.client.get_run(run["id"]))["slaBreached"] is True
    assert len((await env.client.list_alert_deliveries(alert["id"]))["deliveries"]) == 1


async def test_slack_gets_text_naming_the_type_workflow_status_and_link(env: Env) -> None:
    """A Slack destination gets {"text": ...} (unsigned) for a test notification and for a
    failed run, naming the type, the workflow, the run's status and its dashboard link."""
    async with Receiver().running() as rx:
        alert = await env.alert(rx.url, ["run.failed"], kind="slack")
        assert "secret" not in alert
        test = await env.client.test_alert(alert["id"])
        assert test["type"] == "alert.test" and test["status"] == "pending"
        [first] = await rx.until(1)
        run = await env.client.start_run("boom", {})
        await env.ended(run["id"])
        _, second = await rx.until(2)
    assert set(first.json) == {"text"} and "alert.test" in first.json["text"]
    assert "stepline-signature" not in first.headers
    text = second.json["text"]
    assert "run.failed" in text and "workflow boom" in text and " failed" in text
    assert f"{env.stack.url}/ui/runs/{run['id']}" in text


async def test_a_receiver_that_never_answers_costs_runs_nothing(env: Env) -> None:
    """With more notifications hanging on a receiver that never answers than the loop sends
    at once, runs still start and complete while every one of those requests is open."""
    async with Receiver(hang=True).running() as rx:
        await env.alert(rx.url, ["run.failed"])
        failed = [await env.client.start_run("boom", {}) for _ in range(20)]
        for run in failed:
            await env.ended(run["id"])
        await rx.until(16)
        quick = [await env.client.start_run("quick", {}) for _ in range(10)]
        for run in quick:
            assert (await env.ended(run["id"]))["output"] == 1
        assert not rx.release.is_set()  # every request the receiver got is still unanswered


async def test_destinations_obey_the_app_networks(database_url: str) -> None:
    """With STEPLINE_APP_NETWORKS not listing loopback, an alert to 127.0.0.1 is refused with
    422 naming destination.url and is not made; one stored before is never called, its
    attempt recorded with the reason."""
    async with (
        Receiver().running() as rx,
        orchestrator_stack(database_url, app_networks=("10.0.0.0/8",)) as stack,
    ):
        with pytest.raises(stepline.ApiError) as refused:
            await stack.client.create_alert(
                "ops", ["run.failed"], {"type": "webhook", "url": rx.url}
            )
        assert refused.value.status == 422
        assert "destination.url" in refused.value.details["fields"]
        assert (await stack.client.list_alerts())["alerts"] == []
        conn = await stack.conn()
        try:
            row = await alerts.create(
                conn, keys.DEFAULT_PROJECT, "old", ["run.failed"], None, "webhook", rx.url
            )
        finally:
            await conn.close()
        await stack.client.test_alert(str(row["id"]))
        for _ in range(600):
            [d] = (await stack.client.list_alert_deliveries(str(row["id"])))["deliveries"]
            if d["attempts"]:
                break
            await asyncio.sleep(0.05)
        assert d["status"] == "pending" and d["lastHttpStatus"] is None
        assert "STEPLINE_APP_NETWORKS" in d["lastError"]
        assert rx.received == []


async def test_manage_alerts_and_their_secret_is_shown_once(env: Env) -> None:
    """Create, list, read, change and delete an alert: the webhook's secret is in the create
    answer only (and when a Slack alert becomes a webhook), and a deleted alert is gone."""
    c = env.client
    made = await c.create_alert(
        "ops", ["run.failed", "run.failed"], {"type": "webhook", "url": "http://127.0.0.1:9/h"}
    )
    assert made["on"] == ["run.failed"] and made["workflow"] is None
    assert made["destination"] == {"type": "webhook", "url": "http://127.0.0.1:9/h"}
    listed = (await c.list_alerts())["alerts"]
    assert [a["id"] for a in listed] == [made["id"]] and "secret" not in listed[0]
    assert "secret" not in await c.get_alert(made["id"])
    changed = await c.update_alert(made["id"], on=["run.timedOut"], workflow="boom", name="night")
    assert (changed["on"], changed["workflow"], changed["name"]) == (
        ["run.timedOut"],
        "boom",
        "night",
    )
    assert "secret" not in changed
    assert (await c.update_alert(made["id"], workflow=None))["workflow"] is None
    slack = await c.create_alert(
        "chat", ["run.failed"], {"type": "slack", "url": "http://127.0.0.1:9/s"}
    )
    hooked = await c.update_alert(
        slack["id"], destination={"type": "webhook", "url": "http://127.0.0.1:9/w"}
    )
    assert hooked["secret"].startswith("whsec_")
    await c.delete_alert(made["id"])
    with pytest.raises(stepline.ApiError) as gone:
        await c.get_alert(made["id"])
    assert gone.value.status == 404
    assert [a["id"] for a in (await c.list_alerts())["alerts"]] == [slack["id"]]


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"name": "x", "on": [], "destination": {"type": "webhook", "url": "http://127.0.0.1:9/"}},
        {
            "name": "x",
            "on": ["run.exploded"],
            "destination": {"type": "webhook", "url": "http://127.0.0.1:9/"},
        },
        {
            "name": "x",
            "on": ["alert.test"],
            "destination": {"type": "webhook", "url": "http://127.0.0.1:9/"},
        },
        {
            "name": "x",
            "on": ["run.failed"],
            "destination": {"type": "email", "url": "http://127.0.0.1:9/"},
        },
        {
            "name": "x",
            "on": ["run.failed"],
            "destination": {"type": "webhook", "url": "ftp://127.0.0.1/"},
        },
        {"name": "x", "on": ["run.failed"], "destination": {"type": "webhook"}},
        {
            "name": "x\u0000",
            "on": ["run.failed"],
            "destination": {"type": "slack", "url": "http://127.0.0.1:9/"},
        },
        {
            "name": "x",
            "on": "run.failed",
            "destination": {"type": "slack", "url": "http://127.0.0.1:9/"},
        },
        {
            "name": "x",
            "on": ["run.failed"],
            "workflow": "no spaces",
            "destination": {"type": "slack", "url": "http://127.0.0.1:9/"},
        },
    ],
)
async def test_bad_alerts_are_refused_and_change_nothing(env: Env, body: dict[str, Any]) -> None:
    """Each malformed alert is a 400 or 422 in the API's error shape, and none is made."""
    import httpx

    headers = {"Authorization": f"Bearer {env.stack.api_key}"}
    async with httpx.AsyncClient(base_url=env.stack.url, headers=headers) as http:
        answer = await http.post("/v1/alerts", json=body)
        assert answer.status_code in (400, 422), answer.text
        assert set(answer.json()["error"]) >= {"code", "message"}
        assert (await http.get("/v1/alerts")).json()["alerts"] == []
        made = (
            await http.post(
                "/v1/alerts",
                json={
                    "name": "ok",
                    "on": ["run.failed"],
                    "destination": {"type": "slack", "url": "http://127.0.0.1:9/"},
                },
            )
        ).json()
        for patch in ({}, {"on": []}, {"name": None}, {"destination": None}, {"on": ["nope"]}):
            answer = await http.patch(f"/v1/alerts/{made['id']}", json=patch)
            assert answer.status_code == 422, (patch, answer.text)
        assert (await http.get(f"/v1/alerts/{made['id']}")).json() == made
        assert (await http.get("/v1/alerts/not-a-uuid")).status_code == 404
        assert (await http.post(f"/v1/alerts/{uuid.uuid4()}/test")).status_code == 404


async def test_every_alert_route_needs_an_admin_key(env: Env) -> None:
    """A write or read key is refused 403 on every alert route, and nothing changes."""
    import httpx

    conn = await env.stack.conn()
    try:
        write = await keys.create_key(conn, "w", role="write")
        read = await keys.create_key(conn, "r", role="read")
    finally:
        await conn.close()
    made = await env.client.create_alert(
        "ops", ["run.failed"], {"type": "slack", "url": "http://127.0.0.1:9/"}
    )
    aid = made["id"]
    calls = [
        (
            "POST",
            "/v1/alerts",
            {"name": "x", "on": ["run.failed"], "destination": made["destination"]},
        ),
        ("GET", "/v1/alerts", None),
        ("GET", f"/v1/alerts/{aid}", None),
        ("PATCH", f"/v1/alerts/{aid}", {"name": "changed"}),
        ("DELETE", f"/v1/alerts/{aid}", None),
        ("POST", f"/v1/alerts/{aid}/test", None),
        ("GET", f"/v1/alerts/{aid}/deliveries", None),
    ]
    async with httpx.AsyncClient(base_url=env.stack.url) as http:
        for key in (write, read):
            for method, path, body in calls:
                answer = await http.request(
                    method, path, json=body, headers={"Authorization": f"Bearer {key}"}
                )
                assert answer.status_code == 403, (method, path, answer.text)
                assert answer.json()["error"]["code"] == "forbidden"
    assert await env.client.get_alert(aid) == made
    assert (await env.client.list_alert_deliveries(aid))["deliveries"] == []


async def test_a_notification_never_answered_with_2xx_fails_after_the_window(env: Env) -> None:
    """A receiver that always answers 503: the notification is tried with backoff until its
    delivery window (shortened here from a day) is spent, then it is failed, each attempt
    counted and the last answer told."""
    env.stack.orchestrator.alerts.window_seconds = 2.5
    async with Receiver(answers=[503] * 100).running() as rx:
        alert = await env.alert(rx.url, ["run.failed"])
        await env.client.test_alert(alert["id"])
        [d] = await env.deliveries(alert["id"], lambda ds: ds[0]["status"] != "pending")
    assert d["status"] == "failed" and d["deliveredAt"] is None
    assert d["attempts"] == len(rx.received) >= 2
    assert d["lastHttpStatus"] == 503 and d["lastError"] == "the receiver answered HTTP 503"
    assert len({r.json["id"] for r in rx.received}) == 1


async def test_alerts_and_deliveries_are_paginated(env: Env) -> None:
    """Lists of alerts (oldest first) and of deliveries (newest first) come in pages that
    follow nextCursor to the end; a cursor the API did not give is a 422."""
    c = env.client
    made = [
        await c.create_alert(
            f"a{i}", ["run.failed"], {"type": "slack", "url": "http://127.0.0.1:9/"}
        )
        for i in range(3)
    ]
    first = await c.list_alerts(limit=2)
    rest = await c.list_alerts(limit=2, cursor=first["nextCursor"])
    assert [a["id"] for a in first["alerts"] + rest["alerts"]] == [a["id"] for a in made]
    assert rest["nextCursor"] is None
    tests = [(await c.test_alert(made[0]["id"]))["id"] for _ in range(3)]
    page = await c.list_alert_deliveries(made[0]["id"], limit=2)
    more = await c.list_alert_deliveries(made[0]["id"], limit=2, cursor=page["nextCursor"])
    seen = [d["id"] for d in page["deliveries"] + more["deliveries"]]
    assert sorted(seen) == sorted(tests) and len(seen) == 3 and more["nextCursor"] is None
    with pytest.raises(stepline.ApiError) as bad:
        await c.list_alert_deliveries(made[0]["id"], cursor="bm90IGEgY3Vyc29y")
    assert bad.value.status == 422
