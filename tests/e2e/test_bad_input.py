"""Bad input found by fuzzing and by hand: each is a 4xx in the error shape (or accepted and
fully usable), changes nothing, and leaves every run readable and invocable."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import structlog

import stepline
from tests.e2e.test_durable_waits import step_in, step_of
from tests.support import app_server, orchestrator_stack


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"a": value}
    return value


def _app() -> stepline.Stepline:
    sl = stepline.Stepline("secret-bad-input")

    @sl.workflow("echo")
    async def echo(ctx: stepline.Context, input: Any) -> Any:
        return input

    @sl.workflow("wait")
    async def wait(ctx: stepline.Context, input: Any) -> Any:
        cb = await ctx.callback("cb", timeout="1m")
        return await cb.wait()

    @sl.workflow("nul-step")
    async def nul_step(ctx: stepline.Context, input: Any) -> Any:
        return await ctx.step("bad", lambda: "a\x00b")

    return sl


def _code(answer: httpx.Response, status: int, code: str) -> None:
    assert answer.status_code == status, answer.text
    assert answer.json()["error"]["code"] == code, answer.text


async def test_nul_deep_nesting_and_big_integers_are_422_and_change_nothing(
    database_url: str,
) -> None:
    """NUL characters, nesting past 64 levels and integers past 64 bits are 422 everywhere."""
    sl = _app()
    async with orchestrator_stack(database_url) as stack, app_server(sl) as app_url:
        await stack.register(sl, app_url)
        auth = {"authorization": f"Bearer {stack.api_key}"}
        bad_bodies = [
            ("/v1/runs", {"workflow": "echo", "input": "a\x00b"}),
            ("/v1/runs", {"workflow": "echo", "input": {"k\x00": 1}}),
            ("/v1/runs", {"workflow": "echo", "input": _nested(254)}),
            ("/v1/events", {"name": "e\x00", "data": 1}),
            ("/v1/events", {"name": "e", "data": "\x00"}),
            ("/v1/schedules", {"workflow": "echo", "cron": "* * * * *", "input": "\x00"}),
            ("/v1/apps", {"name": "x", "url": "http://127.0.0.1:9/\x00"}),
        ]
        async with httpx.AsyncClient(base_url=stack.url, headers=auth) as http:
            for path, body in bad_bodies:
                _code(await http.post(path, json=body), 422, "validation_failed")
            big = b'{"workflow": "echo", "input": 123456789012345678901234567890}'
            _code(await http.post("/v1/runs", content=big), 422, "validation_failed")
            overflow = {"workflow": "echo", "cron": "* * * * *", "disableAfter": 10**12}
            _code(await http.post("/v1/schedules", json=overflow), 422, "validation_failed")
            assert (await http.get("/v1/runs")).json()["runs"] == []
            assert (await http.get("/v1/schedules")).json()["schedules"] == []
            # Accepted and fully usable: 64 bits exact, 60 levels deep.
            fine = {"n": 2**64 - 1, "deep": _nested(60)}
            made = await http.post("/v1/runs", json={"workflow": "echo", "input": fine})
            assert made.status_code == 201, made.text
            run_id = made.json()["id"]
            ended = await stack.client.wait_run(run_id, timeout=20)
            assert ended["status"] == "completed" and ended["output"] == fine
            assert (await http.get("/v1/runs")).status_code == 200
            _code(
                await http.get(f"/v1/runs/{run_id}/events?after=99999999999999999999"),
                422,
                "validation_failed",
            )


async def test_deeply_nested_callback_body_leaves_the_run_invocable(database_url: str) -> None:
    """A callback body past the nesting limit is refused; one within it completes the run."""
    sl = _app()
    async with orchestrator_stack(database_url) as stack, app_server(sl) as app_url:
        await stack.register(sl, app_url)
        run = await stack.client.start_run("wait")
        waiting = await step_in(stack, run["id"], "cb", "waiting")
        cb_id = step_of(waiting, "cb")["callbackId"]
        auth = {"authorization": f"Bearer {stack.api_key}"}
        async with httpx.AsyncClient(base_url=stack.url, headers=auth) as http:
            _code(await http.post(f"/v1/callbacks/{cb_id}", json=_nested(252)), 422,
                  "validation_failed")  # fmt: skip
            _code(await http.post(f"/v1/callbacks/{cb_id}", json={"x": "\x00"}), 422,
                  "validation_failed")  # fmt: skip
            assert (await http.post(f"/v1/callbacks/{cb_id}", json=_nested(60))).status_code == 200
        ended = await stack.client.wait_run(run["id"], timeout=20)
        assert ended["status"] == "completed" and ended["output"] == _nested(60)


async def test_signed_callback_url_oddities_are_404_and_never_logged(database_url: str) -> None:
    """A non-ASCII or empty signature is 404 (no redirect), and no 500 logs a URL's path."""
    sl = _app()
    async with orchestrator_stack(database_url) as stack, app_server(sl) as app_url:
        await stack.register(sl, app_url)
        run = await stack.client.start_run("wait")
        waiting = await step_in(stack, run["id"], "cb", "waiting")
        cb_id = step_of(waiting, "cb")["callbackId"]
        async with httpx.AsyncClient(base_url=stack.url) as http:
            for signature in ("%C3%A9t%C3%A9", "", "\u00e9"):
                answer = await http.post(f"/v1/callbacks/{cb_id}/{signature}", json={})
                _code(answer, 404, "not_found")
        assert (await stack.client.get_callback(cb_id))["status"] == "pending"
    from stepline_server.api.errors import route_of

    signature = "secret-signature"
    scope = {"path": f"/v1/callbacks/{uuid.uuid4()}/{signature}"}
    with structlog.testing.capture_logs() as logs:
        structlog.get_logger().error("request_failed", route=route_of(scope))
    assert signature not in json.dumps(logs)


async def test_step_result_with_nul_fails_its_step_clearly(database_url: str) -> None:
    """A step returning text with NUL fails with a clear error, not 'progress call failed'."""
    sl = _app()
    async with orchestrator_stack(database_url) as stack, app_server(sl) as app_url:
        await stack.register(sl, app_url)
        run = await stack.client.start_run("nul-step")
        ended = await stack.client.wait_run(run["id"], timeout=30)
        assert ended["status"] == "failed", ended
        assert "NUL" in json.dumps(ended["error"]) or "NUL" in json.dumps(ended["steps"])
