"""``stepline replay-check MODULE:ATTR``: would runs in flight survive the local code?

It loads the app's :class:`~stepline.Stepline`, lists the matching runs of the orchestrator
(``--workflow``, ``--status``, default ``running``; ``--limit``), reads each run's recorded
steps (``GET /v1/runs/{id}/replay``) and replays them against the local code without running
any step (``stepline._replay``), then prints ``ok``, ``differs`` or ``warn`` per run. Exit
status 1 when a run differs or the API answers an error, 2 on bad usage, else 0. It needs the
SDK alone (httpx), not the orchestrator's extra.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import httpx

from stepline import _replay, protocol
from stepline._client import ApiError, AsyncClient
from stepline._workflow import Stepline

DEFAULT_URL = "http://127.0.0.1:8400"
DEFAULT_LIMIT = 100
STATUSES = ("running", "cancelling", "completed", "failed", "cancelled", "timedOut")
RESULTS = ("ok", "differs", "warn")


class UsageError(Exception):
    """The command line is wrong in a way argparse cannot see: exit 2."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The command's arguments (also used by the orchestrator's ``stepline`` parser)."""
    p.add_argument("target", metavar="MODULE:ATTR", help="the app's Stepline, e.g. shop.flows:sl")
    p.add_argument("--workflow", help="only runs of this workflow [every workflow of the app]")
    p.add_argument(
        "--status",
        default="running",
        choices=[*STATUSES, "any"],
        help="only runs with this status [running]",
    )
    p.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_LIMIT,
        help=f"check at most this many runs, newest first [{DEFAULT_LIMIT}]",
    )
    p.add_argument(
        "--url",
        default=os.environ.get("STEPLINE_URL") or DEFAULT_URL,
        help=f"the orchestrator [STEPLINE_URL, {DEFAULT_URL}]",
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("STEPLINE_API_KEY"),
        help="an API key (read is enough) [STEPLINE_API_KEY]",
    )
    p.add_argument("--json", action="store_true", help="print JSON, for scripts")


