"""An app that answers 5xx, garbage or nothing in time: retried with backoff for the delivery
window, then the run fails with an error that says what happened."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import httpx
import pytest
import structlog

import stepline
from stepline import protocol
from stepline_server.store import apps, keys
from tests.support import orchestrator_stack, read_body, serve

SECRET = "failing-app"


def failing_app(mode: str, calls: Counter[str]) -> Any:
    """A raw ASGI app: describes one workflow (3 attempts, 50 ms apart), then fails invokes."""
    describe = protocol.DescribeResponse(
        workflows=[
            protocol.WorkflowInfo(
                name="doomed",
                retries=protocol.RetryPolicy(attempts=3, initialDelayMs=50, maxDelayMs=100),
            )
        ]
    )

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        kind = json.loads(body)["kind"]
        calls[kind] += 1
        status, answer = 200, json.dumps(protocol.dump(describe)).encode()
        if kind == "invoke":
            if mode == "5xx":
                status, answer = 503, b"upstream unavailable"
            elif mode == "garbage":
                answer = b"<html>not json</html>"
            elif mode == "slow":
                await asyncio.sleep(3)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": answer})

    return app


@pytest.mark.parametrize(
    ("mode", "says"),
    [
        ("5xx", "HTTP 503"),
        ("garbage", "not the Stepline SDK's"),
        ("slow", "did not answer in time"),
    ],
)
async def test_failing_app_is_retried_then_the_run_fails(
    database_url: str, mode: str, says: str
) -> None:
    """Each failed delivery is tried again with backoff for the delivery window, whatever the
    workflow's retries (3 attempts here); then the run fails with app_unreachable naming the
    last failure, and every invocation's outcome is in the history."""
    calls: Counter[str] = Counter()
    async with (
        orchestrator_stack(
            database_url, invoke_timeout_seconds=0.5, delivery_window_seconds=3.5
        ) as stack,
        serve(failing_app(mode, calls)) as url,
    ):
        async with stack.orchestrator.pool.acquire() as conn:
            row = await apps.create(conn, keys.DEFAULT_PROJECT, "failing", url + "/", SECRET)
        await stack.client.sync_app(row["slug"])
        run = await stack.client.start_run("doomed", {"n": 1})
        done = await stack.client.wait_run(run["id"], timeout=30)
        assert done["status"] == "failed", done
        assert done["error"]["code"] == "app_unreachable"
        assert says in done["error"]["message"]
        assert calls["invoke"] >= 3  # more than the workflow's 3 attempts would allow is fine
        events = [e async for e in stack.client.iter_run_events(run["id"])]
        ended = [e for e in events if e["type"] == "invocation.ended"]
        assert len(ended) == calls["invoke"] and all(says in e["data"]["error"] for e in ended)
        assert [e["data"]["outcome"] for e in ended[:-1]] == ["delivery_failed"] * (len(ended) - 1)
        assert events[-1]["type"] == "run.failed"


async def test_a_failing_sdk_says_what_broke_and_the_orchestrator_warns(database_url: str) -> None:
    """An SDK that fails internally (its httpx client was closed) answers 500 with the
    exception's type and message, which the run's history shows; the orchestrator logs each
    failed delivery as a warning naming the workflow and the run."""
    closed = httpx.AsyncClient()
    await closed.aclose()
    sl = stepline.Stepline("broken-secret", http_client=closed)

    @sl.workflow("broken", delivery_window="1s")
    async def broken(ctx: stepline.Context, input: Any) -> Any:
        return await ctx.step("work", lambda: 1)

    async with orchestrator_stack(database_url) as stack, serve(sl.asgi()) as url:
        await stack.register(sl, url + "/")
        with structlog.testing.capture_logs() as logs:
            run = await stack.client.start_run("broken", None)
            done = await stack.client.wait_run(run["id"], timeout=30)
        events = [e async for e in stack.client.iter_run_events(run["id"])]
    assert done["status"] == "failed" and done["error"]["code"] == "app_unreachable", done
    ended = [e["data"] for e in events if e["type"] == "invocation.ended"]
    assert ended and all("RuntimeError" in e["error"] for e in ended), ended
    assert all("client has been closed" in e["error"] for e in ended)
    assert not any("Traceback" in e["error"] for e in ended)
    warned = [
        line
        for line in logs
        if line["event"] == "invocation_ended" and line.get("run_id") == run["id"]
    ]
    assert len(warned) == len(ended), logs
    assert all(line["log_level"] == "warning" for line in warned), warned
    assert all(line["workflow"] == "broken" for line in warned)
    assert all("RuntimeError" in line["error"] for line in warned)


async def test_unsigned_invocations_are_refused_by_the_sdk(database_url: str) -> None:
    """An app whose secret does not match answers 401 to every invocation and runs nothing."""
    ran: list[int] = []
    sl = stepline.Stepline("the-real-secret")

    @sl.workflow("guarded", retries=stepline.Retries(attempts=2, initial_delay="50ms"))
    async def guarded(ctx: stepline.Context, input: Any) -> None:
        ran.append(1)

    async with orchestrator_stack(database_url) as stack, serve(sl.asgi()) as url:
        async with stack.orchestrator.pool.acquire() as conn:
            row = await apps.create(conn, keys.DEFAULT_PROJECT, "guarded", url + "/", "wrong")
        with pytest.raises(stepline.ApiError) as info:
            await stack.client.sync_app(row["slug"])
        assert info.value.status == 502 and "401" in info.value.message
    assert ran == []
