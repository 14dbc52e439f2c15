"""``stepline replay-check`` end to end: runs recorded by version 1 of an app on a real
orchestrator, then the installed command replaying them against changed modules."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import stepline
from tests.e2e.test_durable_waits import step_in, step_of
from tests.ports import free_port
from tests.support import Stack, app_server, orchestrator_stack

COMMAND = str(Path(sys.executable).parent / "stepline")

# Version 1: each step appends its name to the file REPLAY_EFFECTS names.
V1 = """
import os

import stepline

sl = stepline.Stepline("replay-check-secret")


def effect(name):
    with open(os.environ["REPLAY_EFFECTS"], "a") as f:
        f.write(name + "\\n")
    return {"step": name}


@sl.workflow("order")
async def order(ctx, input):
    await ctx.step("reserve", effect, "reserve")
    await ctx.step("charge", effect, "charge")
    approval = await ctx.callback("approval")
    await approval.wait()
    await ctx.step("ship", effect, "ship")
    return "shipped"


@sl.workflow("restock")
async def restock(ctx, input):
    await ctx.step("count", effect, "count")
    await ctx.sleep("nap", "1d")
    return "restocked"
"""
CHARGE = '    await ctx.step("charge", effect, "charge")\n'
RESERVE = '    await ctx.step("reserve", effect, "reserve")\n'
VARIANTS = {
    "unchanged": V1,
    "renamed": V1.replace(CHARGE, CHARGE.replace('"charge"', '"bill"')),
    "kind": V1.replace(CHARGE, '    await ctx.sleep("charge", "1h")\n'),
    "swapped": V1.replace(RESERVE + CHARGE, CHARGE + RESERVE),
    "removed": V1.replace(CHARGE, ""),
}


@dataclass
class Done:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with one module per variant (``flow_<variant>.py``) and the effects file."""
    for name, text in VARIANTS.items():
        assert name == "unchanged" or text != V1
        (tmp_path / f"flow_{name}.py").write_text(text)
    monkeypatch.setenv("REPLAY_EFFECTS", str(tmp_path / "effects.txt"))
    (tmp_path / "effects.txt").write_text("")
    return tmp_path


def load(folder: Path, variant: str) -> stepline.Stepline:
    """The variant's Stepline, imported in this process (for the app that records runs)."""
    path = folder / f"flow_{variant}.py"
    spec = importlib.util.spec_from_file_location(f"replay_check_{variant}_{id(folder)}", path)
    assert spec is not None and spec.loader is not None
    module: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sl = module.sl
    assert isinstance(sl, stepline.Stepline)
    return sl


def effects(folder: Path) -> list[str]:
    return (folder / "effects.txt").read_text().split()


