"""The ``runs`` commands of the CLI (see :mod:`stepline.cli.operate`): list, show, events,
logs, start, wait, cancel, retry. ``runs start --wait`` and ``runs wait`` exit with
:data:`EXIT` for how the run ended (0 only when it completed), :data:`GAVE_UP` when they stopped
waiting first."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from stepline._client import Client
from stepline._payloads import Encryption, Payloads, S3Store
from stepline.cli import bulk, output

ENDED = frozenset({"completed", "failed", "cancelled", "timedOut"})
FOLLOW_POLL_SECONDS = 0.5
DEFAULT_URL = "http://127.0.0.1:8400"

EXIT = {"completed": 0, "failed": 3, "timedOut": 4, "cancelled": 5}
"""The exit status of ``runs start --wait`` and ``runs wait`` by how the run ended."""
GAVE_UP = 6
"""The exit status when the wait was over (``--timeout``) before the run ended."""

Command = Callable[[Client, argparse.Namespace, TextIO, TextIO], int | None]


class UsageError(Exception):
    """The command line is wrong in a way argparse cannot see (bad JSON, no key): exit 2."""


def json_arg(raw: str | None, flag: str) -> Any:
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{flag} must be JSON ({exc.msg}), e.g. {flag} '{{\"a\": 1}}'") from None


# runs


def runs_list(c: Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    filters = {
        k: v
        for k, v in (("workflow", a.workflow), ("status", a.status), ("run_key", a.run_key))
        if v is not None
    }
    page = c.list_runs(limit=a.limit, **filters)
    if a.json:
        return output.as_json(page, out)
    rows = [
        (
            r["id"],
            r["workflow"],
            r["status"],
            r.get("runKey"),
            output.when(r["createdAt"]),
            output.took(r["createdAt"], r.get("endedAt")),
        )
        for r in page["runs"]
    ]
    output.table(["ID", "WORKFLOW", "STATUS", "RUN KEY", "CREATED", "TOOK"], rows, out)
    if page.get("nextCursor"):
        out.write(f"(more: raise --limit, at most 500; showing {len(rows)})\n")


def load_payloads(target: str) -> Payloads:
    """What ``MODULE:ATTR`` names, to decode a run's values with: a :class:`stepline.Encryption`,
    a :class:`stepline.S3Store` or a :class:`stepline.Stepline` (its codec and store); the
    current folder is on the import path."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise SystemExit(f"stepline runs show: --codec {target!r} is not MODULE:ATTR")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    found = getattr(importlib.import_module(module_name), attr, None)
    if isinstance(found, Encryption):
        return Payloads(found)
    if isinstance(found, S3Store):
        return Payloads(None, found)
    kept = getattr(found, "payloads", None)
    if isinstance(kept, Payloads):
        return kept
    raise SystemExit(
        f"stepline runs show: {target} is not a stepline.Encryption, S3Store or Stepline"
    )


