"""``stepline projects``, ``environments`` and ``keys``: straight on the database, beside a
running orchestrator (which they never stop), so the first keys can be made."""

from __future__ import annotations

import argparse
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from stepline_server.settings import Settings
from stepline_server.store import db, keys
from stepline_server.store.db import Conn, Record
from stepline_server.store.migrate import apply_migrations


class UsageError(Exception):
    """A project, environment or key named on the command line does not exist."""


@asynccontextmanager
async def _connection(settings: Settings) -> AsyncIterator[Conn]:
    from stepline_server.cli.main import database

    async with database(settings) as (dsn, _):
        conn = await db.connect(dsn)
        try:
            await apply_migrations(conn)
            await keys.bootstrap(conn)
            yield conn
        finally:
            await conn.close()


async def _project(conn: Conn, name: str | None) -> Record:
    row = (
        await keys.get_project(conn, keys.DEFAULT_PROJECT)
        if name is None
        else await keys.find_project(conn, name)
    )
    if row is None:
        raise UsageError(f"no project named {name!r}")
    return row


async def _environment(conn: Conn, project: Record, name: str) -> Record:
    row = await keys.find_environment(conn, project["id"], name)
    if row is None:
        raise UsageError(f"project {project['name']!r} has no environment named {name!r}")
    return row


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``projects``, ``environments`` and ``keys`` subcommands."""
    projects = sub.add_parser("projects", help="projects").add_subparsers(
        dest="projects_command", required=True
    )
    create = projects.add_parser("create", help="make a project; prints an owner key for it")
    create.add_argument("name")
    projects.add_parser("list", help="list the projects")

    envs = sub.add_parser("environments", help="environments of a project").add_subparsers(
        dest="environments_command", required=True
    )
    for name in ("create", "list"):
        cmd = envs.add_parser(name, help=f"{name} environments")
        if name == "create":
            cmd.add_argument("name")
        cmd.add_argument("--project", help="the project [the default project]")

    keys_cmd = sub.add_parser("keys", help="API keys").add_subparsers(
        dest="keys_command", required=True
    )
    create = keys_cmd.add_parser("create", help="make an API key; the key is the last line")
    create.add_argument("--name", default="cli", help="a name to remember the key by")
    create.add_argument("--project", help="the project [the default project]")
    create.add_argument("--environment", default="production", help="[production]")
    create.add_argument("--role", choices=keys.ROLES, default="admin", help="[admin]")
    listing = keys_cmd.add_parser("list", help="list the active keys of a project")
    listing.add_argument("--project", help="the project [the default project]")
    listing.add_argument("--environment", help="only this environment's keys")
    revoke = keys_cmd.add_parser("revoke", help="revoke a key by its id")
    revoke.add_argument("id")


async def run(settings: Settings, args: argparse.Namespace) -> None:
    """Carry out a ``projects``, ``environments`` or ``keys`` command."""
    async with _connection(settings) as conn:
        if args.command == "projects":
            await _projects(conn, args)
        elif args.command == "environments":
            await _environments(conn, args)
        else:
            await _keys(conn, args)


async def _projects(conn: Conn, args: argparse.Namespace) -> None:
    if args.projects_command == "list":
        for row in await keys.projects(conn):
            print(f"{row['id']}  {row['name']}")
        return
    project = await keys.create_project(conn, args.name)
    if project is None:
        raise UsageError(f"a project named {args.name!r} exists already")
    env = await _environment(conn, project, "production")
    _, key = await keys.insert_key(conn, "owner", env["id"], "owner")
    print(f"project {args.name!r} ({project['id']}): environments {', '.join(keys.ENVIRONMENTS)}")
    print("owner API key (every environment; it sees production) (shown once):")
    print(key)


async def _environments(conn: Conn, args: argparse.Namespace) -> None:
    project = await _project(conn, args.project)
    if args.environments_command == "create":
        row = await keys.create_environment(conn, project["id"], args.name)
        if row is None:
            raise UsageError(f"project {project['name']!r} has an environment {args.name!r}")
        print(f"environment {args.name!r} of project {project['name']!r}: {row['id']}")
        return
    for env in await keys.environments(conn, project["id"]):
        print(f"{env['id']}  {env['name']}")


async def _keys(conn: Conn, args: argparse.Namespace) -> None:
    if args.keys_command == "create":
        project = await _project(conn, args.project)
        env = await _environment(conn, project, args.environment)
        _, key = await keys.insert_key(conn, args.name, env["id"], args.role)
        print(
            f"API key {args.name!r} ({args.role}) for {project['name']}/{env['name']} (shown once):"
        )
        print(key)
    elif args.keys_command == "list":
        project = await _project(conn, args.project)
        rows = await keys.project_keys(conn, project["id"])
        for row in rows:
            if args.environment is None or row["environment"] == args.environment:
                print(
                    f"{row['id']}  {row['environment']:<12} {row['role']:<6} "
                    f"{row['prefix']}…  {row['name']}"
                )
    else:
        try:
            key_id = uuid.UUID(args.id)
        except ValueError:
            raise UsageError(f"{args.id!r} is not a key id") from None
        if not await keys.revoke_key(conn, key_id, None):
            raise UsageError(f"no active key with id {args.id}")
        print(f"revoked key {key_id}")
