"""API.md part three, "Contract points made exact", over real HTTP: error objects with a code,
invocations that say what was sent, deployment ids on every invocation event, a completed run
reset from a step, and tracebacks of the user's frames."""

from __future__ import annotations

from typing import Any

import httpx

import stepline
from tests.support import app_server, hosted, orchestrator_stack


def _charge(order: Any) -> None:
    raise ValueError("card declined")


def build_app(deployment: str = "deploy-7") -> stepline.Stepline:
    sl = stepline.Stepline("secret-contract-points", deployment_id=deployment)

    @sl.workflow("checkout", retries=stepline.Retries(attempts=1))
    async def checkout(ctx: stepline.Context, input: Any) -> None:
        await ctx.step("charge", _charge, input)

    @sl.workflow("two-steps")
    async def two_steps(ctx: stepline.Context, input: Any) -> list[int]:
        a = await ctx.step("a", lambda: 1)
        await ctx.sleep("nap", "10ms")
        b = await ctx.step("b", lambda: 2)
        return [a, b]

    return sl


async def test_a_failed_step_and_run_have_code_type_message_and_the_users_traceback(
    database_url: str,
) -> None:
    """``GET /v1/runs/{id}`` shows the step's and the run's error as ``{code, message, type,
    traceback}``: code ``step_failed``, the traceback of the user's function (no SDK or asyncio
    frame)."""
    sl = build_app()
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        run = await stack.client.start_run("checkout", {"orderId": "o1"})
        done = await stack.client.wait_run(run["id"], timeout=30)
    assert done["status"] == "failed"
    step = done["steps"][0]["error"]
    assert {k: step[k] for k in ("code", "type", "message")} == {
        "code": "step_failed",
        "type": "ValueError",
        "message": "card declined",
    }
    assert "in _charge" in step["traceback"] and "stepline/_engine.py" not in step["traceback"]
    assert "asyncio" not in step["traceback"]
    assert done["error"]["code"] == "step_failed" and isinstance(done["error"]["message"], str)


async def test_invocations_say_what_was_sent_and_events_carry_deployments(
    database_url: str,
) -> None:
    """Each invocation lists ``request`` as ``POST <url> (<n> bytes)``; ``invocation.started``
    carries the deployment the app last synced or answered with, ``invocation.ended`` the one
    it answered with, on the first invocation and on later ones."""
    sl = build_app("deploy-7")
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        run = await stack.client.start_run("two-steps", None)
        done = await stack.client.wait_run(run["id"], timeout=30)
        assert done["status"] == "completed"
        listed = await stack.client.list_run_invocations(run["id"])
        events = [e async for e in stack.client.iter_run_events(run["id"])]
    invocations = listed["invocations"]
    assert len(invocations) == 2
    for item in invocations:
        request = item["request"]
        assert request.startswith(f"POST {url} (") and request.endswith(" bytes)")
        assert int(request.split("(")[1].split()[0]) > 0
    started = [e for e in events if e["type"] == "invocation.started"]
    ended = [e for e in events if e["type"] == "invocation.ended"]
    assert [e.get("deploymentId") for e in started] == ["deploy-7", "deploy-7"]
    assert [e.get("deploymentId") for e in ended] == ["deploy-7", "deploy-7"]
    assert all(e["data"]["request"].startswith("POST ") for e in ended)


async def test_the_next_invocation_expects_the_deployment_the_app_last_answered_with(
    database_url: str,
) -> None:
    """After the app answers as a new deployment (a redeploy with no sync), the next
    ``invocation.started`` expects that one."""
    old, new = build_app("deploy-1"), build_app("deploy-2")
    async with orchestrator_stack(database_url) as stack:
        async with app_server(old) as url:
            await stack.register(old, url)
        port = int(url.rstrip("/").rsplit(":", 1)[1])
        async with app_server(new, port=port):
            first = await stack.client.start_run("two-steps", None)
            assert (await stack.client.wait_run(first["id"], timeout=30))["status"] == "completed"
            second = await stack.client.start_run("two-steps", None)
            assert (await stack.client.wait_run(second["id"], timeout=30))["status"] == "completed"
            one = [e async for e in stack.client.iter_run_events(first["id"])]
            two = [e async for e in stack.client.iter_run_events(second["id"])]
    starts = [e.get("deploymentId") for e in one if e["type"] == "invocation.started"]
    assert starts == ["deploy-1", "deploy-2"]  # synced as 1; answered as 2 since
    expected = next(e.get("deploymentId") for e in two if e["type"] == "invocation.started")
    assert expected == "deploy-2"


async def test_a_pull_apps_invocations_say_which_worker_polled_them(database_url: str) -> None:
    """A pull app's invocation lists ``request`` as ``poll by <worker>``."""
    sl = build_app()
    async with orchestrator_stack(database_url) as stack, hosted(stack, sl, "pull"):
        run = await stack.client.start_run("two-steps", None)
        assert (await stack.client.wait_run(run["id"], timeout=30))["status"] == "completed"
        listed = await stack.client.list_run_invocations(run["id"])
    requests = [i["request"] for i in listed["invocations"]]
    assert requests and all(r.startswith("poll by ") and ":" in r for r in requests), requests


async def test_a_completed_run_is_reset_from_a_step(database_url: str) -> None:
    """``POST /v1/runs/{id}/retry {fromStep}`` on a completed run runs that step and those after
    it again and keeps the earlier ones; without ``fromStep`` it is ``409 invalid_state``."""
    calls: dict[str, int] = {"a": 0, "b": 0}
    sl = stepline.Stepline("secret-reset")

    def count(name: str) -> int:
        calls[name] += 1
        return calls[name]

    @sl.workflow("counted")
    async def counted(ctx: stepline.Context, input: Any) -> list[int]:
        a = await ctx.step("a", count, "a")
        b = await ctx.step("b", count, "b")
        return [a, b]

    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        run = await stack.client.start_run("counted", None)
        done = await stack.client.wait_run(run["id"], timeout=30)
        assert done["status"] == "completed" and done["output"] == [1, 1]
        async with httpx.AsyncClient(base_url=stack.url) as http:
            headers = {"Authorization": f"Bearer {stack.api_key}"}
            refused = await http.post(f"/v1/runs/{run['id']}/retry", headers=headers, json={})
            assert refused.status_code == 409
            assert refused.json()["error"]["code"] == "invalid_state"
            reset = await http.post(
                f"/v1/runs/{run['id']}/retry", headers=headers, json={"fromStep": "b"}
            )
        assert reset.status_code == 202 and reset.json()["status"] == "running"
        again = await stack.client.wait_run(run["id"], timeout=30)
    assert again["status"] == "completed" and again["output"] == [1, 2]
    assert calls == {"a": 1, "b": 2} and again["trigger"] == "retry"
