"""Published state: a workflow's ctx.set_state read by clients while the run goes on, with
long polls that wake on the set (across orchestrators too) and hold no database connection."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

import stepline
from stepline import protocol
from stepline_server.store import keys
from tests.dashboard_forms import Dashboard
from tests.support import Stack, app_server, hosted, orchestrator_stack, until

sl = stepline.Stepline("state-e2e")


@sl.workflow("progress")
async def progress(ctx: stepline.Context, input: Any) -> Any:
    await ctx.set_state("progress", {"done": 1})
    first = await ctx.callback("go")
    await first.wait()
    await ctx.set_state("progress", {"done": 2})
    await ctx.set_state("late", "here")
    end = await ctx.callback("end")
    return await end.wait()


@sl.workflow("rounds")
async def rounds(ctx: stepline.Context, input: Any) -> Any:
    await ctx.set_state("first", True)
    for n in range(3):
        await ctx.set_state("round", n)
        cb = await ctx.callback(f"cb{n}")
        await cb.wait()
    return "done"


@sl.workflow("bounds")
async def bounds(ctx: stepline.Context, input: Any) -> Any:
    codes = {}
    for key, value in [("bad key!", 1), ("big", "x" * 65 * 1024)]:
        try:
            await ctx.set_state(key, value)
        except stepline.StateError as exc:
            codes[key] = [exc.code, str(exc)]
    return codes


@sl.workflow("keys")
async def many_keys(ctx: stepline.Context, input: Any) -> Any:
    # Each generation's SDK knows only its own keys: the orchestrator counts them all.
    for n in range(60):
        await ctx.set_state(f"g{ctx.generation}-{n}", n)
    if ctx.generation == 1:
        ctx.continue_as_new(None)
    cb = await ctx.callback("after")
    return await cb.wait()


async def _callback_id(stack: Stack, run_id: str, name: str) -> str:
    async def waiting() -> str | None:
        run = await stack.client.get_run(run_id)
        for step in run["steps"]:
            if step["name"] == name and step["status"] == "waiting":
                return str(step["callbackId"])
        return None

    return str(await until(waiting, f"callback {name} waiting"))


async def _events(stack: Stack, run_id: str, type: str) -> list[dict[str, Any]]:
    page = await stack.client.list_run_events(run_id, limit=500)
    return [e for e in page["events"] if e["type"] == type]


@pytest.mark.parametrize("kind", ["push", "pull"])
async def test_state_is_readable_while_the_run_waits_and_overwritten_later(
    database_url: str, kind: str
) -> None:
    """The state set before a callback wait is readable while the run waits; the next set of
    the key overwrites it; the history keeps each set as a state.set event."""
    async with orchestrator_stack(database_url) as stack, hosted(stack, sl, kind):
        run = await stack.client.start_run("progress", None)
        go = await _callback_id(stack, run["id"], "go")
        assert (await stack.client.get_run(run["id"]))["status"] == "running"
        assert await stack.client.get_state(run["id"], "progress") == {"done": 1}
        assert await stack.client.get_all_state(run["id"]) == {"progress": {"done": 1}}
        await stack.client.complete_callback(go, {"ok": True})
        end = await _callback_id(stack, run["id"], "end")
        assert await stack.client.get_all_state(run["id"]) == {
            "late": "here",
            "progress": {"done": 2},
        }
        await stack.client.complete_callback(end, "bye")
        done = await stack.client.wait_run(run["id"], timeout=30)
        assert done["status"] == "completed"
        sets = await _events(stack, run["id"], "state.set")
        assert [e["data"]["key"] for e in sets] == ["progress", "progress", "late"]
        async with httpx.AsyncClient(base_url=stack.url) as http:
            headers = {"authorization": f"Bearer {stack.api_key}"}
            one = await http.get(f"/v1/runs/{run['id']}/state/progress", headers=headers)
            assert one.status_code == 200
            body = one.json()
            assert body["key"] == "progress" and body["value"] == {"done": 2}
            assert body["updatedAt"].endswith("Z") or "+" in body["updatedAt"]


async def test_replays_never_record_a_set_again(database_url: str) -> None:
    """A run resumed four times (a replay each) has each set recorded once."""
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        run = await stack.client.start_run("rounds", None)
        for n in range(3):
            cb = await _callback_id(stack, run["id"], f"cb{n}")
            await stack.client.complete_callback(cb, n)
        done = await stack.client.wait_run(run["id"], timeout=30)
        assert done["status"] == "completed"
        assert len(await _events(stack, run["id"], "invocation.started")) >= 4
        sets = await _events(stack, run["id"], "state.set")
        assert [e["data"]["key"] for e in sets] == ["first", "round", "round", "round"]
        assert await stack.client.get_all_state(run["id"]) == {"first": True, "round": 2}


async def test_a_long_poll_wakes_when_the_key_is_set_and_404s_when_never(
    database_url: str,
) -> None:
    """?wait= answers as soon as the key is set (long before its 50 s), for 25 polls at once
    (more than the pool's connections: a waiting poll holds none), through another
    orchestrator than the one the app is registered with; a key never set is 404 after the
    wait."""
    async with (
        orchestrator_stack(database_url) as one,
        orchestrator_stack(database_url) as two,
        app_server(sl) as url,
    ):
        await one.register(sl, url)
        run = await one.client.start_run("progress", None)
        go = await _callback_id(one, run["id"], "go")
        assert two.orchestrator.pool.get_max_size() < 25
        started = time.monotonic()
        polls = [
            asyncio.create_task(two.client.get_state(run["id"], "late", wait="50s"))
            for _ in range(25)
        ]
        await asyncio.sleep(1.0)
        assert not any(p.done() for p in polls)  # they wait: the key is not set
        await one.client.complete_callback(go, {})
        values = await asyncio.wait_for(asyncio.gather(*polls), 40)
        assert values == ["here"] * 25
        assert time.monotonic() - started < 40  # woken, not timed out
        with pytest.raises(stepline.ApiError) as missing:
            await two.client.get_state(run["id"], "never", wait="1s")
        assert missing.value.status == 404 and missing.value.details["key"] == "never"
        assert time.monotonic() - started >= 1.0


async def test_bounds_give_clear_errors(database_url: str) -> None:
    """A bad key and a 65 KiB value raise StateError in the workflow (nothing sent); keys past
    the run's 100 (across generations) are refused by the orchestrator: the step fails with
    state_keys_exceeded, and so does the run when it replays it; a bad key in a read is 422."""
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        run = await stack.client.start_run("bounds", None)
        done = await stack.client.wait_run(run["id"], timeout=30)
        assert done["status"] == "completed"
        assert done["output"]["bad key!"][0] == "state_key_invalid"
        assert (
            done["output"]["big"][0] == "state_too_large" and "64 KiB" in done["output"]["big"][1]
        )
        assert await stack.client.get_all_state(run["id"]) == {}

        many = await stack.client.start_run("keys", None)
        after = await _callback_id(stack, many["id"], "after")
        state = await stack.client.get_all_state(many["id"])
        assert len(state) == protocol.MAX_STATE_KEYS
        detail = await stack.client.get_run(many["id"])
        refused = [s for s in detail["steps"] if s["status"] == "failed"]
        assert len(refused) == 20
        assert {s["error"]["code"] for s in refused} == {"state_keys_exceeded"}
        await stack.client.complete_callback(after, {})
        ended = await stack.client.wait_run(many["id"], timeout=30)
        assert ended["status"] == "failed" and ended["error"]["code"] == "state_keys_exceeded"

        async with httpx.AsyncClient(base_url=stack.url) as http:
            headers = {"authorization": f"Bearer {stack.api_key}"}
            bad = await http.get(f"/v1/runs/{run['id']}/state/no%20good", headers=headers)
            assert bad.status_code == 422 and bad.json()["error"]["code"] == "validation_failed"


async def test_another_environment_sees_no_state(database_url: str) -> None:
    """A key of another environment reads a run's state as 404, with or without a key."""
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        run = await stack.client.start_run("progress", None)
        await _callback_id(stack, run["id"], "go")
        async with stack.orchestrator.pool.acquire() as conn:
            staging = await keys.find_environment(conn, keys.DEFAULT_PROJECT, "staging")
            assert staging is not None
            key = await keys.create_key(conn, "other", staging["id"], "read")
        async with stepline.AsyncClient(stack.url, api_key=key) as other:
            with pytest.raises(stepline.ApiError) as whole:
                await other.get_all_state(run["id"])
            assert whole.value.status == 404
            with pytest.raises(stepline.ApiError) as one:
                await other.get_state(run["id"], "progress", wait="1s")
            assert one.value.status == 404


async def test_the_run_page_shows_the_state(database_url: str) -> None:
    """The dashboard's run page lists each key with its current value."""
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        run = await stack.client.start_run("progress", None)
        await _callback_id(stack, run["id"], "go")
        async with Dashboard(stack.url) as person:
            await person.sign_in(stack.api_key)
            page = await person.get(f"/ui/runs/{run['id']}")
        assert page.status_code == 200
        assert 'id="run-state"' in page.text and 'data-key="progress"' in page.text
        assert "&#34;done&#34;: 1" in page.text or '"done": 1' in page.text
