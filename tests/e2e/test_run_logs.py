"""Run logs end to end: ``ctx.log`` and the ``logging`` records of steps are kept on the run
once (replays write nothing again), capped per run with a count of what was dropped, listed by
``GET /v1/runs/{id}/logs`` page by page, and printed by ``stepline runs logs [--follow]``."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

import stepline
from stepline_server.cli import main as cli_main
from stepline_server.cli import operate
from tests.support import Stack, app_server, orchestrator_stack

payments = logging.getLogger("tests.payments")
payments.setLevel(logging.INFO)
unset = logging.getLogger("tests.unset")  # no level of its own: the root's applies


def build_app(calls: dict[str, int]) -> stepline.Stepline:
    sl = stepline.Stepline("whsec_run_logs")

    def charge(amount: int) -> int:
        calls["charge"] = calls.get("charge", 0) + 1
        payments.info("charging %d", amount, extra={"amount": amount})
        payments.debug("not kept: below the logger's level")
        return amount

    async def ship() -> str:
        calls["ship"] = calls.get("ship", 0) + 1
        try:
            raise ValueError("carrier down")
        except ValueError:
            payments.exception("shipping failed once")
        return "shipped"

    @sl.workflow("order")
    async def order(ctx: stepline.Context, input: dict[str, Any]) -> str:
        ctx.log.info("order received", orderId=input["id"])
        await ctx.step("charge", charge, 5)
        ctx.log.info("charged")
        await ctx.sleep("cool-off", "20ms")
        ctx.log.warning("after the sleep", html="<b>bold</b>")
        await ctx.step("ship", ship)
        approval = await ctx.callback("approve", timeout="1h") if input.get("wait") else None
        if approval is not None:
            ctx.log.info("waiting for approval")
            await approval.wait()
        ctx.log.error("done")
        return "ok"

    @sl.workflow("chatty")
    async def chatty(ctx: stepline.Context, input: dict[str, int]) -> int:
        # Each invocation writes input["n"] lines: three invocations go past the run's cap.
        for part in ("a", "b", "c"):

            def many(part: str = part) -> int:
                for i in range(input["n"]):
                    payments.info("%s-%d", part, i)
                return input["n"]

            await ctx.step(f"write-{part}", many)
            await ctx.sleep(f"pause-{part}", "1ms")
        ctx.log.info("never kept: the log is full")
        return input["n"]

    @sl.workflow("in-steps")
    async def in_steps(ctx: stepline.Context, input: None) -> str:
        def sync_work() -> str:
            ctx.log.info("ctx line in a sync step", n=1)
            unset.info("logging line in a sync step")
            unset.debug("not kept: debug")
            return "sync"

        async def async_work() -> str:
            ctx.log.info("ctx line in an async step")
            unset.info("logging line in an async step")
            return "async"

        await ctx.step("sync-work", sync_work)
        await ctx.sleep("nap", "10ms")
        return await ctx.step("async-work", async_work)

    @sl.workflow("big-lines")
    async def big_lines(ctx: stepline.Context, input: None) -> None:
        for i in range(70):
            ctx.log.info(f"{i:03d}" + "x" * (16 * 1024 - 16))

    return sl


@dataclass
class Env:
    stack: Stack
    calls: dict[str, int]


@pytest.fixture
async def env(database_url: str) -> AsyncIterator[Env]:
    calls: dict[str, int] = {}
    sl = build_app(calls)
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        yield Env(stack, calls)


async def _logs(stack: Stack, run_id: str, **params: Any) -> dict[str, Any]:
    answer: dict[str, Any] = await stack.client.list_run_logs(run_id, **params)
    return answer


async def test_lines_are_kept_once_across_replays(env: Env) -> None:
    """Workflow lines and step logging records are kept in order, each once, though the
    workflow code ran again in every invocation; lines of a step name it, fields are kept,
    records below the logger's level and the SDK's own are not."""
    run = await env.stack.client.start_run("order", {"id": "o-1"})
    done = await env.stack.client.wait_run(run["id"], timeout=30)
    assert done["status"] == "completed", done
    assert done["invocations"] >= 2  # the sleep made the code run again
    page = await _logs(env.stack, run["id"])
    lines = page["logs"]
    assert [(line["level"], line["message"], line["stepName"]) for line in lines] == [
        ("info", "order received", None),
        ("info", "charging 5", "charge"),
        ("info", "charged", None),
        ("warning", "after the sleep", None),
        ("error", "shipping failed once", "ship"),
        ("error", "done", None),
    ]
    assert lines[0]["fields"] == {"orderId": "o-1"}
    assert lines[1]["fields"] == {"logger": "tests.payments", "amount": 5}
    assert "ValueError: carrier down" in lines[4]["fields"]["exception"]
    assert [line["seq"] for line in lines] == [1, 2, 3, 4, 5, 6]
    assert page["logsDropped"] == 0 and page["nextCursor"] is None
    assert done["logLines"] == 6 and done["logsDropped"] == 0
    assert env.calls == {"charge": 1, "ship": 1}


async def test_info_lines_in_steps_are_kept_whatever_the_root_level(env: Env) -> None:
    """With the root logger at WARNING (Python's default), ctx.log.info and a logging INFO
    record in a step (sync or async, after a sleep too) are kept on the run; DEBUG records of
    loggers without a level of their own are not."""
    root = logging.getLogger()
    before = root.level
    root.setLevel(logging.WARNING)
    try:
        run = await env.stack.client.start_run("in-steps", None)
        done = await env.stack.client.wait_run(run["id"], timeout=30)
    finally:
        root.setLevel(before)
    assert done["status"] == "completed", done
    lines = (await _logs(env.stack, run["id"]))["logs"]
    assert [(line["level"], line["message"], line["stepName"]) for line in lines] == [
        ("info", "ctx line in a sync step", "sync-work"),
        ("info", "logging line in a sync step", "sync-work"),
        ("info", "ctx line in an async step", "async-work"),
        ("info", "logging line in an async step", "async-work"),
    ]


async def test_pages_and_after(env: Env) -> None:
    """The lines come a page at a time with a cursor, or after a seq; a bad cursor or limit
    is a 422 naming it; a run of another id is 404."""
    run = await env.stack.client.start_run("order", {"id": "o-2"})
    await env.stack.client.wait_run(run["id"], timeout=30)
    first = await _logs(env.stack, run["id"], limit=4)
    assert [line["seq"] for line in first["logs"]] == [1, 2, 3, 4]
    rest = await _logs(env.stack, run["id"], limit=4, cursor=first["nextCursor"])
    assert [line["seq"] for line in rest["logs"]] == [5, 6] and rest["nextCursor"] is None
    after = await _logs(env.stack, run["id"], after=5)
    assert [line["message"] for line in after["logs"]] == ["done"]
    async with httpx.AsyncClient(
        base_url=env.stack.url, headers={"Authorization": f"Bearer {env.stack.api_key}"}
    ) as http:
        bad = (("limit=0", "limit"), ("cursor=nope", "cursor"), ("after=-1", "after"))
        for query, field in bad:
            answer = await http.get(f"/v1/runs/{run['id']}/logs?{query}")
            assert answer.status_code == 422, query
            assert field in answer.json()["error"]["details"]["fields"]
        missing = await http.get("/v1/runs/00000000-0000-0000-0000-000000000000/logs")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


async def test_a_run_keeps_at_most_1000_lines_and_counts_the_rest(env: Env) -> None:
    """Three invocations of 450 lines each: the first 1,000 are kept (across invocations),
    the newest 350 and every line after are dropped and counted, on the run and the list."""
    run = await env.stack.client.start_run("chatty", {"n": 450})
    done = await env.stack.client.wait_run(run["id"], timeout=60)
    assert done["status"] == "completed", done
    lines = [line async for line in env.stack.client.iter_run_logs(run["id"])]
    assert len(lines) == 1000
    assert lines[0]["message"] == "a-0" and lines[-1]["message"] == "c-99"
    assert [line["seq"] for line in lines] == list(range(1, 1001))
    page = await _logs(env.stack, run["id"], limit=1)
    assert page["logsDropped"] == 351
    assert done["logLines"] == 1000 and done["logsDropped"] == 351


async def test_a_run_keeps_at_most_1_mib_of_lines(env: Env) -> None:
    """Lines of 16 KiB: 64 make 1 MiB; the rest of the run's lines are dropped and counted."""
    run = await env.stack.client.start_run("big-lines", None)
    done = await env.stack.client.wait_run(run["id"], timeout=30)
    assert done["status"] == "completed", done
    lines = [line async for line in env.stack.client.iter_run_logs(run["id"])]
    assert len(lines) == 64 and lines[-1]["message"].startswith("063")
    assert done["logsDropped"] == 70 - 64


def _call(argv: list[str]) -> tuple[int, str, str]:
    args = cli_main.parser().parse_args(argv)
    out, err = io.StringIO(), io.StringIO()
    return operate.run(args, out, err), out.getvalue(), err.getvalue()


async def cli(stack: Stack, *argv: str) -> tuple[int, str, str]:
    full = [*argv, "--url", stack.url, "--api-key", stack.api_key]
    return await asyncio.to_thread(_call, full)


async def test_cli_prints_and_follows_the_logs(env: Env) -> None:
    """`stepline runs logs ID` prints the lines (JSON with --json); with --follow it prints
    lines as they come and returns once the run has ended."""
    run = await env.stack.client.start_run("order", {"id": "o-3", "wait": True})
    for _ in range(400):
        current = await env.stack.client.get_run(run["id"])
        waiting = [s for s in current["steps"] if s["name"] == "approve"]
        if waiting and waiting[0]["status"] == "waiting":
            break
        await asyncio.sleep(0.05)
    follow = asyncio.create_task(cli(env.stack, "runs", "logs", run["id"], "--follow"))
    code, out, err = await cli(env.stack, "runs", "logs", run["id"])
    assert code == 0, err
    assert "order received" in out and "charging 5" in out and "waiting for approval" in out
    assert "INFO" in out and '"orderId":"o-3"' in out
    assert not follow.done()
    await env.stack.client.complete_callback(waiting[0]["callbackId"], {"ok": True})
    code, out, err = await asyncio.wait_for(follow, 30)
    assert code == 0, err
    assert out.index("order received") < out.index("waiting for approval") < out.index("done")
    assert out.count("order received") == 1
    code, out, err = await cli(env.stack, "runs", "logs", run["id"], "--json")
    assert code == 0, err
    shown = json.loads(out)
    assert [line["message"] for line in shown["logs"]][-1] == "done"
    assert shown["logsDropped"] == 0
    code, _, err = await cli(env.stack, "runs", "logs", "00000000-0000-0000-0000-000000000000")
    assert code == 1 and "not_found" in err