HELP = "replay runs' recorded steps against local code, running no step: ok, differs or warn"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="stepline replay-check", description=HELP)
    add_arguments(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``stepline replay-check …`` with the SDK alone; answers the exit status."""
    return run(parser().parse_args(argv))


def load(target: str) -> Stepline:
    """The :class:`Stepline` that ``MODULE:ATTR`` names (the current folder is importable)."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise UsageError(f"expected MODULE:ATTR (e.g. shop.workflows:sl), not {target!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"cannot import {module_name!r}: {exc}") from None
    for part in attr.split("."):
        if not hasattr(found, part):
            raise UsageError(f"{module_name!r} has no attribute {attr!r}")
        found = getattr(found, part)
    if not isinstance(found, Stepline):
        raise UsageError(f"{target} is a {type(found).__name__}, not a stepline.Stepline")
    return found


async def runs_to_check(
    client: AsyncClient, sl: Stepline, workflow: str | None, status: str, limit: int
) -> list[dict[str, Any]]:
    """The newest ``limit`` runs to check: of ``workflow``, else of every workflow ``sl``
    hosts (runs of other apps' workflows are not this code's)."""
    names = [workflow] if workflow else sorted(sl.workflows)
    found: list[dict[str, Any]] = []
    for name in names:
        page = min(limit, 500)
        taken = 0
        async for run in client.iter_runs(
            workflow=name, status=None if status == "any" else status, limit=page
        ):
            found.append(run)
            taken += 1
            if taken >= limit:
                break
    found.sort(key=lambda r: (r["createdAt"], r["id"]), reverse=True)
    return found[:limit]


async def check_run(client: AsyncClient, sl: Stepline, run: dict[str, Any]) -> dict[str, Any]:
    """One run checked: its id, workflow, status and verdict, as ``--json`` prints it."""
    history = await client.get_run_replay(run["id"])
    definition = sl.get(history["workflow"])
    item: dict[str, Any] = {
        "runId": history["runId"],
        "workflow": history["workflow"],
        "status": history["status"],
        # patch markers answer ctx.patched: they are not steps the code meets
        "recorded": sum(1 for s in history.get("steps") or [] if not _is_marker(s)),
    }
    if definition is None:
        name = history["workflow"]
        difference = _replay.Difference(
            None, f"a run of workflow {name!r}", f"has no workflow {name!r}",
            f"workflow {name!r} is not registered in this app",
        )  # fmt: skip
        verdict = _replay.Verdict(
            "differs", f"the code has no workflow {name!r}: the run cannot go on", difference
        )
        return {**item, **_verdict_json(verdict), "replayed": 0, "next": [], "end": None}
    request = _replay.request_of(history)
    result = await _replay.replay(definition, request, payloads=sl.runtime.payloads)
    verdict = _replay.judge(result, history["status"], history.get("input"))
    return {
        **item,
        **_verdict_json(verdict),
        "replayed": len(result.reached),
        "end": result.end.value,
        "next": [{"name": name, "kind": kind.value} for name, kind in result.next],
        "patches": result.patches,
    }


def _is_marker(step: dict[str, Any]) -> bool:
    """Whether a recorded step (as the replay route answers it) is a patch marker."""
    return step.get("kind") == "value" and str(step.get("name", "")).startswith(
        protocol.PATCH_STEP_PREFIX
    )


def _verdict_json(v: _replay.Verdict) -> dict[str, Any]:
    d = v.difference
    return {
        "result": v.result,
        "summary": v.summary,
        "difference": None
        if d is None
        else {"step": d.step, "history": d.history, "code": d.code, "message": d.message},
        "unreached": v.unreached,
    }


async def check(args: argparse.Namespace, sl: Stepline) -> dict[str, Any]:
    """Every matching run checked, and the counts of each result."""
    async with AsyncClient(args.url, api_key=args.api_key) as client:
        runs = await runs_to_check(client, sl, args.workflow, args.status, args.limit)
        checked = [await check_run(client, sl, run) for run in runs]
    counts = {r: sum(1 for c in checked if c["result"] == r) for r in RESULTS}
    return {"runs": checked, "checked": len(checked), **counts}


def print_report(report: dict[str, Any], args: argparse.Namespace, out: TextIO) -> None:
    """One line per run (and the difference's two sides), then the counts."""
    for item in report["runs"]:
        out.write(f"{item['result']:<8} {item['runId']}  {item['workflow']}  {item['summary']}\n")
        d = item["difference"]
        if d is not None:
            out.write(f"         history:  {d['history']}\n         code now: {d['code']}\n")
    status = "" if args.status == "any" else f"{args.status} "
    of = f" of {args.workflow}" if args.workflow else ""
    if not report["runs"]:
        out.write(f"no {status}runs{of} to check\n")
        return
    counts = ", ".join(f"{report[r]} {r}" for r in RESULTS)
    out.write(f"checked {report['checked']} {status}run(s){of}: {counts}\n")


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run the check ``args`` describes; answers the exit status."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        if args.limit < 1:
            raise UsageError("--limit must be at least 1")
        if not args.api_key:
            raise UsageError("no API key: pass --api-key or set STEPLINE_API_KEY")
        sl = load(args.target)
        report = asyncio.run(check(args, sl))
    except UsageError as exc:
        err.write(f"stepline replay-check: {exc}\n")
        return 2
    except ApiError as exc:
        err.write(f"stepline replay-check: {exc.code}: {exc.message}\n")
        return 1
    except httpx.HTTPError as exc:
        err.write(f"stepline replay-check: cannot reach the orchestrator at {args.url} ({exc})\n")
        return 1
    except KeyboardInterrupt:
        return 130
    if args.json:
        out.write(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    else:
        print_report(report, args, out)
    return 1 if report["differs"] else 0
