"""Commits whose outcome the orchestrator never learns: the connection drops after a write's
``COMMIT`` reached the server and before its answer came back (as when the primary dies at that
moment). A start, a progress call, a callback's completion and an event are each recorded
once, and answered as if nothing had happened; a client that sends a start or an event again
with its key gets the first one's answer."""

from __future__ import annotations

from collections import Counter
from typing import Any

import httpx
import pytest

import stepline
from stepline_server.api import patience
from tests.dbproxy import DbProxy, proxied
from tests.support import Stack, app_server, orchestrator_stack, until


def lost_app(ran: Counter[str]) -> stepline.Stepline:
    sl = stepline.Stepline("lost-commits-secret")

    @sl.workflow("lost")
    async def lost(ctx: stepline.Context, input: dict[str, Any]) -> Any:
        tag = input["tag"]

        def work() -> str:
            ran[tag] += 1
            return f"{tag}-done"

        done = await ctx.step("work", work)
        approval = await ctx.callback("approval", timeout="1m")
        body = await approval.wait()
        data = await ctx.wait_for_event("kyc", event="lost.kyc", match={"tag": tag}, timeout="1m")
        return {"done": done, "body": body, "data": data}

    return sl


async def _waiting(stack: Stack, run_id: str, step: str) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        run = await stack.client.get_run(run_id)
        for s in run["steps"]:
            if s["name"] == step and s["status"] == "waiting":
                return dict(s)
        return None

    return await until(probe, f"step {step} waiting")  # type: ignore[no-any-return]


async def _history(stack: Stack, run_id: str) -> list[tuple[str, str | None]]:
    return [(e["type"], e.get("stepName")) async for e in stack.client.iter_run_events(run_id)]


async def test_writes_whose_commit_answer_was_lost_are_recorded_once(database_url: str) -> None:
    """A start (no run key), the step result's progress call, a callback's completion and an
    event (no id), each cut off after its commit reached the server: each answers as it would
    have (201, 200, 200, 202 with the run it matched), and the run's history has each once."""
    ran: Counter[str] = Counter()
    sl = lost_app(ran)
    async with (
        proxied(database_url) as (proxy, dsn),
        orchestrator_stack(dsn) as stack,
        app_server(sl) as url,
    ):
        await stack.register(sl, url)
        http = _http(stack)
        async with http:
            proxy.lose_commit(b'{"tag":"T1"}')
            proxy.lose_commit(b"T1-done", transaction=False)
            started = await http.post("/v1/runs", json={"workflow": "lost", "input": {"tag": "T1"}})
            assert started.status_code == 201, started.text
            run_id = started.json()["id"]
            callback = (await _waiting(stack, run_id, "approval"))["callbackId"]
            proxy.lose_commit(b"approved-T1")
            completed = await http.post(f"/v1/callbacks/{callback}", json={"ok": "approved-T1"})
            assert completed.status_code == 200, completed.text
            assert completed.json()["status"] == "completed"
            await _waiting(stack, run_id, "kyc")
            proxy.lose_commit(b"ok-T1")
            sent = await http.post("/v1/events", json={"name": "lost.kyc", "data": _kyc("T1")})
            assert sent.status_code == 202, sent.text
            assert sent.json()["matchedRuns"] == 1 and "deduplicated" not in sent.json()
            done = await stack.client.wait_run(run_id, timeout=30)
            runs = (await http.get("/v1/runs", params={"workflow": "lost"})).json()["runs"]
        assert proxy.commits_lost == 4
        assert done["status"] == "completed", done
        assert done["output"] == {
            "done": "T1-done",
            "body": {"ok": "approved-T1"},
            "data": _kyc("T1"),
        }
        assert [r["id"] for r in runs] == [run_id]
        assert ran == Counter({"T1": 1})
        history = await _history(stack, run_id)
        for step in ("work", "approval", "kyc"):
            assert history.count(("step.completed", step)) == 1, history
        assert history.count(("callback.completed", "approval")) == 1, history


async def test_a_client_retry_after_a_lost_commit_gets_the_first_answer(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no patience left, a write cut off after its commit answers 503; the client's retry
    of the start (same run key) and of the event (same id) answers what was kept, once."""
    monkeypatch.setattr(patience, "DATABASE_PATIENCE_SECONDS", 0.0)
    sl = lost_app(Counter())
    async with (
        proxied(database_url) as (proxy, dsn),
        orchestrator_stack(dsn) as stack,
        app_server(sl) as url,
    ):
        await stack.register(sl, url)
        async with _http(stack) as http:
            start = {"workflow": "lost", "input": {"tag": "T2"}, "runKey": "order-T2"}
            run_id = await _after_a_lost_commit(proxy, http, "/v1/runs", start, b"order-T2", 200)
            await _waiting(stack, run_id, "approval")
            callback = (await _waiting(stack, run_id, "approval"))["callbackId"]
            await stack.client.complete_callback(callback, {"ok": "yes"})
            await _waiting(stack, run_id, "kyc")
            event = {"name": "lost.kyc", "data": _kyc("T2"), "id": "kyc-T2"}
            await _after_a_lost_commit(proxy, http, "/v1/events", event, b"ok-T2", 202)
            done = await stack.client.wait_run(run_id, timeout=30)
            runs = (await http.get("/v1/runs", params={"workflow": "lost"})).json()["runs"]
        assert done["output"]["data"] == _kyc("T2")
        assert [r["id"] for r in runs] == [run_id]
        assert (await _history(stack, run_id)).count(("step.completed", "kyc")) == 1


async def _after_a_lost_commit(
    proxy: DbProxy, http: httpx.AsyncClient, path: str, body: Any, marker: bytes, status: int
) -> str:
    """Send ``body`` with its commit's answer lost (503), then again: the id answered."""
    proxy.lose_commit(marker)
    first = await http.post(path, json=body)
    assert first.status_code == 503, first.text
    again = await until(lambda: _unless_503(http.post(path, json=body)), f"{path} answered")
    assert again.status_code == status, again.text
    answer = again.json()
    if path == "/v1/events":
        assert answer["matchedRuns"] == 1 and answer["deduplicated"] is True, answer
    return str(answer["id"])


async def _unless_503(sent: Any) -> httpx.Response | None:
    response = await sent
    return None if response.status_code == 503 else response  # type: ignore[no-any-return]


def _kyc(tag: str) -> dict[str, str]:
    return {"tag": tag, "kyc": f"ok-{tag}"}


def _http(stack: Stack) -> httpx.AsyncClient:
    headers = {"authorization": f"Bearer {stack.api_key}"}
    return httpx.AsyncClient(base_url=stack.url, headers=headers, timeout=30)
