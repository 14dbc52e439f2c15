"""The ``stepline`` command of an app's install (the SDK alone, no server extra), made by this
test in a fresh virtualenv from a wheel of this tree: ``--help`` lists every command, the
REST-only ones work against a real orchestrator with the exit codes docs/cli.md gives, and
``serve``/``dev``/``migrate`` say what to install."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import venv
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import stepline
from stepline.cli.main import MISSING_EXTRA
from stepline_server.store import keys
from tests.support import Stack, app_server, orchestrator_stack

ROOT = Path(__file__).resolve().parents[2]
YEARLY = "0 0 1 1 *"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sdk_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The ``stepline`` script of a virtualenv with this tree's wheel and its SDK
    dependencies only (``pip install stepline``: no server extra)."""
    where = tmp_path_factory.mktemp("sdk-only")
    # Built from a copy of the sources, so that no build folder of the tree leaks into it.
    source = where / "source"
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for part in ("sdk", "service"):
        shutil.copytree(ROOT / part, source / part, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    wheels = where / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(source)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    env_dir = where / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    wheel = next(wheels.glob("stepline-*.whl"))
    subprocess.run(
        [str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    listed = subprocess.run(
        [str(env_dir / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
        check=True, capture_output=True, text=True, timeout=120,
    ).stdout.lower()  # fmt: skip
    for server_only in ("asyncpg", "uvicorn", "starlette", "structlog"):
        assert f"{server_only}==" not in listed  # an app's install, not the orchestrator's
    yield env_dir / "bin" / "stepline"


def build_app() -> stepline.Stepline:
    sl = stepline.Stepline("whsec_sdk_only")

    @sl.workflow("greet")
    async def greet(ctx: stepline.Context, input: Any) -> str:
        return await ctx.step("say", lambda: "hello")  # type: ignore[no-any-return]

    @sl.workflow("charge")
    async def charge(ctx: stepline.Context, input: Any) -> None:
        raise stepline.TerminalError("card declined")

    @sl.workflow("hold")
    async def hold(ctx: stepline.Context, input: Any) -> Any:
        return await (await ctx.callback("approval")).wait()

    @sl.workflow("slow", timeout="1s")
    async def slow(ctx: stepline.Context, input: Any) -> None:
        await ctx.sleep("long", "1h")

    @sl.workflow("welcome", on_event="user.signed_up")
    async def welcome(ctx: stepline.Context, input: Any) -> None:
        return None

    @sl.workflow("report", schedule={"cron": YEARLY})
    async def report(ctx: stepline.Context, input: Any) -> str:
        return "report"

    return sl


def _stepline(script: Path, stack: Stack | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPLINE_")}
    env.pop("DATABASE_URL", None)
    if stack is not None:
        env |= {"STEPLINE_URL": stack.url, "STEPLINE_API_KEY": stack.api_key}
    return subprocess.run(
        [str(script), *args],
        cwd=script.parent,  # nothing of this tree on the path
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


async def run_cli(
    script: Path, stack: Stack | None, *args: str
) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(_stepline, script, stack, *args)


async def test_help_and_the_server_commands_without_the_server_extra(sdk_only: Path) -> None:
    """``stepline --help`` exits 0 and lists every command, ``worker`` included; ``serve``,
    ``dev`` and ``migrate`` exit 2 with the install hint; ``worker --help`` works."""
    helped = await run_cli(sdk_only, None, "--help")
    assert helped.returncode == 0, helped.stderr
    for command in ("serve", "dev", "migrate", "runs", "apps", "workflows", "schedules",
                    "events", "callbacks", "keys", "replay-check", "worker"):  # fmt: skip
        assert f"    {command}" in helped.stdout, command
    for command in ("serve", "dev", "migrate"):
        done = await run_cli(sdk_only, None, command)
        assert done.returncode == 2
        assert done.stderr.strip() == MISSING_EXTRA.format(command=command)
    done = await run_cli(sdk_only, None, "keys", "create")
    assert done.returncode == 2 and "--url and --api-key" in done.stderr
    done = await run_cli(sdk_only, None, "worker", "--help")
    assert done.returncode == 0 and "--concurrency" in done.stdout


async def test_rest_commands_and_their_exit_codes_in_an_apps_install(
    sdk_only: Path, database_url: str
) -> None:
    """Against a real orchestrator: ``runs start --wait`` and ``runs wait`` exit 0 only for a
    completed run, 3 failed, 4 timed out, 5 cancelled, 6 when they gave up waiting; schedules
    are found by workflow name; ``events send`` prints the run it started; ``apps delete``
    removes an app; ``runs show`` tells delivery failures."""
    sl = build_app()
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        done = await run_cli(sdk_only, stack, "runs", "start", "greet", "--wait")
        assert done.returncode == 0 and "status    completed" in done.stdout, done.stderr
        done = await run_cli(sdk_only, stack, "runs", "start", "charge", "--wait")
        assert done.returncode == 3 and "status    failed" in done.stdout
        assert "error terminal: card declined" in done.stdout
        done = await run_cli(sdk_only, stack, "runs", "start", "slow", "--wait")
        assert done.returncode == 4 and "status    timedOut" in done.stdout
        done = await run_cli(
            sdk_only, stack, "runs", "start", "hold", "--wait", "--timeout", "1", "--json"
        )
        assert done.returncode == 6 and "gave up waiting" in done.stderr
        held = stepline_json(done.stdout)["id"]
        done = await run_cli(sdk_only, stack, "runs", "wait", held, "--timeout", "0.5")
        assert done.returncode == 6 and "status    running" in done.stdout
        await stack.client.cancel_run(held)
        done = await run_cli(sdk_only, stack, "runs", "wait", held)
        assert done.returncode == 5 and "status    cancelled" in done.stdout

        done = await run_cli(sdk_only, stack, "schedules", "trigger", "report")
        assert done.returncode == 0 and "triggered run" in done.stdout, done.stderr
        done = await run_cli(sdk_only, stack, "schedules", "pause", "report")
        assert done.returncode == 0 and ": paused" in done.stdout, done.stderr

        done = await run_cli(sdk_only, stack, "events", "send", "user.signed_up", "--data", "{}")
        assert done.returncode == 0, done.stderr
        assert "0 waiting run(s) resumed, 1 run(s) started" in done.stdout
        started = done.stdout.split("started ")[-1].strip()
        assert (await stack.client.get_run(started))["workflow"] == "welcome"

        await stack.client.create_app("gone", "http://127.0.0.1:9/stepline/")
        done = await run_cli(sdk_only, stack, "apps", "delete", "gone", "--yes")
        assert done.returncode == 0 and "deleted" in done.stdout, done.stderr
        names = {a["name"] for a in (await stack.client.list_apps())["apps"]}
        assert names == {"app"}
        done = await run_cli(sdk_only, stack, "workflows", "list")
        assert done.returncode == 0 and "greet" in done.stdout


async def test_runs_show_tells_the_delivery_failures(sdk_only: Path, database_url: str) -> None:
    """A run whose app cannot be reached shows its delivery failures and the last one's
    reason."""
    sl = build_app()
    async with orchestrator_stack(database_url) as stack:
        async with app_server(sl) as url:
            await stack.register(sl, url)
        run = await stack.client.start_run("greet", None)  # the app is gone now
        for _ in range(200):
            if (await stack.client.get_run(run["id"])).get("deliveryFailures"):
                break
            await asyncio.sleep(0.05)
        done = await run_cli(sdk_only, stack, "runs", "show", run["id"])
    assert done.returncode == 0, done.stderr
    assert "could not be delivered" in done.stdout
    assert "last delivery failure" in done.stdout and "could not reach the app" in done.stdout


async def test_keys_environments_and_projects_over_rest_are_quiet(
    sdk_only: Path, database_url: str
) -> None:
    """With ``--url`` and an owner key (environments are the owner's to make), ``keys``,
    ``environments`` and ``projects`` work over REST and print what they made and nothing
    else; the new key works."""
    async with orchestrator_stack(database_url) as stack:
        async with stack.orchestrator.pool.acquire() as conn:
            owner = await keys.create_key(conn, "owner", role="owner")
        where = ["--url", stack.url, "--api-key", owner]
        made = await run_cli(sdk_only, None, "keys", "create", "--name", "ci", "--role", "read",
                             *where)  # fmt: skip
        assert made.returncode == 0 and made.stderr == "", made.stderr
        lines = made.stdout.splitlines()
        assert len(lines) == 2 and lines[1].startswith("sl_")
        assert "'ci' (read)" in lines[0]
        listed = await run_cli(sdk_only, None, "keys", "list", *where)
        assert listed.returncode == 0 and listed.stderr == ""
        assert any(" read " in line and line.endswith("ci") for line in listed.stdout.splitlines())
        envs = await run_cli(sdk_only, None, "environments", "create", "qa", *where)
        assert envs.returncode == 0 and "environment 'qa'" in envs.stdout
        envs = await run_cli(sdk_only, None, "environments", "list", *where)
        assert {line.split()[-1] for line in envs.stdout.splitlines()} >= {"production", "qa"}
        projects = await run_cli(sdk_only, None, "projects", "list", *where)
        assert projects.returncode == 0 and projects.stdout.split()[-1] == "default"
        async with stepline.AsyncClient(stack.url, api_key=lines[1]) as reader:
            assert (await reader.list_runs())["runs"] == []
        key_id = next(line.split()[0] for line in listed.stdout.splitlines() if "ci" in line)
        revoked = await run_cli(sdk_only, None, "keys", "revoke", key_id, *where)
        assert revoked.returncode == 0 and "revoked" in revoked.stdout


def stepline_json(text: str) -> Any:
    import json

    return json.loads(text)
