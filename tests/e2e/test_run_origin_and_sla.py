"""Where a run came from (``trigger``: ``api``, ``parent``, ``retry``, ``manual``) and how a
scheduled run kept to its schedule's SLA (``startLagMs``, ``e2eMs``, ``slaBreached``), through
the API and the CLI, against a real orchestrator and app."""

from __future__ import annotations

import asyncio
import io
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

import stepline
from stepline_server.cli import main as cli_main
from stepline_server.cli import operate
from stepline_server.store import keys, runs
from tests.support import Stack, app_server, orchestrator_stack

YEARLY = "0 0 1 1 *"  # never due while a test runs


def build_app(state: dict[str, bool]) -> stepline.Stepline:
    sl = stepline.Stepline("whsec_origin")

    @sl.workflow("parent")
    async def parent(ctx: stepline.Context, input: None) -> Any:
        return await ctx.invoke("child", "child", {"n": 1})

    @sl.workflow("child")
    async def child(ctx: stepline.Context, input: dict[str, int]) -> int:
        return await ctx.step("double", lambda: input["n"] * 2)

    @sl.workflow("flaky", retries=stepline.Retries(attempts=1))
    async def flaky(ctx: stepline.Context, input: None) -> str:
        def work() -> str:
            if not state.get("fixed"):
                raise stepline.TerminalError("not yet")
            return "worked"

        return await ctx.step("work", work)

    @sl.workflow("nightly", schedule={"cron": YEARLY, "sla": "10m"})
    async def nightly(ctx: stepline.Context, input: Any) -> None:
        return None

    @sl.workflow("report")
    async def report(ctx: stepline.Context, input: Any) -> str:
        return await ctx.step("make", lambda: "report")

    return sl


@pytest.fixture
async def env(database_url: str) -> AsyncIterator[tuple[Stack, dict[str, bool]]]:
    state: dict[str, bool] = {}
    sl = build_app(state)
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        yield stack, state


async def test_a_child_run_says_it_came_from_its_parent(
    env: tuple[Stack, dict[str, bool]],
) -> None:
    """A run started by the API says ``api``; the child it invokes says ``parent``, in the run
    and in its ``run.started`` event."""
    stack, _ = env
    run = await stack.client.start_run("parent", None)
    done = await stack.client.wait_run(run["id"], timeout=30)
    assert done["status"] == "completed" and done["output"] == 2
    assert done["trigger"] == "api"
    child = await stack.client.get_run(done["steps"][0]["childRunId"])
    assert child["trigger"] == "parent" and child["parentRunId"] == run["id"]
    events = [e async for e in stack.client.iter_run_events(child["id"])]
    started = events[0]
    assert started["type"] == "run.started" and started["data"]["trigger"] == "parent"
    listed = (await stack.client.list_runs(workflow="child"))["runs"]
    assert [r["trigger"] for r in listed] == ["parent"]


async def test_a_retried_run_says_retry_and_keeps_where_it_first_came_from(
    env: tuple[Stack, dict[str, bool]],
) -> None:
    """Retry runs the same run again: its trigger becomes ``retry`` and its ``run.retried``
    event keeps the trigger it had."""
    stack, state = env
    run = await stack.client.start_run("flaky", None)
    failed = await stack.client.wait_run(run["id"], timeout=30)
    assert failed["status"] == "failed" and failed["trigger"] == "api"
    state["fixed"] = True
    retried = await stack.client.retry_run(run["id"])
    assert retried["id"] == run["id"] and retried["trigger"] == "retry"
    done = await stack.client.wait_run(run["id"], timeout=30)
    assert done["status"] == "completed" and done["trigger"] == "retry"
    events = [e async for e in stack.client.iter_run_events(run["id"])]
    assert events[0]["data"]["trigger"] == "api"
    again = [e for e in events if e["type"] == "run.retried"]
    assert len(again) == 1 and again[0]["data"]["previousTrigger"] == "api"
    starts = [e["data"]["trigger"] for e in events if e["type"] == "run.started"]
    assert starts == ["api", "retry"]  # the retry starts the run again, after run.retried
    after = events[events.index(again[0]) + 1]  # the event right after run.retried
    assert after["type"] == "run.started" and after["data"]["trigger"] == "retry"


