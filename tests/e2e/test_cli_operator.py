"""The operator commands (`stepline runs|callbacks|events|apps|schedules …`) against a real
orchestrator over HTTP: tables for people, ``--json`` for scripts, exit codes 0, 1 and 2."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

import stepline
from stepline_server.cli import main as cli_main
from stepline_server.cli import operate
from stepline_server.store import apps, keys
from tests.support import Stack, app_server, orchestrator_stack, until

YEARLY = "0 0 1 1 *"


def build_app(state: dict[str, bool]) -> stepline.Stepline:
    """Workflows for every command: plain steps, a failure to retry, a callback, an event."""
    sl = stepline.Stepline("whsec_cli_test")

    @sl.workflow("greet")
    async def greet(ctx: stepline.Context, input: dict[str, Any]) -> dict[str, Any]:
        hello = await ctx.step("hello", lambda: f"hello {input['name']}")
        return {"said": hello}

    @sl.workflow("charge", retries=stepline.Retries(attempts=1))
    async def charge(ctx: stepline.Context, input: Any) -> str:
        await ctx.step("load", lambda: "loaded")

        def pay() -> str:
            if not state.get("fixed"):
                raise stepline.TerminalError("card declined")
            return "paid"

        return await ctx.step("pay", pay)

    @sl.workflow("approve")
    async def approve(ctx: stepline.Context, input: Any) -> Any:
        cb = await ctx.callback("approval", timeout="1h")
        return await cb.wait()

    @sl.workflow("kyc")
    async def kyc(ctx: stepline.Context, input: dict[str, Any]) -> Any:
        return await ctx.wait_for_event(
            "kyc", event="kyc.done", match={"u": input["u"]}, timeout="1h"
        )

    return sl


@dataclass
class Env:
    stack: Stack
    slug: str
    state: dict[str, bool]


@pytest.fixture
async def env(database_url: str) -> AsyncIterator[Env]:
    """An orchestrator with the app above registered and synced."""
    state: dict[str, bool] = {}
    sl = build_app(state)
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        slug = await stack.register(sl, url)
        yield Env(stack, slug, state)


def _call(argv: list[str]) -> tuple[int, str, str]:
    args = cli_main.parser().parse_args(argv)
    out, err = io.StringIO(), io.StringIO()
    code = operate.run(args, out, err)
    return code, out.getvalue(), err.getvalue()


async def cli(env: Env, *argv: str) -> tuple[int, str, str]:
    """Run a `stepline` operator command against the test's orchestrator (in a thread, since
    the command blocks and the orchestrator serves on this loop)."""
    full = [*argv, "--url", env.stack.url, "--api-key", env.stack.api_key]
    return await asyncio.to_thread(_call, full)


async def ok_json(env: Env, *argv: str) -> Any:
    code, out, err = await cli(env, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


async def test_runs_start_wait_list_show_events(env: Env) -> None:
    """`runs start --wait` prints the ended run and its progress; list finds it by run key (or
    its prefix) and status; show prints its steps; events prints the history, as tables and
    as JSON."""
    code, out, err = await cli(
        env, "runs", "start", "greet", "--input", '{"name": "ada"}', "--run-key", "k-1", "--wait"
    )
    assert code == 0, err
    assert "status    completed" in out and "hello ada" in out
    assert "waiting for it to end" in err and "completed" in err
    run = (await ok_json(env, "runs", "list", "--run-key", "k-1"))["runs"][0]
    assert run["status"] == "completed" and run["runKey"] == "k-1"
    prefixed = (await ok_json(env, "runs", "list", "--run-key", "k-*"))["runs"]
    assert [r["id"] for r in prefixed] == [run["id"]]
    code, _, err = await cli(env, "runs", "list", "--run-key", "k*1")
    assert code == 1 and "validation_failed" in err and "runKey" in err
    code, out, _ = await cli(env, "runs", "list", "--status", "completed", "--workflow", "greet")
    assert code == 0 and out.splitlines()[0].split()[:3] == ["ID", "WORKFLOW", "STATUS"]
    assert run["id"] in out and "k-1" in out
    code, out, _ = await cli(env, "runs", "show", run["id"])
    assert code == 0 and "hello" in out and "steps (1):" in out
    shown = await ok_json(env, "runs", "show", run["id"])
    assert shown["output"] == {"said": "hello ada"} and shown["steps"][0]["name"] == "hello"
    code, out, _ = await cli(env, "runs", "events", run["id"])
    assert code == 0 and "run.started" in out and "run.completed" in out
    events = (await ok_json(env, "runs", "events", run["id"]))["events"]
    assert events[0]["type"] == "run.started" and events[-1]["type"] == "run.completed"


async def test_events_follow_prints_until_the_run_ends(env: Env) -> None:
    """`runs events --follow` prints events as they come and returns once the run has ended;
    `callbacks complete` (by id) ends the run it waited in."""
    run = await env.stack.client.start_run("approve", None)
    for _ in range(200):
        current = await env.stack.client.get_run(run["id"])
        if current["steps"] and current["steps"][0]["status"] == "waiting":
            break
        await asyncio.sleep(0.05)
    step = current["steps"][0]
    assert step["callbackUrl"].startswith(env.stack.url + "/v1/callbacks/")
    code, out, _ = await cli(env, "runs", "show", run["id"])
    assert step["callbackUrl"] in out
    follow = asyncio.create_task(cli(env, "runs", "events", run["id"], "--follow", "--json"))
    await asyncio.sleep(1.0)
    assert not follow.done()
    code, out, err = await cli(
        env, "callbacks", "complete", step["callbackId"], "--data", '{"ok": true}'
    )
    assert code == 0 and "completed" in out, err
    code, out, err = await asyncio.wait_for(follow, 20)
    assert code == 0, err
    types = [json.loads(line)["type"] for line in out.splitlines()]
    assert types[0] == "run.started" and "callback.completed" in types
    assert types[-1] == "run.completed"
    code, _, err = await cli(env, "callbacks", "complete", step["callbackId"], "--data", "{}")
    assert code == 1 and "invalid_state" in err


async def test_failed_run_shows_traceback_and_retries_from_step(env: Env) -> None:
    """A failed run's traceback is printed by `runs show`; `runs retry --from-step` runs that
    step again on the fixed code; retrying a completed run without a step is an API error
    (exit 1), from a step it is a reset. `--wait` on a run that fails exits 3."""
    code, out, _ = await cli(env, "runs", "start", "charge", "--wait")
    assert code == 3 and "status    failed" in out
    assert "error terminal: card declined [TerminalError]" in out
    assert "card declined" in out and "Traceback" in out
    run_id = (await ok_json(env, "runs", "list", "--workflow", "charge"))["runs"][0]["id"]
    env.state["fixed"] = True
    code, out, err = await cli(env, "runs", "retry", run_id, "--from-step", "pay")
    assert code == 0 and "from step 'pay'" in out, err
    ended = await env.stack.client.wait_run(run_id, timeout=20)
    assert ended["status"] == "completed" and ended["output"] == "paid"
    code, _, err = await cli(env, "runs", "retry", run_id)
    assert code == 1 and "invalid_state" in err
    code, out, err = await cli(env, "runs", "retry", run_id, "--from-step", "pay")
    assert code == 0 and "from step 'pay'" in out, err
    code, out, err = await cli(env, "runs", "wait", run_id, "--timeout", "20")
    assert code == 0 and "status    completed" in out, err


async def test_cancel_and_events_send(env: Env) -> None:
    """`runs cancel` cancels a waiting run; `events send` resumes the run waiting for it."""
    waiting = await env.stack.client.start_run("kyc", {"u": "u1"})
    other = await env.stack.client.start_run("kyc", {"u": "u2"})
    for run in (waiting, other):
        for _ in range(200):
            steps = (await env.stack.client.get_run(run["id"]))["steps"]
            if steps and steps[0]["status"] == "waiting":
                break
            await asyncio.sleep(0.05)
    sent = await ok_json(env, "events", "send", "kyc.done", "--data", '{"u": "u1", "ok": 1}')
    assert sent["matchedRuns"] == 1
    assert (await env.stack.client.wait_run(waiting["id"], timeout=20))["output"] == {
        "u": "u1",
        "ok": 1,
    }
    code, out, err = await cli(env, "runs", "cancel", other["id"])
    assert code == 0 and other["id"] in out, err
    assert (await env.stack.client.wait_run(other["id"], timeout=20))["status"] == "cancelled"
    code, out, _ = await cli(env, "events", "send", "kyc.done", "--data", '{"u": "nobody"}')
    assert code == 0 and "0 waiting run(s) resumed, 0 run(s) started" in out


async def test_apps_list_register_sync(env: Env) -> None:
    """`apps register` prints the secret and the next steps; `apps list` and `apps sync` (by
    name) work, and syncing an app that is not there is an API error (exit 1)."""
    code, out, _ = await cli(env, "apps", "list")
    assert code == 0 and env.slug in out
    code, out, err = await cli(env, "apps", "register", "later", "http://127.0.0.1:9/")
    assert code == 0 and "signing secret (shown once): whsec_" in out, err
    assert "STEPLINE_SIGNING_SECRET" in out and "stepline apps sync wfa_" in out
    apps = (await ok_json(env, "apps", "list"))["apps"]
    assert {a["name"] for a in apps} == {"app", "later"}
    synced = await ok_json(env, "apps", "sync", env.slug)
    assert {w["name"] for w in synced["workflows"]} == {"greet", "charge", "approve", "kyc"}
    code, out, _ = await cli(env, "apps", "sync", env.slug)
    assert code == 0 and "greet" in out
    code, _, err = await cli(env, "apps", "sync", "later")
    assert code == 1 and "app_unreachable" in err


async def test_apps_sync_moves_another_apps_workflow_only_with_take_over(env: Env) -> None:
    """`apps sync` of an app hosting a workflow another app registered exits 1 naming that
    app; `--take-over` moves the workflow and says from where."""
    other = stepline.Stepline("whsec_cli_test")

    @other.workflow("greet")
    async def greet(ctx: stepline.Context, input: Any) -> str:
        return "from other"

    async with app_server(other) as url:
        async with env.stack.orchestrator.pool.acquire() as conn:
            row = await apps.create(conn, keys.DEFAULT_PROJECT, "other", url, "whsec_cli_test")
        assert row is not None
        code, _, err = await cli(env, "apps", "sync", "other")
        assert code == 1 and "invalid_state" in err and f"app 'app' ({env.slug})" in err, err
        code, out, err = await cli(env, "apps", "sync", "other", "--take-over")
        assert code == 0, err
        assert f"moved workflow greet here from app {env.slug}" in out
        run = await env.stack.client.start_run("greet", {"name": "x"})
        assert (await env.stack.client.wait_run(run["id"], timeout=20))["output"] == "from other"


async def test_apps_register_a_pull_app(env: Env) -> None:
    """`apps register NAME --pull` registers a pull app and says how to run its worker;
    `apps list` shows each app's kind; a URL with --pull, or neither, is a usage error."""
    code, out, err = await cli(env, "apps", "register", "workers", "--pull")
    assert code == 0 and "pull app wfa_" in out and "stepline worker MODULE:ATTR" in out, err
    assert "secret" not in out and "whsec_" not in out  # a pull app never uses one
    code, out, _ = await cli(env, "apps", "list")
    assert code == 0 and "KIND" in out
    assert any("workers" in line and " pull " in line for line in out.splitlines())
    for argv in (["workers2", "http://127.0.0.1:9/", "--pull"], ["workers3"]):
        code, _, err = await cli(env, "apps", "register", *argv)
        assert code == 2 and "--pull" in err
    apps = (await ok_json(env, "apps", "list"))["apps"]
    assert {(a["name"], a["kind"]) for a in apps} == {("app", "push"), ("workers", "pull")}


