"""Bulk cancel and retry from the command line: ``stepline runs cancel --workflow W --status
running`` and ``stepline runs retry --status failed [--from-step S]``.

The count comes first (a dry run); without ``--yes`` the command asks before acting and
refuses when there is no one to ask (no standard input). Once the operation is made, a progress
bar (tqdm, on standard error, when installed; else a line per change) follows it until it ends;
Ctrl-C stops following, not the operation (``stepline operations cancel ID`` stops it).
"""

from __future__ import annotations

import argparse
import time
from typing import Any, TextIO

from stepline._client import Client
from stepline.cli import output

try:  # the bar is drawn by tqdm when it is installed (the server extra has it)
    from tqdm import tqdm
except ImportError:  # pragma: no cover - an SDK-only install without it prints lines instead
    tqdm = None

FOLLOW_SECONDS = 0.5
FILTER_FLAGS = (
    "workflow",
    "status",
    "app",
    "deployment_id",
    "created_after",
    "created_before",
    "run_key",
    "trigger",
)


class Refused(Exception):
    """The command would act on runs without a confirmation: exit 2."""


def add_filter_flags(p: argparse.ArgumentParser) -> None:
    """The run list's filters, for a bulk action (instead of a run id)."""
    p.add_argument("--workflow", help="runs of this workflow")
    p.add_argument("--status", action="append", help="runs in this status (repeat for several)")
    p.add_argument("--app", help="runs of this app (id, slug or name)")
    p.add_argument("--deployment-id", help="runs whose last invocation ran on this deployment")
    p.add_argument("--created-after", help="runs created at or after this RFC 3339 time")
    p.add_argument("--created-before", help="runs created before this RFC 3339 time")
    p.add_argument("--run-key", help="runs with this run key, or a prefix ending with '*'")
    p.add_argument(
        "--trigger", help="runs started by api, schedule, manual, event, parent, retry, bulk"
    )
    p.add_argument("--dry-run", action="store_true", help="only count the runs it would take")
    p.add_argument("--yes", action="store_true", help="act without asking")


def wants_bulk(a: argparse.Namespace) -> bool:
    """Whether the command names runs by a filter rather than by id."""
    return any(getattr(a, name, None) is not None for name in FILTER_FLAGS)


def filter_of(a: argparse.Namespace) -> dict[str, Any]:
    f: dict[str, Any] = {}
    names = {"deployment_id": "deploymentId", "created_after": "createdAfter",
             "created_before": "createdBefore", "run_key": "runKey"}  # fmt: skip
    for name in FILTER_FLAGS:
        value = getattr(a, name, None)
        if value is not None:
            f[names.get(name, name)] = value[0] if name == "status" and len(value) == 1 else value
    return f


def _confirm(question: str, stdin: TextIO | None, err: TextIO) -> bool:
    """Ask on standard error, read the answer from standard input; no input at all (none, or
    closed) refuses."""
    if stdin is None or stdin.closed:
        raise Refused(f"{question} Pass --yes to go ahead: there is no input to ask on.")
    err.write(f"{question} [y/N] ")
    err.flush()
    try:
        line = stdin.readline()
    except (OSError, ValueError):
        line = ""
    if not line:
        err.write("\n")
        raise Refused(f"{question} Pass --yes to go ahead: there is no input to ask on.")
    return line.strip().lower() in {"y", "yes"}


def run_bulk(
    c: Client,
    a: argparse.Namespace,
    action: str,
    out: TextIO,
    err: TextIO,
    stdin: TextIO | None,
) -> int:
    """Count, confirm, act and follow; the exit status (1 when a run failed or the operation
    was cancelled)."""
    from_step = getattr(a, "from_step", None)
    if action == "retry" and from_step is not None:
        action = "retryFromStep"
    f = filter_of(a)
    verb = "cancelled" if action == "cancel" else "retried"
    dry = c.bulk_runs(action, f, from_step=from_step, dry_run=True)
    matched = int(dry["matched"])
    if a.dry_run:
        if a.json:
            output.as_json(dry, out)
        else:
            out.write(f"{matched} run{'s' if matched != 1 else ''} would be {verb}\n")
            for run_id in dry["sample"]:
                out.write(f"  {run_id}\n")
        return 0
    if matched == 0:
        if a.json:
            output.as_json(dry, out)
        else:
            out.write(f"no run matches: nothing is {verb}\n")
        return 0
    if not a.yes:
        question = f"{matched} run{'s' if matched != 1 else ''} will be {verb}."
        if not _confirm(question, stdin, err):
            err.write("nothing was done\n")
            return 1
    op = c.bulk_runs(action, f, from_step=from_step)
    op = follow(c, op, err, bar=not a.json)
    if a.json:
        output.as_json(op, out)
    else:
        out.write(summary(op))
    return 0 if op["status"] == "completed" and op["failed"] == 0 else 1


def follow(c: Client, op: dict[str, Any], err: TextIO, *, bar: bool) -> dict[str, Any]:
    """Poll the operation until it ends, drawing its progress; the operation as it ended."""
    progress = (
        tqdm(
            total=op["matched"],
            desc=f"operation {op['id'][:8]}",
            unit="run",
            file=err,
            disable=not bar,
            dynamic_ncols=True,
        )
        if tqdm is not None
        else None
    )
    shown = -1
    try:
        while True:
            done = op["succeeded"] + op["failed"] + op["skipped"]
            if progress is not None:
                progress.update(done - progress.n)
                progress.set_postfix(failed=op["failed"], skipped=op["skipped"], refresh=False)
            elif bar and done != shown:
                err.write(f"operation {op['id'][:8]}: {done}/{op['matched']} runs\n")
                shown = done
            if op["status"] != "running":
                return op
            time.sleep(FOLLOW_SECONDS)
            op = c.get_operation(op["id"])
    except KeyboardInterrupt:
        err.write(
            f"\nstopped following; operation {op['id']} goes on"
            f" (stepline operations cancel {op['id']} stops it)\n"
        )
        raise
    finally:
        if progress is not None:
            progress.close()


def summary(op: dict[str, Any]) -> str:
    """An operation in a few lines: its status and counters, then its first errors."""
    lines = [
        f"operation {op['id']} {op['status']}: {op['matched']} matched, {op['succeeded']}"
        f" succeeded, {op['skipped']} skipped, {op['failed']} failed"
    ]
    for e in op.get("errors") or []:
        lines.append(f"  {e['runId']}: {e.get('code')}: {e.get('message')}")
    return "\n".join(lines) + "\n"