async def replay_check(
    stack: Stack, folder: Path, target: str, *args: str, command: list[str] | None = None
) -> Done:
    """The installed ``stepline replay-check`` run in ``folder`` against the stack."""
    proc = await asyncio.create_subprocess_exec(
        *(command or [COMMAND]), "replay-check", target, "--url", stack.url,
        "--api-key", stack.api_key, *args,
        cwd=folder, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return Done(proc.returncode, out.decode(), err.decode())


async def order_waiting(stack: Stack, n: int) -> dict[str, Any]:
    """Start an order run and wait until it waits on its approval callback."""
    run = await stack.client.start_run("order", {"n": n})
    return await step_in(stack, run["id"], "approval", "waiting")


def lines_of(done: Done, run_id: str) -> list[str]:
    return [line for line in done.out.splitlines() if run_id in line]


async def test_replay_check_of_changed_code(database_url: str, modules: Path) -> None:
    """Runs waiting after 'reserve' and 'charge': the unchanged code is ok (exit 0), a renamed
    step, a changed kind and swapped steps differ naming the step and both sides (exit 1), a
    removed step warns (exit 0) and the run then completes on that code; no step ran during a
    check."""
    v1 = load(modules, "unchanged")
    port = free_port()
    async with orchestrator_stack(database_url) as stack:
        async with app_server(v1, port) as app_url:
            await stack.register(v1, app_url)
            first = await order_waiting(stack, 1)
            second = await order_waiting(stack, 2)
        recorded = effects(modules)
        assert sorted(recorded) == ["charge", "charge", "reserve", "reserve"]

        done = await replay_check(stack, modules, "flow_unchanged:sl", "--workflow", "order")
        assert done.code == 0, done
        for run in (first, second):
            [line] = lines_of(done, run["id"])
            assert line.startswith("ok ") and "waits on 'approval'" in line
        assert "checked 2 running run(s) of order: 2 ok, 0 differs, 0 warn" in done.out

        done = await replay_check(stack, modules, "flow_renamed:sl")
        assert done.code == 1, done
        [line] = lines_of(done, first["id"])
        assert line.startswith("differs ") and "'charge'" in line and "'bill'" in line
        assert "history:  a run step 'charge' next" in done.out
        assert "code now: makes a new run step 'bill' there" in done.out

        done = await replay_check(stack, modules, "flow_kind:sl", "--json")
        assert done.code == 1, done
        checked = {r["runId"]: r for r in done.json()["runs"]}
        difference = checked[first["id"]]["difference"]
        assert checked[first["id"]]["result"] == "differs"
        assert (difference["step"], difference["history"], difference["code"]) == (
            "charge", "a run step 'charge'", "makes a sleep step 'charge'"
        )  # fmt: skip
        assert "nondeterminism" in difference["message"] or "replay-safe" in difference["message"]

        done = await replay_check(stack, modules, "flow_swapped:sl")
        assert done.code == 1, done
        [line] = lines_of(done, second["id"])
        assert line.startswith("differs ") and "'reserve'" in line and "'charge'" in line
        assert "meets 'charge' before 'reserve'" in done.out

        done = await replay_check(stack, modules, "flow_removed:sl")
        assert done.code == 0, done
        [line] = lines_of(done, first["id"])
        assert line.startswith("warn ") and "no longer reached: 'charge'" in line
        assert effects(modules) == recorded  # no check ran a step

        # The warning is true: the run goes on with the step removed.
        v2 = load(modules, "removed")
        async with app_server(v2, port):
            await stack.client.complete_callback(step_of(first, "approval")["callbackId"], {})
            ended = await stack.client.wait_run(first["id"], timeout=30)
        assert ended["status"] == "completed" and ended["output"] == "shipped", ended
        assert effects(modules) == [*recorded, "ship"]


async def test_filters_and_json_output(database_url: str, modules: Path) -> None:
    """--status, --workflow and --limit choose the runs checked, newest first; --json prints
    each run's result, summary, difference and counts."""
    v1 = load(modules, "unchanged")
    async with orchestrator_stack(database_url) as stack, app_server(v1) as app_url:
        await stack.register(v1, app_url)
        ended = await order_waiting(stack, 1)
        await stack.client.complete_callback(step_of(ended, "approval")["callbackId"], {})
        assert (await stack.client.wait_run(ended["id"], timeout=30))["status"] == "completed"
        waiting = await order_waiting(stack, 2)
        restock = await stack.client.start_run("restock", {})
        await step_in(stack, restock["id"], "nap", "sleeping")
        newest = await order_waiting(stack, 3)

        done = await replay_check(stack, modules, "flow_unchanged:sl", "--json")
        assert done.code == 0, done
        report = done.json()
        assert {r["runId"] for r in report["runs"]} == {waiting["id"], restock["id"], newest["id"]}
        assert (report["checked"], report["ok"], report["differs"], report["warn"]) == (3, 3, 0, 0)
        item = next(r for r in report["runs"] if r["runId"] == restock["id"])
        assert item == {
            "runId": restock["id"],
            "workflow": "restock",
            "status": "running",
            "recorded": 2,
            "result": "ok",
            "summary": "replayed 2 of 2 recorded steps; waits on 'nap'",
            "difference": None,
            "unreached": [],
            "replayed": 2,
            "end": "waiting",
            "next": [],
            "patches": {},
        }

        done = await replay_check(stack, modules, "flow_unchanged:sl", "--workflow", "restock")
        assert done.code == 0 and lines_of(done, restock["id"]) and len(done.out.splitlines()) == 2

        done = await replay_check(
            stack, modules, "flow_unchanged:sl", "--status", "completed", "--json"
        )
        [item] = done.json()["runs"]
        assert item["runId"] == ended["id"] and item["result"] == "ok"
        assert item["end"] == "returned" and item["replayed"] == 4

        done = await replay_check(
            stack, modules, "flow_unchanged:sl", "--workflow", "order", "--limit", "1", "--json"
        )
        assert [r["runId"] for r in done.json()["runs"]] == [newest["id"]]

        done = await replay_check(stack, modules, "flow_unchanged:sl", "--workflow", "refund")
        assert done.code == 0 and "no running runs of refund to check" in done.out


async def test_bad_usage_api_errors_and_the_sdk_alone(database_url: str, modules: Path) -> None:
    """A target that does not import or is not a Stepline exits 2; a refused key prints the
    API's message and exits 1; with the orchestrator's packages unimportable the command
    still checks runs."""
    v1 = load(modules, "unchanged")
    async with orchestrator_stack(database_url) as stack, app_server(v1) as app_url:
        await stack.register(v1, app_url)
        run = await order_waiting(stack, 1)

        done = await replay_check(stack, modules, "flow_missing:sl")
        assert done.code == 2 and "cannot import 'flow_missing'" in done.err
        done = await replay_check(stack, modules, "flow_unchanged:effect")
        assert done.code == 2 and "not a stepline.Stepline" in done.err
        done = await replay_check(stack, modules, "flow_unchanged")
        assert done.code == 2 and "MODULE:ATTR" in done.err
        done = await replay_check(stack, modules, "flow_unchanged:sl", "--status", "asleep")
        assert done.code == 2 and "invalid choice" in done.err

        refused = Stack(stack.orchestrator, stack.url, "sl_not-a-key", stack.client)
        done = await replay_check(refused, modules, "flow_unchanged:sl")
        assert done.code == 1 and "unauthorized" in done.err and "Traceback" not in done.err

        sdk_only = [
            sys.executable, "-c",
            "import sys\n"
            "for name in ('stepline_server', 'asyncpg', 'structlog', 'uvicorn', 'starlette'):\n"
            "    sys.modules[name] = None\n"
            "from stepline.cli.main import main\n"
            "sys.exit(main())\n",
        ]  # fmt: skip
        done = await replay_check(stack, modules, "flow_unchanged:sl", command=sdk_only)
        assert done.code == 0, done
        assert lines_of(done, run["id"])[0].startswith("ok ")
