"""``stepline alerts create|list|test|delete|deliveries``: an environment's alerts, through the
REST API with an admin key (run by :func:`stepline_server.cli.operate.run`)."""

from __future__ import annotations

import argparse
import time
from typing import TextIO

from stepline._client import Client
from stepline.cli import output
from stepline.cli.operate import common_arguments
from stepline.cli.runs import Command, UsageError

TYPES = (
    "run.failed",
    "run.timedOut",
    "run.stuck",
    "app.unreachable",
    "schedule.disabled",
    "schedule.slaBreached",
)
TEST_WAIT_SECONDS = 15.0


def alerts_create(c: Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    if (a.webhook is None) == (a.slack is None):
        raise UsageError("alerts create: give --webhook URL or --slack URL (one of them)")
    kind, url = ("webhook", a.webhook) if a.webhook is not None else ("slack", a.slack)
    alert = c.create_alert(a.name, a.on, {"type": kind, "url": url}, workflow=a.workflow)
    if a.json:
        return output.as_json(alert, out)
    on = ", ".join(alert["on"])
    scope = f" of workflow {alert['workflow']}" if alert["workflow"] else ""
    out.write(f"alert {alert['id']} ({alert['name']}) sends {on}{scope} to {kind} {url}\n")
    if "secret" in alert:
        out.write(f"signing secret (shown once): {alert['secret']}\n")
        out.write(
            "Check each notification with stepline.verify_webhook(body, signature, secret).\n"
        )


def alerts_list(c: Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    page = c.list_alerts(limit=a.limit)
    if a.json:
        return output.as_json(page, out)
    rows = [
        (
            r["id"],
            r["name"],
            ",".join(r["on"]),
            r["workflow"],
            r["destination"]["type"],
            r["destination"]["url"],
        )
        for r in page["alerts"]
    ]
    output.table(["ID", "NAME", "ON", "WORKFLOW", "TYPE", "URL"], rows, out)


def alerts_test(c: Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    """Send an alert.test notification and wait (a little) for its first attempt."""
    sent = c.test_alert(a.id)
    delivery = sent
    deadline = time.monotonic() + a.wait
    while delivery["attempts"] == 0 and time.monotonic() < deadline:
        time.sleep(0.25)
        page = c.list_alert_deliveries(a.id, limit=20)
        delivery = next((d for d in page["deliveries"] if d["id"] == sent["id"]), delivery)
    if a.json:
        return output.as_json(delivery, out)
    out.write(f"test notification {delivery['id']}: {_outcome(delivery)}\n")


def _outcome(d: dict[str, object]) -> str:
    if d["status"] == "delivered":
        return f"delivered (HTTP {d['lastHttpStatus']})"
    if not d["attempts"]:
        return "pending (no attempt yet)"
    tries = f"{d['attempts']} attempt(s)"
    return f"{d['status']} after {tries}, last: {d['lastError']} (tried again with backoff)"


def alerts_delete(c: Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    c.delete_alert(a.id)
    if a.json:
        return output.as_json({"id": a.id, "deleted": True}, out)
    out.write(f"alert {a.id} deleted\n")


def alerts_deliveries(c: Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    page = c.list_alert_deliveries(a.id, limit=a.limit)
    if a.json:
        return output.as_json(page, out)
    rows = [
        (
            d["id"],
            d["type"],
            d["status"],
            d["attempts"],
            d["lastHttpStatus"],
            d["lastError"],
            output.when(d["createdAt"]),
            output.when(d["deliveredAt"]),
        )
        for d in page["deliveries"]
    ]
    headers = ["ID", "TYPE", "STATUS", "ATTEMPTS", "HTTP", "ERROR", "CREATED", "DELIVERED"]
    output.table(headers, rows, out)


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``alerts`` to the CLI."""
    common = common_arguments()
    group = sub.add_parser("alerts", help="alerts (admin key): create, list, test, delete")
    g = group.add_subparsers(dest="alerts_command", required=True)

    def leaf(name: str, fn: Command, help: str) -> argparse.ArgumentParser:
        p = g.add_parser(name, help=help, parents=[common])
        p.set_defaults(operate=fn)
        return p

    p = leaf("create", alerts_create, "make an alert; a webhook's signing secret is printed once")
    p.add_argument("name")
    p.add_argument(
        "--on", action="append", required=True, choices=TYPES, help="a type to send (repeat)"
    )
    p.add_argument("--workflow", help="only runs (and schedules) of this workflow")
    p.add_argument("--webhook", metavar="URL", help="POST signed JSON notifications here")
    p.add_argument("--slack", metavar="URL", help="a Slack incoming webhook's URL")
    p = leaf("list", alerts_list, "the environment's alerts")
    p.add_argument("--limit", type=int, default=100)
    p = leaf("test", alerts_test, "send an alert.test notification now and show how it went")
    p.add_argument("id")
    p.add_argument(
        "--wait", type=float, default=TEST_WAIT_SECONDS, help="wait this long for an attempt [15]"
    )
    p = leaf("delete", alerts_delete, "remove an alert and its deliveries")
    p.add_argument("id")
    p = leaf("deliveries", alerts_deliveries, "an alert's notifications and their delivery")
    p.add_argument("id")
    p.add_argument("--limit", type=int, default=50)
