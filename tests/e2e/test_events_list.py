"""Events over real HTTP: an event keeps the id its sender gave in every place that names it,
and ``GET /v1/events`` lists what an environment received, newest first, by name and time."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import httpx

import stepline
from stepline_server.store import keys
from tests.e2e.test_cli_operator import _call
from tests.e2e.test_durable_waits import step_in
from tests.e2e.test_openapi_responses import check
from tests.support import Stack, app_server, orchestrator_stack


def events_app(orchestrator: dict[str, str]) -> stepline.Stepline:
    """``kyc`` waits for ``kyc.done`` of its user; ``welcome`` starts on ``user.signed_up``;
    ``self-sent`` sends ``ping`` (id ``evt-self``) itself just before it waits for it."""
    sl = stepline.Stepline("secret-events")

    @sl.workflow("kyc")
    async def kyc(ctx: stepline.Context, input: dict[str, Any]) -> Any:
        return await ctx.wait_for_event(
            "kyc", event="kyc.done", match={"u": input["u"]}, timeout="1h"
        )

    @sl.workflow("welcome", on_event="user.signed_up")
    async def welcome(ctx: stepline.Context, input: Any) -> Any:
        return input

    @sl.workflow("self-sent")
    async def self_sent(ctx: stepline.Context, input: Any) -> Any:
        # Sent again on each replay: the same id is received once.
        auth = {"authorization": f"Bearer {orchestrator['key']}"}
        async with httpx.AsyncClient(base_url=orchestrator["url"], headers=auth) as http:
            sent = await http.post("/v1/events", json={"name": "ping", "id": "evt-self"})
            assert sent.status_code == 202, sent.text
        return await ctx.wait_for_event("ping", event="ping", timeout="1h")

    return sl


async def _received(stack: Stack, run_id: str) -> list[dict[str, Any]]:
    """The data of the run's ``event.received`` events."""
    return [
        e["data"]
        async for e in stack.client.iter_run_events(run_id)
        if e["type"] == "event.received"
    ]


async def test_an_event_keeps_its_senders_id_in_every_place(database_url: str) -> None:
    """The id a sender gave is the one the answer, the resumed run's ``event.received`` (sent
    before the wait or taken by the wait just recorded), the started run's ``eventId`` and
    ``GET /v1/events`` show; an event sent without one is named by its own id everywhere."""
    where: dict[str, str] = {}
    sl = events_app(where)
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        where.update(url=stack.url, key=stack.api_key)
        await stack.register(sl, url)
        waiting = await stack.client.start_run("kyc", {"u": "u1"})
        anonymous = await stack.client.start_run("kyc", {"u": "u2"})
        for run in (waiting, anonymous):
            await step_in(stack, run["id"], "kyc", "waiting")
        sent = await stack.client.send_event("kyc.done", {"u": "u1"}, id="evt-1")
        assert sent["id"] == "evt-1" and sent["matchedRuns"] == 1
        unnamed = await stack.client.send_event("kyc.done", {"u": "u2"})
        started = await stack.client.send_event("user.signed_up", {"who": "ann"}, id="evt-2")
        assert len(started["startedRuns"]) == 1
        self_sent = await stack.client.start_run("self-sent")

        for run_id in (waiting["id"], anonymous["id"], self_sent["id"]):
            assert (await stack.client.wait_run(run_id, timeout=30))["status"] == "completed"
        assert await _received(stack, waiting["id"]) == [{"event": "kyc.done", "eventId": "evt-1"}]
        assert await _received(stack, anonymous["id"]) == [
            {"event": "kyc.done", "eventId": unnamed["id"]}
        ]
        assert await _received(stack, self_sent["id"]) == [{"event": "ping", "eventId": "evt-self"}]
        welcomed = await stack.client.get_run(started["startedRuns"][0])
        assert welcomed["trigger"] == "event" and welcomed["eventId"] == "evt-2"
        listed = {e["id"] for e in (await stack.client.list_events())["events"]}
        assert listed == {"evt-1", unnamed["id"], "evt-2", "evt-self"}


async def test_the_events_list_pages_filters_and_keeps_to_its_environment(
    database_url: str,
) -> None:
    """``GET /v1/events`` answers ``{events, nextCursor}`` newest first, each as its send
    answered it with its name, data and time; ``name``, ``createdAfter`` and
    ``createdBefore`` filter; a bad time is ``422``; another environment sees none of them;
    ``stepline events list`` shows them."""
    async with orchestrator_stack(database_url) as stack:
        sent = []
        for i, name in enumerate(["a", "b", "a", "b", "a"]):
            sent.append(await stack.client.send_event(name, {"i": i}, id=f"e-{i}"))
            if i == 1:
                middle = datetime.now(UTC)
                await asyncio.sleep(0.01)
        auth = {"authorization": f"Bearer {stack.api_key}"}
        async with httpx.AsyncClient(base_url=stack.url, headers=auth) as http:
            seen: list[dict[str, Any]] = []
            params: dict[str, str] = {"limit": "2"}
            while True:
                page = await http.get("/v1/events", params=params)
                assert page.status_code == 200, page.text
                check("GET", "/v1/events", page)
                seen += page.json()["events"]
                if page.json()["nextCursor"] is None:
                    break
                params["cursor"] = page.json()["nextCursor"]
            assert [e["id"] for e in seen] == ["e-4", "e-3", "e-2", "e-1", "e-0"]
            assert seen[0] == {
                "id": "e-4",
                "name": "a",
                "data": {"i": 4},
                "createdAt": seen[0]["createdAt"],
                "matchedRuns": 0,
                "startedRuns": [],
            }
            named = (await http.get("/v1/events", params={"name": "b"})).json()["events"]
            assert [e["id"] for e in named] == ["e-3", "e-1"]
            after = await http.get("/v1/events", params={"createdAfter": middle.isoformat()})
            assert [e["id"] for e in after.json()["events"]] == ["e-4", "e-3", "e-2"]
            before = await http.get("/v1/events", params={"createdBefore": middle.isoformat()})
            assert [e["id"] for e in before.json()["events"]] == ["e-1", "e-0"]
            bad = await http.get("/v1/events", params={"createdAfter": "yesterday"})
            assert bad.status_code == 422, bad.text
            check("GET", "/v1/events", bad)

            async with stack.orchestrator.pool.acquire() as conn:
                staging = await keys.find_environment(conn, keys.DEFAULT_PROJECT, "staging")
                assert staging is not None
                other = await keys.create_key(conn, "other", staging["id"], "read")
            elsewhere = await http.get("/v1/events", headers={"authorization": f"Bearer {other}"})
            assert elsewhere.status_code == 200 and elsewhere.json()["events"] == []

        argv = ["events", "list", "--name", "a", "--url", stack.url, "--api-key", stack.api_key]
        code, out, err = await asyncio.to_thread(_call, argv)
        assert code == 0, err
        assert out.splitlines()[0].split()[:2] == ["ID", "NAME"]
        assert [line.split()[0] for line in out.splitlines()[1:]] == ["e-4", "e-2", "e-0"]
