"""The operator commands: runs, callbacks, events, apps and schedules of any orchestrator.

Each talks to the REST API with :class:`stepline.Client`, so it needs nothing but a URL and an
API key. Tables by default, ``--json`` for scripts; exit 0 on success, 1 on an API error (its
message printed), 2 on bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import httpx

import stepline
from stepline_server.cli import bulk, output, pausing
from stepline_server.settings import operator_from_env

ENDED = frozenset({"completed", "failed", "cancelled", "timedOut"})
FOLLOW_POLL_SECONDS = 0.5

Command = Callable[[stepline.Client, argparse.Namespace, TextIO, TextIO], int | None]


class UsageError(Exception):
    """The command line is wrong in a way argparse cannot see (bad JSON, no key): exit 2."""


def _json_arg(raw: str | None, flag: str) -> Any:
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{flag} must be JSON ({exc.msg}), e.g. {flag} '{{\"a\": 1}}'") from None


# runs


def runs_list(c: stepline.Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
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


def runs_show(c: stepline.Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    run = c.get_run(a.id)
    if a.json:
        return output.as_json(run, out)
    out.write("\n".join(output.run_lines(run)) + "\n")


def runs_events(c: stepline.Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
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


def runs_logs(c: stepline.Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
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
    return f"{run['status']}, {done}/{len(steps)} steps completed{now}"


def runs_start(c: stepline.Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    run = c.start_run(
        a.workflow, _json_arg(a.input, "--input"), run_key=a.run_key, priority=a.priority
    )
    if a.wait:
        err.write(f"run {run['id']} started; waiting for it to end (Ctrl-C stops waiting)\n")
        shown = ""
        deadline = None if a.timeout is None else time.monotonic() + a.timeout
        while run["status"] not in ENDED:
            if deadline is not None and time.monotonic() >= deadline:
                err.write(f"gave up waiting after {a.timeout:g}s; the run goes on\n")
                break
            run = c.wait_run(run["id"], timeout=2)
            line = _progress(run)
            if line != shown:
                err.write(f"  {line}\n")
                err.flush()
                shown = line
    if a.json:
        return output.as_json(run, out)
    out.write("\n".join(output.run_lines(run)) + "\n")


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


def runs_cancel(c: stepline.Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> int | None:
    if _bulk_or_one(a, "cancel"):
        return bulk.run_bulk(c, a, "cancel", out, err, a.stdin)
    run = c.cancel_run(a.id)
    if a.json:
        output.as_json(run, out)
        return 0
    out.write(f"run {run['id']}: {run['status']}\n")
    return 0


def runs_retry(c: stepline.Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> int | None:
    if _bulk_or_one(a, "retry"):
        return bulk.run_bulk(c, a, "retry", out, err, a.stdin)
    run = c.retry_run(a.id, from_step=a.from_step)
    if a.json:
        output.as_json(run, out)
        return 0
    where = f" from step {a.from_step!r}" if a.from_step else ""
    out.write(f"run {run['id']}: {run['status']} (retried{where})\n")
    return 0


# callbacks and events


def callbacks_complete(c: stepline.Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    done = c.complete_callback(a.id, _json_arg(a.data, "--data"))
    if a.json:
        return output.as_json(done, out)
    out.write(f"callback {done['id']} of run {done['runId']}: {done['status']}\n")


def events_send(c: stepline.Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    sent = c.send_event(a.name, _json_arg(a.data, "--data"))
    if a.json:
        return output.as_json(sent, out)
    out.write(f"event {sent['id']} ({sent['name']}) sent: {sent['matchedRuns']} run(s) resumed\n")


# apps


def apps_list(c: stepline.Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    page = c.list_apps(limit=a.limit)
    if a.json:
        return output.as_json(page, out)
    rows = [
        (
            r["slug"],
            r["name"],
            r.get("kind", "push"),
            r["url"] if r["url"] is not None else "-",
            r.get("deploymentId"),
            output.when(r.get("syncedAt")),
            output.when(r.get("lastPolledAt")),
        )
        for r in page["apps"]
    ]
    headers = ["SLUG", "NAME", "KIND", "URL", "DEPLOYMENT", "SYNCED", "POLLED"]
    output.table(headers, rows, out)


def apps_register(c: stepline.Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    if a.pull == (a.app_url is not None):
        raise UsageError("apps register: give the app's URL, or --pull (and no URL)")
    app = c.create_app(a.name, a.app_url, kind="pull" if a.pull else "push")
    if a.json:
        return output.as_json(app, out)
    if a.pull:
        out.write(f"pull app {app['slug']} ({app['name']}) registered\n")
        out.write(f"signing secret (shown once): {app['signingSecret']}\n\n")
        out.write("Next: on a machine with the app's code, run its worker (it syncs the app):\n")
        out.write(f"  stepline worker MODULE:ATTR --app {app['slug']}\n")
        out.write("with STEPLINE_URL and STEPLINE_API_KEY (a write key) set.\n")
        return None
    out.write(f"app {app['slug']} ({app['name']}) registered at {app['url']}\n")
    out.write(f"signing secret (shown once): {app['signingSecret']}\n\n")
    out.write("Next: give the app this secret as STEPLINE_SIGNING_SECRET, restart it, then\n")
    out.write(f"  stepline apps sync {app['slug']}\n")


def apps_sync(c: stepline.Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    done = c.sync_app(a.app)
    if a.json:
        return output.as_json(done, out)
    app = done["app"]
    out.write(f"app {app['slug']} synced (deployment {app.get('deploymentId') or '-'}):\n")
    output.table(
        ["WORKFLOW", "OPTIONS"], [(w["name"], w["options"]) for w in done["workflows"]], out
    )


# schedules


def schedules_list(c: stepline.Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    page = c.list_schedules(limit=a.limit)
    if a.json:
        return output.as_json(page, out)
    rows = [
        (
            s["id"],
            s["workflow"],
            s["cron"],
            s["timezone"],
            s["status"],
            output.when(s.get("nextFireAt")),
            output.when(s.get("lastFireAt")),
            output.duration(s["slaMs"] / 1000) if s.get("slaMs") else None,
        )
        for s in page["schedules"]
    ]
    headers = ["ID", "WORKFLOW", "CRON", "TIMEZONE", "STATUS", "NEXT", "LAST", "SLA"]
    output.table(headers, rows, out)


def _schedule_change(name: str) -> Command:
    def command(c: stepline.Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
        schedule = getattr(c, f"{name}_schedule")(a.id)
        if a.json:
            return output.as_json(schedule, out)
        out.write(f"schedule {schedule['id']}: {schedule['status']}\n")

    return command


def schedules_trigger(c: stepline.Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    run = c.trigger_schedule(a.id)
    if a.json:
        return output.as_json(run, out)
    out.write(f"schedule {a.id} triggered run {run['id']} ({run['status']})\n")


# bulk operations


def operations_list(c: stepline.Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    page = c.list_operations(limit=a.limit)
    if a.json:
        return output.as_json(page, out)
    for op in page["operations"]:
        out.write(bulk.summary(op))


def operations_show(c: stepline.Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    op = c.get_operation(a.id)
    if a.json:
        return output.as_json(op, out)
    out.write(bulk.summary(op))


def operations_cancel(c: stepline.Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    op = c.cancel_operation(a.id)
    if a.json:
        return output.as_json(op, out)
    out.write(bulk.summary(op))


# the parser


def _common() -> argparse.ArgumentParser:
    env = operator_from_env()
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url", default=env.url, help=f"the orchestrator [STEPLINE_URL, {env.url}]"
    )
    common.add_argument("--api-key", default=env.api_key, help="an API key [STEPLINE_API_KEY]")
    common.add_argument("--json", action="store_true", help="print JSON, for scripts")
    return common


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``runs``, ``operations``, ``callbacks``, ``events``, ``apps`` and ``schedules`` to
    the CLI."""
    common = _common()

    def group(name: str, help: str) -> argparse._SubParsersAction[argparse.ArgumentParser]:
        p = sub.add_parser(name, help=help)
        return p.add_subparsers(dest=f"{name}_command", required=True)

    def leaf(
        g: argparse._SubParsersAction[argparse.ArgumentParser], name: str, fn: Command, help: str
    ) -> argparse.ArgumentParser:
        p = g.add_parser(name, help=help, parents=[common])
        p.set_defaults(operate=fn)
        return p

    runs = group("runs", "list, inspect, start, cancel and retry runs")
    p = leaf(runs, "list", runs_list, "search runs, newest first")
    p.add_argument("--workflow")
    p.add_argument(
        "--status", choices=["running", "cancelling", *sorted(ENDED)], help="a run status"
    )
    p.add_argument("--run-key")
    p.add_argument("--limit", type=int, default=50, help="at most this many [50, max 500]")
    p = leaf(runs, "show", runs_show, "a run with its steps and errors (with tracebacks)")
    p.add_argument("id")
    p = leaf(runs, "events", runs_events, "a run's history")
    p.add_argument("id")
    p.add_argument("--follow", action="store_true", help="print new events until the run ends")
    p = leaf(runs, "logs", runs_logs, "a run's log lines (ctx.log and logging in steps)")
    p.add_argument("id")
    p.add_argument("--follow", action="store_true", help="print new lines until the run ends")
    p = leaf(runs, "start", runs_start, "start a run")
    p.add_argument("workflow")
    p.add_argument("--input", help="the input, as JSON")
    p.add_argument("--run-key", help="an idempotency key for the run")
    p.add_argument("--priority", type=int, help="-100 to 100 (default 0): due runs go higher first")
    p.add_argument("--wait", action="store_true", help="print the run once it has ended")
    p.add_argument("--timeout", type=float, help="with --wait: stop waiting after this many s")
    p = leaf(runs, "cancel", runs_cancel, "request a run's cancellation, or every matching run's")
    p.add_argument("id", nargs="?", help="the run (or filters instead: every run they match)")
    bulk.add_filter_flags(p)
    p = leaf(runs, "retry", runs_retry, "run a failed, cancelled or timed-out run again, or many")
    p.add_argument("id", nargs="?", help="the run (or filters instead: every run they match)")
    p.add_argument("--from-step", help="run this step and every step after it again")
    bulk.add_filter_flags(p)

    ops = group("operations", "bulk operations: list, show, cancel")
    p = leaf(ops, "list", operations_list, "bulk operations, newest first")
    p.add_argument("--limit", type=int, default=50)
    p = leaf(ops, "show", operations_show, "an operation's progress and first errors")
    p.add_argument("id")
    p = leaf(ops, "cancel", operations_cancel, "stop an operation (what it did stays done)")
    p.add_argument("id")

    callbacks = group("callbacks", "complete waiting callbacks")
    p = leaf(callbacks, "complete", callbacks_complete, "complete a callback (id or signed URL)")
    p.add_argument("id")
    p.add_argument("--data", help="the body the run receives, as JSON")

    events = group("events", "send events")
    p = leaf(events, "send", events_send, "send an event to the runs waiting for it")
    p.add_argument("name")
    p.add_argument("--data", help="the event's data, as JSON")

    apps = group("apps", "apps: list, register, sync, pause, resume")
    p = leaf(apps, "list", apps_list, "registered apps")
    p.add_argument("--limit", type=int, default=100)
    p = leaf(apps, "register", apps_register, "register an app; prints its signing secret")
    p.add_argument("name")
    p.add_argument(
        "app_url", metavar="url", nargs="?", help="where the app's Stepline handler answers"
    )
    p.add_argument(
        "--pull",
        action="store_true",
        help="a pull app: no URL, its workers poll for invocations (stepline worker)",
    )
    p = leaf(apps, "sync", apps_sync, "ask the app which workflows it hosts and register them")
    p.add_argument("app", help="the app's id, slug or name")
    pausing.add_commands(sub, apps, leaf)

    schedules = group("schedules", "cron schedules: list, pause, resume, trigger")
    p = leaf(schedules, "list", schedules_list, "schedules")
    p.add_argument("--limit", type=int, default=100)
    for name in ("pause", "resume"):
        p = leaf(schedules, name, _schedule_change(name), f"{name} a schedule")
        p.add_argument("id")
    p = leaf(schedules, "trigger", schedules_trigger, "start a run of a schedule now")
    p.add_argument("id")


