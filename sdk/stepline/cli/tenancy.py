"""``stepline projects``, ``environments`` and ``keys``: over REST with an admin key (``--url``,
``--api-key``), or, with neither given, straight on the orchestrator's database (the server
extra's part, :mod:`stepline_server.cli.tenancy`), so that the first keys can be made.

They print what they made and nothing else: no log lines.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, TextIO

import httpx

from stepline._client import ApiError, Client
from stepline.cli import output
from stepline.cli.operate import DEFAULT_URL

ROLES = ("owner", "admin", "write", "read")


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``projects``, ``environments`` and ``keys`` subcommands."""
    remote = argparse.ArgumentParser(add_help=False)
    remote.add_argument(
        "--url",
        help="an orchestrator to ask over REST [STEPLINE_URL]; without --url or --api-key the"
        " command works on the local database (DATABASE_URL or the data folder)",
    )
    remote.add_argument(
        "--api-key", help="an admin key, over REST [STEPLINE_API_KEY when --url is given]"
    )
    remote.add_argument("--json", action="store_true", help="print JSON (over REST)")

    def leaf(
        g: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help: str
    ) -> argparse.ArgumentParser:
        return g.add_parser(name, help=help, parents=[remote])

    projects = sub.add_parser("projects", help="projects").add_subparsers(
        dest="projects_command", required=True
    )
    create = leaf(projects, "create", "make a project; prints an owner key for it (local only)")
    create.add_argument("name")
    leaf(projects, "list", "list the projects (over REST: the key's)")

    envs = sub.add_parser("environments", help="environments of a project").add_subparsers(
        dest="environments_command", required=True
    )
    for name in ("create", "list"):
        cmd = leaf(envs, name, f"{name} environments")
        if name == "create":
            cmd.add_argument("name")
        cmd.add_argument("--project", help="the project [the default project; local only]")

    keys_cmd = sub.add_parser("keys", help="API keys").add_subparsers(
        dest="keys_command", required=True
    )
    create = leaf(keys_cmd, "create", "make an API key; the key is the last line")
    create.add_argument("--name", default="cli", help="a name to remember the key by")
    create.add_argument("--project", help="the project [the default project; local only]")
    create.add_argument("--environment", help="[production; over REST: the key's own environment]")
    create.add_argument("--role", choices=ROLES, default="admin", help="[admin]")
    listing = leaf(keys_cmd, "list", "list the active keys")
    listing.add_argument("--project", help="the project [the default project; local only]")
    listing.add_argument("--environment", help="only this environment's keys")
    revoke = leaf(keys_cmd, "revoke", "revoke a key by its id")
    revoke.add_argument("id")


def over_rest(args: argparse.Namespace) -> bool:
    """Whether the command goes over REST: ``--url`` or ``--api-key`` was given (or
    ``STEPLINE_URL`` is set); otherwise it works on the local database."""
    return bool(args.url or args.api_key or os.environ.get("STEPLINE_URL"))


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Carry out a ``projects``, ``environments`` or ``keys`` command over REST."""
    out = out or sys.stdout
    err = err or sys.stderr
    url = args.url or os.environ.get("STEPLINE_URL") or DEFAULT_URL
    key = args.api_key or os.environ.get("STEPLINE_API_KEY")
    if not key:
        err.write("stepline: over REST these commands need an admin key: --api-key\n")
        return 2
    if getattr(args, "project", None):
        err.write(
            "stepline: --project works on the local database only (a key sees its own"
            " project): leave out --url and --api-key\n"
        )
        return 2
    try:
        with Client(url, api_key=key) as client:
            return _run(client, args, out)
    except ApiError as exc:
        err.write(f"stepline: {exc.code}: {exc.message}\n")
        return 1
    except httpx.HTTPError as exc:
        err.write(f"stepline: cannot reach the orchestrator at {url} ({exc})\n")
        return 1


def _run(c: Client, args: argparse.Namespace, out: TextIO) -> int:
    answer: Any
    if args.command == "projects":
        if args.projects_command == "create":
            sys.stderr.write(
                "stepline: a project is made on the database (leave out --url and --api-key,"
                " beside the orchestrator)\n"
            )
            return 2
        answer = c.list_projects()
        if not args.json:
            for row in answer["projects"]:
                out.write(f"{row['id']}  {row['name']}\n")
    elif args.command == "environments":
        if args.environments_command == "create":
            answer = c.create_environment(args.name)
            if not args.json:
                out.write(f"environment {answer['name']!r}: {answer['id']}\n")
        else:
            answer = c.list_environments()
            if not args.json:
                for env in answer["environments"]:
                    out.write(f"{env['id']}  {env['name']}\n")
    elif args.keys_command == "create":
        answer = c.create_key(args.name, role=args.role, environment=args.environment)
        if not args.json:
            out.write(
                f"API key {answer['name']!r} ({answer['role']}) for {answer['environment']}"
                " (shown once):\n"
            )
            out.write(answer["key"] + "\n")
    elif args.keys_command == "list":
        answer = c.list_keys()
        if not args.json:
            for row in answer["keys"]:
                if args.environment is None or row["environment"] == args.environment:
                    out.write(
                        f"{row['id']}  {row['environment']:<12} {row['role']:<6} "
                        f"{row['prefix']}…  {row['name']}\n"
                    )
    else:
        c.revoke_key(args.id)
        answer = {"revoked": args.id}
        if not args.json:
            out.write(f"revoked key {args.id}\n")
    if args.json:
        output.as_json(answer, out)
    return 0
