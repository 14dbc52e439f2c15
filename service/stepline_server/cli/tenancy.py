"""``stepline projects``, ``environments`` and ``keys`` on the database, beside a running
orchestrator (which they never stop), so the first keys can be made (their arguments:
:mod:`stepline.cli.tenancy`, which also runs them over REST)."""

from __future__ import annotations

import argparse
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from stepline_server.cli.runtime import database
from stepline_server.settings import Settings
from stepline_server.store import db, keys
from stepline_server.store.db import Conn, Record
from stepline_server.store.migrate import apply_migrations


class UsageError(Exception):
    """A project, environment or key named on the command line does not exist."""


@asynccontextmanager
async def _connection(settings: Settings) -> AsyncIterator[Conn]:
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
        env = await _environment(conn, project, args.environment or "production")
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


DEV_KEY_FILE = "dev-key"
"""Where ``stepline dev`` keeps its admin key, in the data folder (readable by its owner only)."""


async def dev_key(conn: Conn, data_dir: Path) -> str:
    """The owner key ``stepline dev`` prints: the one it made before, while that key is still
    active on this database, else a new one (named "dev"), remembered for the next start."""
    path = data_dir / DEV_KEY_FILE
    try:
        kept = path.read_text().strip()
    except OSError:
        kept = ""
    row = await keys.find_key(conn, kept) if kept else None
    if (
        row is not None
        and row["role"] == "owner"
        and row["environment_id"] == keys.DEFAULT_ENVIRONMENT
    ):
        return kept
    key = await keys.create_key(conn, "dev", role="owner")
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    return key
