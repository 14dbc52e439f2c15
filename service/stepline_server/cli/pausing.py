"""``stepline workflows list|pause|resume`` and ``stepline apps pause|resume``: stop invoking a
workflow's or an app's runs while something is fixed, then let them go on."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, TextIO

import stepline
from stepline_server.cli import output

Command = Callable[[stepline.Client, argparse.Namespace, TextIO, TextIO], None]
Leaf = Callable[[Any, str, Command, str], argparse.ArgumentParser]


def workflows_list(c: stepline.Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    page = c.list_workflows(limit=a.limit)
    if a.json:
        return output.as_json(page, out)
    rows = [(w["name"], w["app"], "paused" if w.get("paused") else "-") for w in page["workflows"]]
    output.table(["WORKFLOW", "APP", "PAUSED"], rows, out)


def _change(what: str, verb: str) -> Command:
    def command(c: stepline.Client, a: argparse.Namespace, out: TextIO, err: TextIO) -> None:
        done = getattr(c, f"{verb}_{what}")(a.target)
        if a.json:
            return output.as_json(done, out)
        name = done.get("name") or a.target
        state = "paused: none of its runs is invoked" if done["paused"] else "resumed"
        out.write(f"{what} {name}: {state}\n")

    return command


def add_commands(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    apps: argparse._SubParsersAction[argparse.ArgumentParser],
    leaf: Leaf,
) -> None:
    """Add the ``workflows`` group, and ``pause``/``resume`` to the ``apps`` group."""
    workflows = sub.add_parser("workflows", help="workflows: list, pause, resume")
    group = workflows.add_subparsers(dest="workflows_command", required=True)
    p = leaf(group, "list", workflows_list, "registered workflows")
    p.add_argument("--limit", type=int, default=100)
    for verb, help in (("pause", "stop invoking its runs"), ("resume", "invoke its runs again")):
        p = leaf(group, verb, _change("workflow", verb), f"{help} (runs still start)")
        p.add_argument("target", metavar="name")
        p = leaf(apps, verb, _change("app", verb), f"{help} (the app's)")
        p.add_argument("target", metavar="app", help="the app's id, slug or name")