async def test_schedules_list_pause_resume_trigger(env: Env) -> None:
    """`schedules list|pause|resume|trigger` show and change a schedule and start its run."""
    created = await env.stack.client.create_schedule(
        "greet", YEARLY, timezone="UTC", input={"name": "cron"}
    )
    sid = created["id"]
    code, out, _ = await cli(env, "schedules", "list")
    assert code == 0 and sid in out and "active" in out
    assert (await ok_json(env, "schedules", "pause", sid))["status"] == "paused"
    code, out, _ = await cli(env, "schedules", "resume", sid)
    assert code == 0 and f"schedule {sid}: active" in out
    code, out, err = await cli(env, "schedules", "trigger", sid)
    assert code == 0 and "triggered run" in out, err
    run_id = out.split("triggered run ")[1].split()[0]
    ended = await env.stack.client.wait_run(run_id, timeout=20)
    assert ended["output"] == {"said": "hello cron"} and ended["scheduleId"] == sid
    listed = await ok_json(env, "schedules", "list")
    assert listed["schedules"][0]["id"] == sid


def _command(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stepline_server.cli.main", *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_exit_codes_of_the_real_command(env: Env) -> None:
    """The real `stepline` process exits 1 on an API error with its message, 2 on bad usage
    (missing argument, bad JSON, no key) and 1 when the orchestrator cannot be reached."""
    keyed = {"STEPLINE_URL": env.stack.url, "STEPLINE_API_KEY": env.stack.api_key}
    missing = "00000000-0000-4000-8000-00000000abcd"
    done = await asyncio.to_thread(_command, "runs", "show", missing, env=keyed)
    assert done.returncode == 1 and "not_found" in done.stderr
    done = await asyncio.to_thread(_command, "runs", "show", env=keyed)
    assert done.returncode == 2 and "usage" in done.stderr
    done = await asyncio.to_thread(_command, "runs", "start", "greet", "--input", "{", env=keyed)
    assert done.returncode == 2 and "--input must be JSON" in done.stderr
    no_key = {"STEPLINE_URL": env.stack.url, "STEPLINE_API_KEY": ""}
    done = await asyncio.to_thread(_command, "runs", "list", env=no_key)
    assert done.returncode == 2 and "STEPLINE_API_KEY" in done.stderr
    done = await asyncio.to_thread(
        _command, "runs", "list", "--url", "http://127.0.0.1:9", env=keyed
    )
    assert done.returncode == 1 and "cannot reach the orchestrator" in done.stderr
    done = await asyncio.to_thread(_command, "runs", "list", "--json", env=keyed)
    assert done.returncode == 0 and json.loads(done.stdout)["runs"] == []


async def test_a_run_held_by_a_paused_workflow_says_so(env: Env) -> None:
    """`workflows list` has a PAUSED column; a run of a paused workflow says it is paused and
    why it does not move in `runs start --wait` (which gives up, exit 6) and `runs show`, and
    its JSON says ``heldBy: "pause"``; once resumed it completes and is held by nothing."""
    keyed = {"STEPLINE_URL": env.stack.url, "STEPLINE_API_KEY": env.stack.api_key}
    await env.stack.client.pause_workflow("greet")
    done = await asyncio.to_thread(_command, "workflows", "list", env=keyed)
    assert done.returncode == 0, done.stderr
    header, *rows = done.stdout.splitlines()
    assert "PAUSED" in header.split()
    paused = {line.split()[0]: line.split()[header.split().index("PAUSED")] for line in rows}
    assert paused["greet"] == "yes" and paused["charge"] == "no"
    code, out, err = await cli(
        env, "runs", "start", "greet", "--input", '{"name": "ada"}', "--wait", "--timeout", "2"
    )
    assert code == 6, err
    assert "running, paused (the workflow or its app is paused)" in err
    assert "status    running, paused (the workflow or its app is paused)" in out
    run_id = out.split()[1]
    done = await asyncio.to_thread(_command, "runs", "show", run_id, env=keyed)
    assert "status    running, paused (the workflow or its app is paused)" in done.stdout
    shown = await ok_json(env, "runs", "show", run_id)
    assert shown["paused"] is True and shown["heldBy"] == "pause"
    await env.stack.client.resume_workflow("greet")
    ended = await env.stack.client.wait_run(run_id, timeout=30)
    assert ended["status"] == "completed" and ended["heldBy"] is None


async def test_people_read_the_apps_name_programs_both(database_url: str) -> None:
    """A run's and a workflow's JSON carry the app's name (``appName``) beside its slug
    (``app``); `runs show` and `workflows list` show the name."""
    sl = build_app({})
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        slug = await stack.register(sl, url, name="billing")
        env = Env(stack, slug, {})
        keyed = {"STEPLINE_URL": stack.url, "STEPLINE_API_KEY": stack.api_key}
        run = await stack.client.start_run("greet", {"name": "ada"})
        assert (run["app"], run["appName"]) == (slug, "billing")
        ended = await stack.client.wait_run(run["id"], timeout=30)
        assert (ended["app"], ended["appName"]) == (slug, "billing")
        listed = (await stack.client.list_runs())["runs"]
        assert [(r["app"], r["appName"]) for r in listed] == [(slug, "billing")]
        workflows = (await ok_json(env, "workflows", "list"))["workflows"]
        assert {(w["app"], w["appName"]) for w in workflows} == {(slug, "billing")}
        done = await asyncio.to_thread(_command, "runs", "show", run["id"], env=keyed)
        assert "workflow  greet  (app billing)" in done.stdout, done.stdout
        done = await asyncio.to_thread(_command, "workflows", "list", env=keyed)
        assert slug not in done.stdout
        assert all(line.split()[1] == "billing" for line in done.stdout.splitlines()[1:])


async def test_runs_show_says_a_cap_or_an_unreachable_app_holds_a_run(database_url: str) -> None:
    """A run due while its workflow's concurrency cap is full says it is held by the cap; a run
    whose app cannot be reached says so (`runs show`, and ``heldBy`` in its JSON)."""
    sl = stepline.Stepline("whsec_cli_test")
    gate = asyncio.Event()

    @sl.workflow("single", concurrency=1)
    async def single(ctx: stepline.Context, input: Any) -> Any:
        return await ctx.step("work", gate.wait)

    async with orchestrator_stack(database_url) as stack:
        env = Env(stack, "", {})
        try:
            async with app_server(sl) as url:
                await stack.register(sl, url)
                first = await stack.client.start_run("single", None)
                await until(
                    lambda: _step_running(stack, first["id"]), "the first run to be in its step"
                )
                second = await stack.client.start_run("single", None)
                held = await until(lambda: _held(stack, second["id"]), "the second run held")
                assert held == "concurrency"
                code, out, _ = await cli(env, "runs", "show", second["id"])
                assert code == 0
                assert "status    running, held by its workflow's concurrency cap" in out, out
                gate.set()
                assert (await stack.client.wait_run(second["id"], timeout=30))["heldBy"] is None
            away = await stack.client.start_run("single", None)  # its app is gone now
            held = await until(lambda: _held(stack, away["id"]), "the run's app unreachable")
            assert held == "appUnreachable"
            code, out, _ = await cli(env, "runs", "show", away["id"])
            assert "status    running, its app could not be reached" in out, out
        finally:
            gate.set()


async def _step_running(stack: Stack, run_id: str) -> bool:
    steps = (await stack.client.get_run(run_id))["steps"]
    return any(s["name"] == "work" and s["status"] == "running" for s in steps)


async def _held(stack: Stack, run_id: str) -> str | None:
    return (await stack.client.get_run(run_id))["heldBy"]  # type: ignore[no-any-return]