def runs_show(c: Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    run = c.get_run(a.id)
    if getattr(a, "codec", None):
        run = load_payloads(a.codec).open_run_sync(run)  # decoded here: the keys stay local
    if a.json:
        return output.as_json(run, out)
    out.write("\n".join(output.run_lines(run, _last_failure(c, run))) + "\n")


def _last_failure(c: Client, run: dict[str, Any]) -> dict[str, Any] | None:
    """The run's last invocation that could not be delivered, when it had any."""
    if not run.get("deliveryFailures"):
        return None
    failed = [i for i in c.iter_run_invocations(run["id"]) if i["outcome"] == "delivery_failed"]
    return failed[-1] if failed else None


def runs_events(c: Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    if not a.follow:
        events = list(c.iter_run_events(a.id))
        if a.json:
            return output.as_json({"events": events}, out)
        for e in events:
            out.write(output.event_line(e) + "\n")
        return
    after = 0
    while True:
        # Read the status before the events: an end seen here is in the events read next.
        status = c.get_run(a.id)["status"]
        for e in c.iter_run_events(a.id, after=after):
            after = e["seq"]
            out.write((json.dumps(e) if a.json else output.event_line(e)) + "\n")
            out.flush()
        if status in ENDED:
            return
        time.sleep(FOLLOW_POLL_SECONDS)


def runs_logs(c: Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    if not a.follow:
        page = c.list_run_logs(a.id, limit=500)
        lines = page["logs"]
        while page.get("nextCursor"):
            page = c.list_run_logs(a.id, cursor=page["nextCursor"], limit=500)
            lines += page["logs"]
        if a.json:
            return output.as_json({"logs": lines, "logsDropped": page["logsDropped"]}, out)
        for line in lines:
            out.write(output.log_line(line) + "\n")
        if page["logsDropped"]:
            err.write(f"({page['logsDropped']} newer lines were dropped past the run's cap)\n")
        return
    after, dropped = 0, 0
    while True:
        # Read the status before the lines: an end seen here has its lines in those read next.
        status = c.get_run(a.id)["status"]
        for line in c.iter_run_logs(a.id, after=after):
            after = line["seq"]
            out.write((json.dumps(line) if a.json else output.log_line(line)) + "\n")
            out.flush()
        if status in ENDED:
            dropped = c.list_run_logs(a.id, after=after, limit=1)["logsDropped"]
            if dropped:
                err.write(f"({dropped} newer lines were dropped past the run's cap)\n")
            return
        time.sleep(FOLLOW_POLL_SECONDS)


def _progress(run: dict[str, Any]) -> str:
    steps = run.get("steps") or []
    done = sum(1 for s in steps if s["status"] == "completed")
    current = next((s for s in reversed(steps) if s["status"] != "completed"), None)
    now = f", {current['name']} {current['status']}" if current else ""
    return f"{output.status_text(run)}, {done}/{len(steps)} steps completed{now}"


def runs_start(c: Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    run = c.start_run(
        a.workflow, json_arg(a.input, "--input"), run_key=a.run_key, priority=a.priority
    )
    if not a.wait:
        if a.json:
            output.as_json(run, out)
        else:
            out.write("\n".join(output.run_lines(run)) + "\n")
        return 0
    err.write(f"run {run['id']} started; waiting for it to end (Ctrl-C stops waiting)\n")
    return _wait_and_show(c, run, a, out, err)


def runs_wait(c: Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    run = c.get_run(a.id)
    if run["status"] not in ENDED:
        err.write(f"waiting for run {run['id']} to end (Ctrl-C stops waiting)\n")
    return _wait_and_show(c, run, a, out, err)


def _wait_and_show(
    c: Client, run: dict[str, Any], a: argparse.Namespace, out: TextIO, err: TextIO
) -> int:
    """Wait for ``run`` to end (at most ``--timeout`` seconds), printing its progress; print
    it; answer the exit status its end means (:data:`EXIT`, or :data:`GAVE_UP`)."""
    shown = ""
    deadline = None if a.timeout is None else time.monotonic() + a.timeout
    gave_up = False
    while run["status"] not in ENDED:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            gave_up = True
            break
        run = c.wait_run(run["id"], timeout=2 if left is None else max(0.1, min(2.0, left)))
        line = _progress(run)
        if line != shown:
            err.write(f"  {line}\n")
            err.flush()
            shown = line
    if a.json:
        output.as_json(run, out)
    else:
        out.write("\n".join(output.run_lines(run, _last_failure(c, run))) + "\n")
    if gave_up:
        err.write(f"gave up waiting after {a.timeout:g}s; the run goes on ({run['status']})\n")
        return GAVE_UP
    code = EXIT[run["status"]]
    if code:
        err.write(f"run {run['id']} {run['status']} (exit {code})\n")
    return code


def _bulk_or_one(a: argparse.Namespace, what: str) -> bool:
    """Whether ``runs cancel``/``runs retry`` acts on every run of a filter (else on one id)."""
    if a.id is not None:
        if bulk.wants_bulk(a) or a.dry_run or a.yes:
            raise UsageError("give a run id or filters (--workflow, --status, ...), not both")
        return False
    if not bulk.wants_bulk(a):
        raise UsageError(
            f"give the id of the run to {what}, or filters (--workflow, --status, ...) to"
            f" {what} every run they match"
        )
    return True


def runs_cancel(c: Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> int | None:
    if _bulk_or_one(a, "cancel"):
        return bulk.run_bulk(c, a, "cancel", out, err, a.stdin)
    run = c.cancel_run(a.id)
    if a.json:
        output.as_json(run, out)
        return 0
    out.write(f"run {run['id']}: {run['status']}\n")
    return 0


def runs_retry(c: Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> int | None:
    if _bulk_or_one(a, "retry"):
        return bulk.run_bulk(c, a, "retry", out, err, a.stdin)
    run = c.retry_run(a.id, from_step=a.from_step)
    if a.json:
        output.as_json(run, out)
        return 0
    where = f" from step {a.from_step!r}" if a.from_step else ""
    out.write(f"run {run['id']}: {run['status']} (retried{where})\n")
    return 0


def operations_list(c: Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    page = c.list_operations(limit=a.limit)
    if a.json:
        return output.as_json(page, out)
    for op in page["operations"]:
        out.write(bulk.summary(op))


def operations_show(c: Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    op = c.get_operation(a.id)
    if a.json:
        return output.as_json(op, out)
    out.write(bulk.summary(op))


def operations_cancel(c: Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    op = c.cancel_operation(a.id)
    if a.json:
        return output.as_json(op, out)
    out.write(bulk.summary(op))
