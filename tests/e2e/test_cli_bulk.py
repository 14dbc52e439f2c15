"""`stepline runs cancel|retry` with filters against a real orchestrator: the count first, a
question unless --yes (refused with no input), a progress bar following the operation."""

from __future__ import annotations

import asyncio
import io
import json
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest

import stepline
from stepline_server.cli import main as cli_main
from stepline_server.cli import operate
from tests.support import Stack, app_server, orchestrator_stack


def bulk_app(state: dict[str, bool]) -> stepline.Stepline:
    sl = stepline.Stepline("whsec_cli_bulk")

    @sl.workflow("charge")
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

    return sl


@pytest.fixture
async def env(database_url: str) -> AsyncIterator[tuple[Stack, dict[str, bool]]]:
    state: dict[str, bool] = {}
    sl = bulk_app(state)
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        yield stack, state


def _call(argv: list[str], stdin: io.StringIO | None) -> tuple[int, str, str]:
    args = cli_main.parser().parse_args(argv)
    out, err = io.StringIO(), io.StringIO()
    code = operate.run(args, out, err, stdin)
    return code, out.getvalue(), err.getvalue()


async def cli(stack: Stack, *argv: str, answer: str | None = None) -> tuple[int, str, str]:
    """A `stepline` command against the stack (in a thread: it blocks); ``answer`` is what
    standard input holds (None: there is none)."""
    full = [*argv, "--url", stack.url, "--api-key", stack.api_key]
    stdin = io.StringIO(answer) if answer is not None else None
    return await asyncio.to_thread(_call, full, stdin)


async def failed_runs(stack: Stack, n: int) -> list[str]:
    runs = [await stack.client.start_run("charge", {"i": i}) for i in range(n)]
    for r in runs:
        assert (await stack.client.wait_run(r["id"], timeout=30))["status"] == "failed"
    return [r["id"] for r in runs]


async def statuses(stack: Stack, ids: list[str]) -> set[str]:
    return {(await stack.client.get_run(i))["status"] for i in ids}


async def test_dry_run_prints_the_count_and_a_sample(
    env: tuple[Stack, dict[str, bool]],
) -> None:
    """`--dry-run` prints how many runs would be retried and their ids, and acts on none."""
    stack, _ = env
    ids = await failed_runs(stack, 3)
    code, out, err = await cli(stack, "runs", "retry", "--status", "failed", "--dry-run")
    assert code == 0, err
    assert out.splitlines()[0] == "3 runs would be retried"
    assert {line.strip() for line in out.splitlines()[1:]} == set(ids)
    code, out, _ = await cli(stack, "runs", "retry", "--workflow", "charge", "--dry-run", "--json")
    assert json.loads(out)["matched"] == 3
    assert await statuses(stack, ids) == {"failed"}


async def test_without_yes_it_asks_and_refuses_with_no_input(
    env: tuple[Stack, dict[str, bool]],
) -> None:
    """Without --yes the count is shown and asked about: no input refuses (exit 2, saying to
    pass --yes), "n" does nothing (exit 1); either way no run changes and no operation is
    made."""
    stack, _ = env
    ids = await failed_runs(stack, 2)
    code, _, err = await cli(stack, "runs", "retry", "--status", "failed")
    assert code == 2
    assert "2 runs will be retried" in err and "--yes" in err and "no input" in err
    code, _, err = await cli(stack, "runs", "retry", "--status", "failed", answer="n\n")
    assert code == 1 and "[y/N]" in err and "nothing was done" in err
    assert await statuses(stack, ids) == {"failed"}
    assert (await stack.client.list_operations())["operations"] == []


async def test_a_real_process_with_no_stdin_refuses(
    env: tuple[Stack, dict[str, bool]],
) -> None:
    """`stepline runs cancel --workflow W --status running` run as a process whose standard
    input is empty refuses to act and says why."""
    stack, _ = env
    await stack.client.start_run("approve", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "stepline_server.cli.main", "runs", "cancel",
        "--workflow", "approve", "--status", "running",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "STEPLINE_URL": stack.url, "STEPLINE_API_KEY": stack.api_key},
    )  # fmt: skip
    _, err = await proc.communicate()
    assert proc.returncode == 2, err
    assert b"1 run will be cancelled" in err and b"Pass --yes" in err


async def test_yes_acts_and_follows_the_operation_with_a_progress_bar(
    env: tuple[Stack, dict[str, bool]],
) -> None:
    """Answering "y" (or passing --yes) makes the operation and follows it to its end with a
    progress bar; the summary counts every run, and the runs were retried from the step."""
    stack, state = env
    ids = await failed_runs(stack, 4)
    state["fixed"] = True
    code, out, err = await cli(
        stack, "runs", "retry", "--status", "failed", "--from-step", "pay", answer="y\n"
    )
    assert code == 0, err
    assert "4 runs will be retried" in err
    assert "4/4" in err and "run" in err  # the bar, at its end
    assert "completed: 4 matched, 4 succeeded, 0 skipped, 0 failed" in out
    for i in ids:
        assert (await stack.client.wait_run(i, timeout=30))["status"] == "completed"
    op_id = out.split()[1]
    code, out, _ = await cli(stack, "operations", "show", op_id, "--json")
    shown = json.loads(out)
    assert shown["action"] == "retryFromStep" and shown["fromStep"] == "pay"


async def test_bulk_cancel_with_yes(env: tuple[Stack, dict[str, bool]]) -> None:
    """`runs cancel --workflow W --status running --yes` cancels every running run of W."""
    stack, _ = env
    runs = [await stack.client.start_run("approve", None) for _ in range(3)]
    code, out, err = await cli(
        stack, "runs", "cancel", "--workflow", "approve", "--status", "running", "--yes",
        "--json",
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["succeeded"] == 3
    for r in runs:
        assert (await stack.client.wait_run(r["id"], timeout=30))["status"] == "cancelled"


async def test_an_id_and_filters_together_is_bad_usage(
    env: tuple[Stack, dict[str, bool]],
) -> None:
    """A run id with filters, or neither, is bad usage (exit 2); a bad filter is the API's
    error (exit 1)."""
    stack, _ = env
    code, _, err = await cli(stack, "runs", "cancel", "0" * 32, "--workflow", "approve")
    assert code == 2 and "not both" in err
    code, _, err = await cli(stack, "runs", "retry")
    assert code == 2 and "filters" in err
    code, _, err = await cli(stack, "runs", "retry", "--status", "asleep", "--yes")
    assert code == 1 and "validation_failed" in err
