"""The operator commands: runs, callbacks, events, apps, workflows and schedules of any
orchestrator.

Each talks to the REST API with :class:`Client`, so it needs nothing but a URL and an
API key (and the SDK: no server extra). Tables by default, ``--json`` for scripts; exit 0 on
success, 1 on an API error (its message printed), 2 on bad usage; ``runs start --wait`` and
``runs wait`` exit with :data:`EXIT` for how the run ended (0 only when it completed) and
:data:`GAVE_UP` when they stopped waiting first.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, TextIO

import httpx

from stepline._client import ApiError, Client
from stepline.cli import bulk, output
from stepline.cli.runs import (
    DEFAULT_URL,
    ENDED,
    EXIT,
    FOLLOW_POLL_SECONDS,
    GAVE_UP,
    Command,
    UsageError,
    json_arg,
    operations_cancel,
    operations_list,
    operations_show,
    runs_cancel,
    runs_events,
    runs_list,
    runs_logs,
    runs_retry,
    runs_show,
    runs_start,
    runs_wait,
)

__all__ = [
    "DEFAULT_URL",
    "ENDED",
    "EXIT",
    "FOLLOW_POLL_SECONDS",
    "GAVE_UP",
    "UsageError",
    "add_commands",
    "common_arguments",
    "run",
    "schedule_id",
]


# callbacks and events


def callbacks_complete(c: Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    done = c.complete_callback(a.id, json_arg(a.data, "--data"))
    if a.json:
        return output.as_json(done, out)
    again = " (already, with this body)" if done.get("deduplicated") else ""
    out.write(f"callback {done['id']} of run {done['runId']}: {done['status']}{again}\n")


def events_send(c: Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    sent = c.send_event(a.name, json_arg(a.data, "--data"), id=a.id)
    if a.json:
        return output.as_json(sent, out)
    started = sent.get("startedRuns") or []
    again = (
        " (a second send of this id: nothing was done again)" if sent.get("deduplicated") else ""
    )
    out.write(
        f"event {sent['id']} ({sent['name']}) sent{again}: {sent['matchedRuns']} waiting run(s)"
        f" resumed, {len(started)} run(s) started\n"
    )
    for run_id in started:
        out.write(f"  started {run_id}\n")


# apps


def events_list(c: Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    page = c.list_events(
        name=a.name, created_after=a.created_after, created_before=a.created_before, limit=a.limit
    )
    if a.json:
        return output.as_json(page, out)
    rows = [
        (e["id"], e["name"], output.when(e["createdAt"]), e["matchedRuns"], len(e["startedRuns"]))
        for e in page["events"]
    ]
    output.table(["ID", "NAME", "RECEIVED", "RESUMED", "STARTED"], rows, out)
    if page.get("nextCursor"):
        out.write(f"(more: raise --limit, at most 500; showing {len(rows)})\n")


def apps_list(c: Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
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


def apps_register(c: Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    if a.pull == (a.app_url is not None):
        raise UsageError("apps register: give the app's URL, or --pull (and no URL)")
    app = c.create_app(a.name, a.app_url, kind="pull" if a.pull else "push")
    if a.json:
        return output.as_json(app, out)
    if a.pull:
        # A pull app's invocations come back over its workers' polls: no secret to keep.
        out.write(f"pull app {app['slug']} ({app['name']}) registered\n\n")
        out.write("Next: on a machine with the app's code, run its worker (it syncs the app):\n")
        out.write(f"  stepline worker MODULE:ATTR --app {app['slug']}\n")
        out.write("with STEPLINE_URL and STEPLINE_API_KEY (a write key) set.\n")
        return None
    out.write(f"app {app['slug']} ({app['name']}) registered at {app['url']}\n")
    out.write(f"signing secret (shown once): {app['signingSecret']}\n\n")
    out.write("Next: give the app this secret as STEPLINE_SIGNING_SECRET, restart it, then\n")
    out.write(f"  stepline apps sync {app['slug']}\n")


def apps_sync(c: Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    done = c.sync_app(a.app, take_over=a.take_over)
    if a.json:
        return output.as_json(done, out)
    app = done["app"]
    out.write(f"app {app['slug']} synced (deployment {app.get('deploymentId') or '-'}):\n")
    output.table(
        ["WORKFLOW", "OPTIONS"], [(w["name"], w["options"]) for w in done["workflows"]], out
    )
    for moved in done.get("movedWorkflows", []):
        out.write(f"moved workflow {moved['name']} here from app {moved['fromApp']}\n")


def apps_delete(c: Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    app = c.get_app(a.app)  # by id, slug or name; says which app it was
    if not a.yes and sys.stdin.isatty():
        err.write(f"delete app {app['slug']} ({app['name']})? [y/N] ")
        err.flush()
        if sys.stdin.readline().strip().lower() not in ("y", "yes"):
            err.write("not deleted\n")
            return 1
    c.delete_app(app["slug"])
    if a.json:
        output.as_json({"deleted": app["slug"], "name": app["name"]}, out)
    else:
        out.write(f"app {app['slug']} ({app['name']}) deleted\n")
    return 0


def deployments_list(c: Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    listed = c.list_deployments(a.app)
    if a.json:
        return output.as_json(listed, out)
    rows = [
        (
            d["id"],
            d.get("deploymentId") or "-",
            d.get("url") or "-",
            "yes" if d["current"] else "",
            d.get("runningRuns", 0),
        )
        for d in listed["deployments"]
    ]
    output.table(["ID", "DEPLOYMENT", "URL", "CURRENT", "RUNNING"], rows, out)


def deployments_create(c: Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    d = c.create_deployment(a.app, a.app_url, deployment_id=a.deployment_id)
    if a.json:
        return output.as_json(d, out)
    out.write(f"deployment {d['id']} ({d.get('deploymentId') or '-'}) is current\n")


def deployments_delete(c: Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    c.delete_deployment(a.app, a.id, move_to=a.move_to)
    if a.json:
        return output.as_json({"deleted": a.id}, out)
    out.write(f"deployment {a.id} deleted\n")


def runs_move(c: Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    run = c.move_run(a.id, a.deployment)
    if a.json:
        return output.as_json(run, out)
    out.write(f"run {run['id']} moved to deployment {run.get('deployment')}\n")


def workflows_list(c: Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    page = c.list_workflows(limit=a.limit)
    if a.json:
        return output.as_json(page, out)
    rows = [
        (
            w["name"],
            w.get("appName") or w["app"],
            w.get("version"),
            "yes" if w.get("paused") else "no",
            w["options"],
        )
        for w in page["workflows"]
    ]
    output.table(["WORKFLOW", "APP", "VERSION", "PAUSED", "OPTIONS"], rows, out)


# schedules


def _pause_change(what: str, verb: str) -> Command:
    """``workflows pause|resume NAME`` and ``apps pause|resume APP``."""

    def command(c: Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
        done = getattr(c, f"{verb}_{what}")(a.target)
        if a.json:
            return output.as_json(done, out)
        name = done.get("name") or a.target
        state = "paused: none of its runs is invoked" if done["paused"] else "resumed"
        out.write(f"{what} {name}: {state}\n")

    return command


def schedule_id(c: Client, ref: str) -> str:
    """The id of the schedule ``ref`` names: its id (``wfs_…``), or the workflow of its only
    schedule."""
    if ref.startswith("wfs_"):
        return ref
    found = [s["id"] for s in c.iter_schedules() if s["workflow"] == ref]
    if len(found) > 1:
        raise UsageError(
            f"workflow {ref!r} has {len(found)} schedules ({', '.join(found)}): give an id"
        )
    return found[0] if found else ref


def schedules_list(c: Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
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
    def command(c: Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
        schedule = getattr(c, f"{name}_schedule")(schedule_id(c, a.id))
        if a.json:
            return output.as_json(schedule, out)
        out.write(f"schedule {schedule['id']}: {schedule['status']}\n")

    return command


def schedules_trigger(c: Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    sid = schedule_id(c, a.id)
    run = c.trigger_schedule(sid)
    if a.json:
        return output.as_json(run, out)
    out.write(f"schedule {sid} triggered run {run['id']} ({run['status']})\n")


# the parser


def common_arguments() -> argparse.ArgumentParser:
    """``--url``, ``--api-key`` and ``--json``, shared by every command that talks REST."""
    url = os.environ.get("STEPLINE_URL") or DEFAULT_URL
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=url, help=f"the orchestrator [STEPLINE_URL, {url}]")
    common.add_argument(
        "--api-key",
        default=os.environ.get("STEPLINE_API_KEY") or None,
        help="an API key [STEPLINE_API_KEY]",
    )
    common.add_argument("--json", action="store_true", help="print JSON, for scripts")
    return common


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``runs``, ``callbacks``, ``events``, ``apps``, ``workflows`` and ``schedules``."""
    common = common_arguments()

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
    p.add_argument("--run-key", help="runs with this run key, or a prefix ending with '*'")
    p.add_argument("--limit", type=int, default=50, help="at most this many [50, max 500]")
    p = leaf(runs, "show", runs_show, "a run with its steps and errors (with tracebacks)")
    p.add_argument("id")
    p.add_argument(
        "--codec",
        metavar="MODULE:ATTR",
        help="decrypt (and read from the store) the run's values here, with the"
        " stepline.Encryption, S3Store or Stepline this names",
    )
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
    p.add_argument(
        "--wait",
        action="store_true",
        help="print the run once it has ended; exit 0 only when it completed (docs/cli.md)",
    )
    p.add_argument("--timeout", type=float, help="with --wait: stop waiting after this many s")
    p = leaf(runs, "wait", runs_wait, "wait for a run to end; exit 0 only when it completed")
    p.add_argument("id")
    p.add_argument("--timeout", type=float, help="stop waiting after this many seconds (exit 6)")
    p = leaf(runs, "cancel", runs_cancel, "request a run's cancellation, or every matching run's")
    p.add_argument("id", nargs="?", help="the run (or filters instead: every run they match)")
    bulk.add_filter_flags(p)
    p = leaf(runs, "move", runs_move, "move a run to another deployment of its app")
    p.add_argument("id")
    p.add_argument("deployment", help="the deployment's id or deploymentId")
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

    events = group("events", "send and list events")
    p = leaf(events, "send", events_send, "send an event to the runs waiting for it")
    p.add_argument("name")
    p.add_argument("--data", help="the event's data, as JSON")
    p.add_argument("--id", help="the event's id: a second send of it within a day does nothing")
    p = leaf(events, "list", events_list, "the events received (kept a day), newest first")
    p.add_argument("--name", help="only events of this name")
    p.add_argument("--created-after", help="events received at or after this RFC 3339 time")
    p.add_argument("--created-before", help="events received before this RFC 3339 time")
    p.add_argument("--limit", type=int, default=50, help="at most this many [50, max 500]")

    apps = group("apps", "apps: list, register, sync, delete, pause, resume")
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
    p.add_argument(
        "--take-over",
        action="store_true",
        help="move here the workflows it hosts that another app registered (refused otherwise)",
    )
    deps = apps.add_parser("deployments", help="an app's deployments: list, create, delete")
    dg = deps.add_subparsers(dest="deployments_command", required=True)
    p = leaf(dg, "list", deployments_list, "an app's deployments, newest first")
    p.add_argument("app", help="the app's id, slug or name")
    p = leaf(dg, "create", deployments_create, "register and sync a deployment; it becomes current")
    p.add_argument("app", help="the app's id, slug or name")
    p.add_argument("app_url", metavar="url", nargs="?", help="where it answers (a push app)")
    p.add_argument("--deployment-id", help="the id it goes by (default: what the app answers)")
    p = leaf(dg, "delete", deployments_delete, "delete a deployment (refused while runs are on it)")
    p.add_argument("app", help="the app's id, slug or name")
    p.add_argument("id", help="the deployment's id or deploymentId")
    p.add_argument("--move-to", choices=["current"], help="move its runs to the current one first")
    p = leaf(apps, "delete", apps_delete, "remove an app (asks first on a terminal)")
    p.add_argument("app", help="the app's id, slug or name")
    p.add_argument("--yes", action="store_true", help="do not ask")

    workflows = group("workflows", "registered workflows: list, pause, resume")
    p = leaf(workflows, "list", workflows_list, "the workflows apps registered at sync")
    p.add_argument("--limit", type=int, default=100)
    for verb, help in (("pause", "stop invoking its runs"), ("resume", "invoke its runs again")):
        p = leaf(workflows, verb, _pause_change("workflow", verb), f"{help} (runs still start)")
        p.add_argument("target", metavar="name")
        p = leaf(apps, verb, _pause_change("app", verb), f"{help} (the app's)")
        p.add_argument("target", metavar="app", help="the app's id, slug or name")

    schedules = group("schedules", "cron schedules: list, pause, resume, trigger")
    p = leaf(schedules, "list", schedules_list, "schedules")
    p.add_argument("--limit", type=int, default=100)
    which = "the schedule's id, or the workflow of its only schedule"
    for name in ("pause", "resume"):
        p = leaf(schedules, name, _schedule_change(name), f"{name} a schedule")
        p.add_argument("id", metavar="SCHEDULE", help=which)
    p = leaf(schedules, "trigger", schedules_trigger, "start a run of a schedule now")
    p.add_argument("id", metavar="SCHEDULE", help=which)


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
        with Client(args.url, api_key=args.api_key) as client:
            code = args.operate(client, args, out, err)
    except (UsageError, bulk.Refused) as exc:
        err.write(f"stepline: {exc}\n")
        return 2
    except ApiError as exc:
        err.write(f"stepline: {exc.code}: {exc.message}\n")
        return 1
    except httpx.HTTPError as exc:
        err.write(f"stepline: cannot reach the orchestrator at {args.url} ({exc})\n")
        return 1
    except KeyboardInterrupt:
        return 130
    return int(code or 0)