async def test_a_schedule_sets_an_sla_and_its_runs_show_how_they_kept_to_it(
    env: tuple[Stack, dict[str, bool]],
) -> None:
    """``sla`` is a duration (shown as ``slaMs``) set by POST and changed or removed by PATCH;
    a run of the schedule shows its start lag, its end-to-end time and whether the lag was over
    the SLA; a run no schedule started shows none of it."""
    stack, _ = env
    c = stack.client
    schedule = await c.create_schedule("report", YEARLY, sla="1h")
    assert schedule["slaMs"] == 3_600_000
    run = await c.trigger_schedule(schedule["id"])
    assert run["trigger"] == "manual" and run["slaMs"] == 3_600_000
    done = await c.wait_run(run["id"], timeout=30)
    assert done["status"] == "completed"
    assert done["startLagMs"] is not None and done["e2eMs"] >= done["startLagMs"] >= 0
    assert done["slaBreached"] is False

    # A run of the schedule whose tick was an hour ago (as a tick fired late would be).
    async with stack.orchestrator.pool.acquire() as conn:
        late = await runs.insert(
            conn,
            runs.NewRun(
                uuid.uuid4(), keys.DEFAULT_PROJECT, "report", None,
                schedule_id=schedule["id"], trigger="schedule",
                scheduled_at=datetime.now(UTC) - timedelta(hours=1, minutes=1),
            ),
        )  # fmt: skip
    assert late is not None
    stack.orchestrator.dispatcher.wake()
    ended = await c.wait_run(str(late["id"]), timeout=30)
    assert ended["status"] == "completed" and ended["trigger"] == "schedule"
    assert ended["startLagMs"] > 3_600_000 and ended["slaBreached"] is True

    changed = await c.update_schedule(schedule["id"], sla="2h")
    assert changed["slaMs"] == 7_200_000
    assert (await c.get_run(str(late["id"])))["slaBreached"] is False  # judged by the SLA now
    listed = {r["id"]: r for r in (await c.list_runs(workflow="report"))["runs"]}
    assert listed[str(late["id"])]["slaMs"] == 7_200_000
    removed = await c.update_schedule(schedule["id"], sla=None)
    assert removed["slaMs"] is None
    assert (await c.get_run(run["id"]))["slaBreached"] is None

    plain = await c.wait_run((await c.start_run("report", None))["id"], timeout=30)
    assert (plain["startLagMs"], plain["e2eMs"], plain["slaBreached"]) == (None, None, None)

    out = await asyncio.to_thread(_cli, stack, "runs", "show", str(late["id"]))
    assert "start lag 1h" in out and "trigger   schedule" in out
    await c.update_schedule(schedule["id"], sla="90s")
    out = await asyncio.to_thread(_cli, stack, "runs", "show", str(late["id"]))
    assert "SLA 1m 30s BREACHED" in out
    out = await asyncio.to_thread(_cli, stack, "schedules", "list")
    assert out.splitlines()[0].split()[-1] == "SLA" and "1m 30s" in out


async def test_a_schedule_declared_in_code_sets_its_sla(
    env: tuple[Stack, dict[str, bool]],
) -> None:
    """``schedule={"cron": ..., "sla": "10m"}`` on a workflow: app sync makes its schedule with
    that SLA."""
    stack, _ = env
    (code,) = [s for s in (await stack.client.list_schedules())["schedules"]]
    assert (code["workflow"], code["source"], code["slaMs"]) == ("nightly", "code", 600_000)


@pytest.mark.parametrize("sla", [0, -1, "0s", "soon", True, [1], {"s": 1}, 1e300, 400 * 86_400])
async def test_a_bad_sla_is_refused_and_changes_nothing(
    env: tuple[Stack, dict[str, bool]], sla: Any
) -> None:
    """An SLA that is not a duration over 0 (and at most 366 days) is a 422 naming ``sla``,
    on create and on change, and nothing is created or changed."""
    stack, _ = env
    async with httpx.AsyncClient(
        base_url=stack.url, headers={"Authorization": f"Bearer {stack.api_key}"}
    ) as http:
        body = {"workflow": "report", "cron": YEARLY, "timezone": "UTC", "sla": sla}
        answer = await http.post("/v1/schedules", json=body)
        assert answer.status_code == 422, answer.text
        assert "sla" in answer.json()["error"]["details"]["fields"]
        listed = (await stack.client.list_schedules())["schedules"]
        assert [s["workflow"] for s in listed] == ["nightly"]
        made = await stack.client.create_schedule("report", YEARLY, sla="5m")
        answer = await http.patch(f"/v1/schedules/{made['id']}", json={"sla": sla})
        assert answer.status_code == 422, answer.text
        assert (await stack.client.get_schedule(made["id"]))["slaMs"] == 300_000


def _cli(stack: Stack, *argv: str) -> str:
    args = cli_main.parser().parse_args([*argv, "--url", stack.url, "--api-key", stack.api_key])
    out, err = io.StringIO(), io.StringIO()
    assert operate.run(args, out, err) == 0, err.getvalue()
    return out.getvalue()
