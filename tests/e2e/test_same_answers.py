"""One request, one answer: a start answers one run shape whether it made the run or found it
by its key, a callback completed again with its first body answers it again, and a run list's
``runKey`` pattern means what a bulk filter's means."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

import stepline
from tests.e2e.test_durable_waits import callback_app, step_in, step_of
from tests.e2e.test_openapi_responses import check
from tests.support import Stack, app_server, orchestrator_stack


def greet_app() -> stepline.Stepline:
    sl = stepline.Stepline("secret-answers")

    @sl.workflow("greet")
    async def greet(ctx: stepline.Context, input: Any) -> Any:
        return await ctx.step("hello", lambda: {"said": input})

    @sl.workflow("hold")
    async def hold(ctx: stepline.Context, input: Any) -> Any:
        return await (await ctx.callback("approval", timeout="1h")).wait()

    return sl


def _http(stack: Stack) -> httpx.AsyncClient:
    auth = {"authorization": f"Bearer {stack.api_key}"}
    return httpx.AsyncClient(base_url=stack.url, headers=auth, timeout=30)


async def test_a_start_answers_the_run_shape_a_read_does_made_or_found(database_url: str) -> None:
    """The ``201`` of a start, the ``200`` of the same start by run key (marked
    ``deduplicated``) and ``GET /v1/runs/{id}`` have the same keys, with and without a key;
    a new run has no invocations, deliveries or steps yet."""
    sl = greet_app()
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        async with _http(stack) as http:
            for body in (
                {"workflow": "greet", "input": {"n": 1}},
                {"workflow": "greet", "input": {"n": 2}, "runKey": "shape-1"},
            ):
                made = await http.post("/v1/runs", json=body)
                assert made.status_code == 201, made.text
                check("POST", "/v1/runs", made)
                run = made.json()
                assert "deduplicated" not in run
                assert (run["invocations"], run["deliveryFailures"], run["stepsCompleted"]) == (
                    0,
                    0,
                    0,
                )
                assert run["paused"] is False and run["deploymentId"] is None
                assert run["history"]["steps"] == 0 and run["history"]["bytes"] == 0
                read = await http.get(f"/v1/runs/{run['id']}")
                assert set(run) == set(read.json())
                assert set(run["history"]) == set(read.json()["history"])
                if "runKey" not in body:
                    continue
                found = await http.post("/v1/runs", json=body)
                assert found.status_code == 200, found.text
                check("POST", "/v1/runs", found)
                again = found.json()
                assert again.pop("deduplicated") is True and again["id"] == run["id"]
                assert set(again) == set(read.json())
                assert set(again["history"]) == set(read.json()["history"])


async def _waiting_callback(stack: Stack, urls: dict[str, str]) -> tuple[str, str, str]:
    """A run waiting on its callback: the run's id, the callback's id and signed URL."""
    run = await stack.client.start_run("approve", {"timeout": "1m"})
    waiting = await step_in(stack, run["id"], "approval", "waiting")
    cb_id = step_of(waiting, "approval")["callbackId"]
    for _ in range(400):
        if run["id"] in urls:
            break
        await asyncio.sleep(0.05)
    return run["id"], cb_id, urls[run["id"]]


async def test_a_callback_completed_again_with_its_body_answers_it_again(
    database_url: str,
) -> None:
    """The same body again (by signed URL or by API key; keys in another order and other
    spacing are the same JSON) is ``200`` with the completed callback, marked
    ``deduplicated``; another body (``1`` is not ``true``) stays ``409``; the run resumed
    once."""
    counts: dict[str, int] = {}
    urls: dict[str, str] = {}
    sl = callback_app(counts, urls)
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        async with _http(stack) as http:
            for route in ("signed", "keyed"):
                run_id, cb_id, signed = await _waiting_callback(stack, urls)
                target = signed if route == "signed" else f"/v1/callbacks/{cb_id}"
                template = (
                    "/v1/callbacks/{callbackId}/{signature}"
                    if route == "signed"
                    else "/v1/callbacks/{callbackId}"
                )
                first = await http.post(target, json={"ok": True, "by": "ann"})
                assert first.status_code == 200, first.text
                assert "deduplicated" not in first.json()
                raw = b'{ "by" : "ann",  "ok":true }'
                headers = {"content-type": "application/json"}
                again = await http.post(target, content=raw, headers=headers)
                assert again.status_code == 200, again.text
                check("POST", template, again)
                answer = again.json()
                assert answer.pop("deduplicated") is True
                assert answer == first.json()
                for other in ({"ok": 1, "by": "ann"}, {"ok": True}, None):
                    refused = await http.post(target, content=json.dumps(other), headers=headers)
                    assert refused.status_code == 409, refused.text
                    assert refused.json()["error"]["code"] == "invalid_state"
                done = await stack.client.wait_run(run_id, timeout=30)
                assert done["output"]["approved"] == {"ok": True, "by": "ann"}
                types = [e["type"] async for e in stack.client.iter_run_events(run_id)]
                assert types.count("callback.completed") == 1


async def _runs_with_keys(stack: Stack, keys: list[str]) -> dict[str, str]:
    made = {}
    for key in keys:
        made[key] = (await stack.client.start_run("hold", key, run_key=key))["id"]
    return made


async def test_a_run_list_takes_a_run_key_prefix_as_bulk_filters_do(database_url: str) -> None:
    """``runKey=bulk-*`` lists the runs whose key starts ``bulk-``, as a bulk filter selects
    them; a ``*`` anywhere else is refused by both, never an empty answer."""
    sl = greet_app()
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        made = await _runs_with_keys(stack, ["bulk-1", "bulk-2", "bulkier", "other"])
        async with _http(stack) as http:
            listed = await http.get("/v1/runs", params={"runKey": "bulk-*"})
            assert listed.status_code == 200, listed.text
            assert {r["id"] for r in listed.json()["runs"]} == {made["bulk-1"], made["bulk-2"]}
            exact = await http.get("/v1/runs", params={"runKey": "bulk-1"})
            assert [r["id"] for r in exact.json()["runs"]] == [made["bulk-1"]]
            every = await http.get("/v1/runs", params={"runKey": "*"})
            assert len(every.json()["runs"]) == 4
            dry = await http.post(
                "/v1/runs/bulk",
                json={"action": "cancel", "filter": {"runKey": "bulk-*"}, "dryRun": True},
            )
            assert dry.status_code == 200, dry.text
            assert dry.json()["matched"] == len(listed.json()["runs"])
            for pattern in ("bu*lk", "*-1", "bulk-**"):
                refused = await http.get("/v1/runs", params={"runKey": pattern})
                assert refused.status_code == 422, refused.text
                check("GET", "/v1/runs", refused)
                assert "runKey" in refused.json()["error"]["details"]["fields"]
                bulk = await http.post(
                    "/v1/runs/bulk", json={"action": "cancel", "filter": {"runKey": pattern}}
                )
                assert bulk.status_code == 422, bulk.text