_STDIN: Any = object()


def run(
    args: argparse.Namespace,
    out: TextIO | None = None,
    err: TextIO | None = None,
    stdin: TextIO | None = _STDIN,
) -> int:
    """Run the operator command ``args`` names (printing to ``out`` and ``err``, by default
    stdout and stderr, asking on ``stdin``, by default the process's; None: no one to ask);
    answer its exit status."""
    out = out or sys.stdout
    err = err or sys.stderr
    args.stdin = sys.stdin if stdin is _STDIN else stdin
    if not args.api_key:
        err.write(
            "stepline: no API key: pass --api-key or set STEPLINE_API_KEY"
            " (make one with `stepline keys create`)\n"
        )
        return 2
    try:
        with stepline.Client(args.url, api_key=args.api_key) as client:
            code = args.operate(client, args, out, err)
    except (UsageError, bulk.Refused) as exc:
        err.write(f"stepline: {exc}\n")
        return 2
    except stepline.ApiError as exc:
        err.write(f"stepline: {exc.code}: {exc.message}\n")
        return 1
    except httpx.HTTPError as exc:
        err.write(f"stepline: cannot reach the orchestrator at {args.url} ({exc})\n")
        return 1
    except KeyboardInterrupt:
        return 130
    return code if isinstance(code, int) else 0
