"""``/metrics`` after real runs: counters by workflow and status, histograms that move."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

import stepline
from tests.support import Stack, app_server, orchestrator_stack


async def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``url``/metrics by (name, sorted labels)."""
    async with httpx.AsyncClient() as http:
        response = await http.get(url + "/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    """The sample ``name`` with exactly ``labels`` (0 when absent)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def make_app() -> stepline.Stepline:
    sl = stepline.Stepline("secret-metrics")

    @sl.workflow("nap")
    async def nap(ctx: stepline.Context, n: int) -> int:
        a = await ctx.step("a", lambda: n)
        await ctx.sleep("rest", "200ms")
        return await ctx.step("b", lambda: a + 1)  # type: ignore[no-any-return]

    @sl.workflow("boom")
    async def boom(ctx: stepline.Context, n: int) -> int:
        raise stepline.TerminalError("no")

    @sl.workflow("hold")
    async def hold(ctx: stepline.Context, n: int) -> Any:
        cb = await ctx.callback("cb")
        return await cb.wait()

    return sl


async def _until(stack: Stack, check: Any, timeout: float = 15.0) -> dict[Any, float]:
    """Scrape until ``check(samples)`` holds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        samples = await scrape(stack.url)
        if check(samples) or asyncio.get_running_loop().time() > deadline:
            return samples
        await asyncio.sleep(0.1)


async def test_metrics_count_runs_steps_invocations_and_timers(database_url: str) -> None:
    """Real runs move the run counters (by workflow and status), the step, invocation and
    timer-lateness histograms, the group-commit sizes, and the pool and backlog gauges."""
    sl = make_app()
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        naps = [await stack.client.start_run("nap", n) for n in range(3)]
        fails = await stack.client.start_run("boom", 0)
        for run in [*naps, fails]:
            await stack.client.wait_run(run["id"], timeout=20)
        s = await _until(stack, lambda s: value(s, "stepline_timer_lateness_seconds_count") >= 3)
    assert value(s, "stepline_runs_started_total", workflow="nap", trigger="api") == 3
    assert value(s, "stepline_runs_started_total", workflow="boom", trigger="api") == 1
    assert value(s, "stepline_runs_ended_total", workflow="nap", status="completed") == 3
    assert value(s, "stepline_runs_ended_total", workflow="boom", status="failed") == 1
    # Each nap suspends at its sleep and completes on its second invocation.
    assert value(s, "stepline_invocations_total", outcome="suspended") == 3
    done = {"workflow": "nap", "outcome": "completed"}
    assert value(s, "stepline_invocation_duration_seconds_count", **done) == 3
    assert value(s, "stepline_invocation_duration_seconds_sum", **done) > 0
    step = {"workflow": "nap", "kind": "run", "status": "completed"}
    assert value(s, "stepline_step_duration_seconds_count", **step) == 6
    ran = {"workflow": "nap", "status": "completed"}
    assert value(s, "stepline_run_duration_seconds_count", **ran) == 3
    assert value(s, "stepline_run_duration_seconds_sum", **ran) >= 3 * 0.2  # each slept 200 ms
    assert value(s, "stepline_run_duration_seconds_count", workflow="boom", status="failed") == 1
    late = value(s, "stepline_timer_lateness_seconds_count")
    assert late == 3
    assert value(s, "stepline_timer_lateness_seconds_bucket", le="+Inf") == late
    assert value(s, "stepline_group_commit_size_count") >= 1
    assert value(s, "stepline_progress_calls_total") >= 6
    assert value(s, "stepline_pool_connections") >= 1
    assert value(s, "stepline_pool_connections_max") == 20
    assert value(s, "stepline_runs_due") == 0
    assert ("stepline_runs_due_oldest_seconds", ()) in s


async def test_metrics_count_lease_takeovers_and_the_backlog(database_url: str) -> None:
    """A run whose lease ran out is claimed again and counted as taken over; runs due but not
    invoked show in the backlog gauge."""
    sl = make_app()
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        run = await stack.client.start_run("hold", 0)
        conn = await stack.conn()
        try:
            for _ in range(200):  # until it suspends at its callback
                row = await conn.fetchrow("SELECT lease_token FROM runs WHERE id = $1", run["id"])
                if row is not None and row["lease_token"] is None:
                    break
                await asyncio.sleep(0.05)
            stack.orchestrator.dispatcher.settings = stack.orchestrator.settings.with_(
                max_inflight=0
            )  # claims nothing, so the backlog stays
            await conn.execute(
                "UPDATE runs SET lease_token = 'dead', lease_owner = 'gone',"
                " ready_at = now() - interval '5 seconds' WHERE id = $1",
                run["id"],
            )
            s = await scrape(stack.url)
            assert value(s, "stepline_runs_due") == 1
            assert value(s, "stepline_runs_due_oldest_seconds") >= 5
            stack.orchestrator.dispatcher.settings = stack.orchestrator.settings
            stack.orchestrator.dispatcher.wake()
            s = await _until(
                stack, lambda s: value(s, "stepline_invocations_total", outcome="suspended") >= 2
            )
        finally:
            await conn.close()
    assert value(s, "stepline_lease_takeovers_total") == 1
    assert value(s, "stepline_invocations_total", outcome="suspended") == 2


async def test_metrics_count_delivery_failures(database_url: str) -> None:
    """An app that cannot be reached counts delivery failures."""
    sl = make_app()
    async with orchestrator_stack(database_url) as stack:
        async with app_server(sl) as url:
            await stack.register(sl, url)
        await stack.client.start_run("nap", 0)  # the app is gone now
        s = await _until(
            stack, lambda s: value(s, "stepline_invocations_total", outcome="delivery_failed")
        )
    assert value(s, "stepline_delivery_failures_total") >= 1
    assert value(s, "stepline_invocations_total", outcome="delivery_failed") >= 1


def make_triggered_app() -> stepline.Stepline:
    sl = stepline.Stepline("secret-metrics-triggers")

    @sl.workflow("welcome", on_event="user.signed_up")
    async def welcome(ctx: stepline.Context, input: Any) -> None:
        return None

    @sl.workflow("child")
    async def child(ctx: stepline.Context, input: Any) -> int:
        return 1

    @sl.workflow("parent")
    async def parent(ctx: stepline.Context, input: Any) -> Any:
        return await ctx.invoke("kid", "child", None)

    @sl.workflow("report", schedule={"cron": "0 0 1 1 *"})
    async def report(ctx: stepline.Context, input: Any) -> None:
        return None

    @sl.workflow("fails")
    async def fails(ctx: stepline.Context, input: Any) -> None:
        raise stepline.TerminalError("no")

    return sl


async def test_every_run_started_is_counted_whatever_started_it(database_url: str) -> None:
    """Runs started by an event, a manual schedule trigger, a parent and a retry are counted
    with their trigger, so a workflow's started count is never below its ended count; a
    triggered schedule's run measures its start lag."""
    sl = make_triggered_app()
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        sent = await stack.client.send_event("user.signed_up", {"userId": "u1"})
        schedule = (await stack.client.list_schedules())["schedules"][0]
        triggered = await stack.client.trigger_schedule(schedule["id"])
        parent = await stack.client.start_run("parent", None)
        failed = await stack.client.start_run("fails", None)
        started = [sent["startedRuns"][0], triggered["id"], parent["id"], failed["id"]]
        for run_id in started:
            await stack.client.wait_run(run_id, timeout=20)
        await stack.client.retry_run(failed["id"])
        await stack.client.wait_run(failed["id"], timeout=20)
        s = await _until(
            stack,
            lambda s: value(s, "stepline_runs_ended_total", workflow="fails", status="failed") == 2,
        )
    counted = {
        ("welcome", "event"),
        ("report", "manual"),
        ("parent", "api"),
        ("child", "parent"),
        ("fails", "api"),
        ("fails", "retry"),
    }
    for workflow, trigger in counted:
        assert value(s, "stepline_runs_started_total", workflow=workflow, trigger=trigger) == 1
    for workflow in ("welcome", "report", "parent", "child", "fails"):
        began = sum(v for (n, labels), v in s.items() if n == "stepline_runs_started_total"
                    and ("workflow", workflow) in labels)  # fmt: skip
        ended = sum(v for (n, labels), v in s.items() if n == "stepline_runs_ended_total"
                    and ("workflow", workflow) in labels)  # fmt: skip
        assert began == ended, workflow
    assert value(s, "stepline_schedule_start_lag_seconds_count", workflow="report") == 0


async def test_a_schedules_tick_counts_its_run_and_its_start_lag(database_url: str) -> None:
    """A tick the scheduler fires counts a run with trigger ``schedule`` and its lag from the
    tick (a tick fired a minute late lags about that much)."""
    sl = make_triggered_app()
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        await stack.client.create_schedule("report", "* * * * *", timezone="UTC")
        started = await stack.orchestrator.scheduler.tick(datetime.now(UTC) + timedelta(minutes=2))
        assert started >= 1
        s = await scrape(stack.url)
    assert value(s, "stepline_runs_started_total", workflow="report", trigger="schedule") == started
    assert value(s, "stepline_schedule_start_lag_seconds_count", workflow="report") == started
    assert value(s, "stepline_schedule_start_lag_seconds_sum", workflow="report") >= 60


async def test_a_buffered_ticks_run_is_counted_when_it_starts(database_url: str) -> None:
    """A ``buffer_one`` schedule's held tick starts its run once the active run ends, and that
    run is counted like any tick's (trigger ``schedule``, with its start lag)."""
    sl = make_app()
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        await stack.client.create_schedule("hold", "* * * * *", overlap="buffer_one")
        later = datetime.now(UTC) + timedelta(minutes=2)
        assert await stack.orchestrator.scheduler.tick(later) == 1  # one starts, one is held
        (first,) = (await stack.client.list_runs(workflow="hold"))["runs"]
        await stack.client.cancel_run(first["id"])
        await stack.client.wait_run(first["id"], timeout=20)
        for _ in range(100):  # the end makes the schedule due at the held tick
            if await stack.orchestrator.scheduler.tick(later):
                break
            await asyncio.sleep(0.1)
        assert len((await stack.client.list_runs(workflow="hold"))["runs"]) == 2
        s = await scrape(stack.url)
    assert value(s, "stepline_runs_started_total", workflow="hold", trigger="schedule") == 2
    assert value(s, "stepline_schedule_start_lag_seconds_count", workflow="hold") == 2
