"""Patches on a real orchestrator: a run started before the patch, resumed under patched code,
takes the old branch; a new run takes the new one and its history shows ``patch.recorded``
(API, CLI, dashboard); deprecate_patch replays a run with the marker; replay-check says ok."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import stepline
from tests.dashboard_forms import Dashboard
from tests.e2e.test_cli_operator import _call
from tests.e2e.test_durable_waits import step_in, step_of
from tests.e2e.test_replay_check import replay_check
from tests.support import Stack, app_server, free_port, orchestrator_stack

# Version 1: no patch. Each step appends its name to the file PATCH_EFFECTS names.
V1 = """
import os

import stepline

sl = stepline.Stepline("patches-secret")


def effect(name, value):
    with open(os.environ["PATCH_EFFECTS"], "a") as f:
        f.write(name + "\\n")
    return value


@sl.workflow("checkout")
async def checkout(ctx, input):
    base = await ctx.step("base", effect, "base", 100)
    TAX
    await ctx.sleep("cool", "100ms")
    approval = await ctx.callback("approval")
    await approval.wait()
    await ctx.step("ship", effect, "ship", "shipped")
    return {"tax": tax}
"""
OLD_TAX = 'tax = await ctx.step("tax", effect, "tax", base * 10 // 100)'
PATCHED_TAX = """if ctx.patched("fix-tax"):
        tax = await ctx.step("tax-v2", effect, "tax-v2", base * 20 // 100)
    else:
        tax = await ctx.step("tax", effect, "tax", base * 10 // 100)"""
DEPRECATED_TAX = """ctx.deprecate_patch("fix-tax")
    tax = await ctx.step("tax-v2", effect, "tax-v2", base * 20 // 100)"""
VERSIONS = {
    "v1": V1.replace("TAX", OLD_TAX),
    "v2": V1.replace("TAX", PATCHED_TAX),
    "v3": V1.replace("TAX", DEPRECATED_TAX),
}
MARKER = "$patch:fix-tax"


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name, text in VERSIONS.items():
        (tmp_path / f"checkout_{name}.py").write_text(text)
    monkeypatch.setenv("PATCH_EFFECTS", str(tmp_path / "effects.txt"))
    (tmp_path / "effects.txt").write_text("")
    return tmp_path


def load(folder: Path, version: str) -> stepline.Stepline:
    path = folder / f"checkout_{version}.py"
    spec = importlib.util.spec_from_file_location(f"patches_{version}_{id(folder)}", path)
    assert spec is not None and spec.loader is not None
    module: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert isinstance(module.sl, stepline.Stepline)
    return module.sl


def effects(folder: Path) -> list[str]:
    return (folder / "effects.txt").read_text().split()


async def approve(stack: Stack, run_id: str) -> dict[str, Any]:
    """Complete the run's approval callback and wait for the run to end."""
    run = await stack.client.get_run(run_id)
    await stack.client.complete_callback(step_of(run, "approval")["callbackId"], {"ok": True})
    return await stack.client.wait_run(run_id, timeout=30)


async def history(stack: Stack, run_id: str) -> list[dict[str, Any]]:
    return (await stack.client.list_run_events(run_id))["events"]


async def test_old_and_new_runs_take_their_branch(database_url: str, modules: Path) -> None:
    port = free_port()
    async with orchestrator_stack(database_url) as stack:
        v1 = load(modules, "v1")
        async with app_server(v1, port) as url:
            await stack.register(v1, url)
            old = await stack.client.start_run("checkout", {})
            await step_in(stack, old["id"], "approval", "waiting")
        assert effects(modules) == ["base", "tax"]

        v2 = load(modules, "v2")
        async with app_server(v2, port):
            new = await stack.client.start_run("checkout", {})
            await step_in(stack, new["id"], "approval", "waiting")
            # The new run recorded the marker, slept, and went on in the parked execution.
            assert v2.runtime.parked.resumed >= 1
            done_old = await approve(stack, old["id"])
            done_new = await approve(stack, new["id"])
            unfinished = await stack.client.start_run("checkout", {})
            await step_in(stack, unfinished["id"], "approval", "waiting")
        assert (done_old["status"], done_old["output"]) == ("completed", {"tax": 10})
        assert (done_new["status"], done_new["output"]) == ("completed", {"tax": 20})
        # Each step ran once: the old run replayed its old tax step and never ran the new one.
        assert effects(modules) == ["base", "tax", "base", "tax-v2", "ship", "ship",
                                    "base", "tax-v2"]  # fmt: skip

        old_events = await history(stack, old["id"])
        new_events = await history(stack, new["id"])
        assert "patch.recorded" not in [e["type"] for e in old_events]
        [recorded] = [e for e in new_events if e["type"] == "patch.recorded"]
        assert recorded["stepName"] == MARKER and recorded["data"] == {"patch": "fix-tax"}
        names = [s["name"] for s in (await stack.client.get_run(new["id"]))["steps"]]
        assert names[:3] == ["base", MARKER, "tax-v2"]

        # Version 3 deprecates the patch: the unfinished run, which has the marker, completes.
        v3 = load(modules, "v3")
        async with app_server(v3, port):
            done = await approve(stack, unfinished["id"])
        assert (done["status"], done["output"]) == ("completed", {"tax": 20})
        assert effects(modules)[-1:] == ["ship"]
        unfinished_events = await history(stack, unfinished["id"])
        assert [e["type"] for e in unfinished_events].count("patch.recorded") == 1

        # replay-check: both branches replay as recorded under the patched code.
        report = (
            await replay_check(stack, modules, "checkout_v2:sl", "--status", "completed", "--json")
        ).json()
        by_run = {r["runId"]: r for r in report["runs"]}
        assert by_run[old["id"]]["result"] == "ok", by_run[old["id"]]
        assert by_run[old["id"]]["patches"] == {"fix-tax": False}
        assert by_run[new["id"]]["result"] == "ok", by_run[new["id"]]
        assert by_run[new["id"]]["patches"] == {"fix-tax": True}
        assert by_run[new["id"]]["recorded"] == 5
        text = await replay_check(stack, modules, "checkout_v2:sl", "--status", "completed")
        assert text.code == 0 and "patch 'fix-tax': old code" in text.out
        assert "patch 'fix-tax': new code" in text.out

        # The CLI and the dashboard show the marker.
        auth = ["--url", stack.url, "--api-key", stack.api_key]
        code, out, _ = await _to_thread(["runs", "events", new["id"], *auth])
        [line] = [line for line in out.splitlines() if "patch.recorded" in line]
        assert code == 0 and MARKER in line and "fix-tax" in line.replace(MARKER, "")
        code, out, _ = await _to_thread(["runs", "show", new["id"], *auth])
        assert code == 0 and MARKER in out
        async with Dashboard(stack.url) as dash:
            await dash.sign_in(stack.api_key)
            page = await dash.get(f"/ui/runs/{new['id']}")
            assert page.status_code == 200
            assert "patch.recorded" in page.text and "this run takes its code" in page.text
            page = await dash.get(f"/ui/runs/{old['id']}")
            assert "patch.recorded" not in page.text


async def _to_thread(argv: list[str]) -> tuple[int, str, str]:
    """A ``stepline`` operator command, in a thread (the orchestrator serves on this loop)."""
    return await asyncio.to_thread(_call, argv)
