"""Apps (where workflows are hosted) and the workflows they registered at sync."""

from __future__ import annotations

import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from stepline.protocol import PROTOCOL_VERSION
from stepline_server.engine.events import EventType
from stepline_server.store import db, runs
from stepline_server.store.db import Conn, Q, Record

_UNIQUE_NAME = "apps_project_id_name_key"  # UNIQUE (project_id, name) in schema.sql


class NameTaken(Exception):
    """Another app of the project already has that name."""


class WorkflowsTaken(Exception):
    """Workflows a sync would register are other apps' (``held``: each with its ``name`` and
    that app's ``app_slug`` and ``app_name``); nothing was recorded."""

    def __init__(self, held: list[Record]) -> None:
        self.held = held
        which = "; ".join(
            f"workflow {r['name']!r} is hosted by app {r['app_name']!r} ({r['app_slug']})"
            for r in held
        )
        super().__init__(
            f"{which}: nothing was synced; sync with takeOver=true to move it to this app"
        )


@dataclass(frozen=True)
class Recorded:
    """What a sync recorded: the app after it, and the workflows it took from other apps
    (each with its ``name`` and the ``app_slug`` and ``app_name`` it was taken from)."""

    app: Record
    moved: list[Record]


def new_slug() -> str:
    """A fresh public slug for an app."""
    return "wfa_" + secrets.token_hex(10)


async def create(
    conn: Conn,
    project_id: uuid.UUID,
    name: str,
    url: str | None,
    secret: str | None = None,
    *,
    kind: str = "push",
) -> Record | None:
    """Register an app (a push app with its ``url``; a ``pull`` app with none); None when the
    project already has one with that name."""
    signing = secret or new_secret()
    return await conn.fetchrow(
        Q["insert_app"],
        uuid.uuid4(),
        project_id,
        new_slug(),
        name,
        url,
        [signing],
        kind,
        uuid.uuid4(),
    )


def new_secret() -> str:
    """A fresh signing secret for an app."""
    return "whsec_" + secrets.token_urlsafe(32)


async def rotate_secret(conn: Conn, project_id: uuid.UUID, app_id: uuid.UUID) -> Record | None:
    """Give the app a new signing secret (it signs from now on); None when there is no app."""
    return await conn.fetchrow(Q["rotate_app_secret"], project_id, app_id, new_secret())


async def get(conn: Conn, project_id: uuid.UUID, id_or_slug: str) -> Record | None:
    """The app with this id or slug, else the one with this name."""
    row = await conn.fetchrow(Q["get_app"], project_id, id_or_slug)
    if row is None:
        row = await conn.fetchrow(Q["get_app_by_name"], project_id, id_or_slug)
    return row


async def get_by_name(conn: Conn, project_id: uuid.UUID, name: str) -> Record | None:
    return await conn.fetchrow(Q["get_app_by_name"], project_id, name)


async def page(
    conn: Conn, project_id: uuid.UUID, after: tuple[datetime, uuid.UUID] | None, limit: int
) -> list[Record]:
    at, ident = after if after else (None, None)
    return list(await conn.fetch(Q["list_apps"], project_id, at, ident, limit))


async def update(
    conn: Conn, project_id: uuid.UUID, app_id: uuid.UUID, url: str | None, name: str | None
) -> Record | None:
    """Change an app's URL and/or name (None keeps it); None when there is no such app.

    Raises :class:`NameTaken` when another app of the project has ``name``.
    """
    try:
        return await conn.fetchrow(Q["update_app"], project_id, app_id, url, name)
    except asyncpg.UniqueViolationError as exc:
        if db.constraint_name(exc) == _UNIQUE_NAME:
            raise NameTaken(f"the project already has an app named {name!r}") from None
        raise


async def delete(conn: Conn, project_id: uuid.UUID, app_id: uuid.UUID) -> None:
    """Delete the app with its workflows and runs, its runs (and their parents) locked in id
    order first. A run of another app waiting for a child run of this one has that invoke step
    failed (``child_deleted``) and wakes: it never waits for a child that is gone."""
    async with conn.transaction():
        await conn.execute(Q["citus_sequential_writes"])
        await conn.execute(Q["lock_app_runs"], project_id, app_id)
        error = {
            "type": "ChildWorkflowFailed",
            "code": "child_deleted",
            "message": "the child run was deleted with its app",
        }
        orphaned = await conn.fetch(Q["fail_orphaned_parents"], project_id, app_id, error)
        for row in orphaned:
            data = {"kind": "invoke", "childRunId": str(row["child_id"]), "error": error}
            event = {"type": EventType.STEP_FAILED, "step_name": row["name"], "data": data}
            await runs.wake(conn, row["run_id"], [event], notify=False)
        await conn.execute(Q["delete_app"], project_id, app_id)
        if orphaned:
            await conn.execute(Q["notify_wake"])


async def record_sync(
    conn: Conn,
    app: Record,
    workflows: list[tuple[str, dict[str, Any]]],
    deployment_id: str | None,
    *,
    protocol_version: int = PROTOCOL_VERSION,
    sdk_version: str | None = None,
    take_over: bool = False,
) -> Recorded:
    """Store what a sync found: the app's workflows, its deployment id and the protocol
    version and SDK version it declared (invocations use only that version's features). A sync that
    changes the app's workflows (names, options, schemas) makes the environment's next
    definitions version, which they then carry (and the runs started under them).

    A workflow another app registered is moved to this one only with ``take_over`` (runs
    already started stay with the app they were started on); otherwise
    :class:`WorkflowsTaken` names them and nothing is recorded."""
    env = app["project_id"]
    names = [name for name, _ in workflows]
    async with conn.transaction():
        await conn.execute(Q["lock_app_sync"], env)
        held = list(await conn.fetch(Q["workflows_held_elsewhere"], env, app["id"], names))
        if held and not take_over:
            raise WorkflowsTaken(held)
        stored = {
            r["name"]: r["options"] for r in await conn.fetch(Q["app_definitions"], env, app["id"])
        }
        version = None
        if stored != dict(workflows):
            version = await conn.fetchval(Q["next_definitions_version"], env)
        for name, options in workflows:
            upsert = Q["upsert_workflow"]
            if await conn.fetchval(upsert, env, name, app["id"], options, version, take_over):
                continue
            # Another app's sync registered it since (it committed after the check above).
            raise WorkflowsTaken(
                list(await conn.fetch(Q["workflows_held_elsewhere"], env, app["id"], names))
            )
        row = await conn.fetchrow(
            Q["app_synced"], app["id"], deployment_id, protocol_version, sdk_version
        )
    assert row is not None
    return Recorded(row, held)


async def workflows_page(
    conn: Conn, project_id: uuid.UUID, after: str | None, limit: int
) -> list[Record]:
    return list(await conn.fetch(Q["list_workflows"], project_id, after, limit))


async def workflow(conn: Conn, project_id: uuid.UUID, name: str) -> Record | None:
    return await conn.fetchrow(Q["get_workflow"], project_id, name)


async def answered_with(
    conn: Conn, app_id: uuid.UUID, deployment_id: str, run_id: uuid.UUID
) -> None:
    """Record that the app answered an invocation of ``run_id`` as ``deployment_id``: only its
    current deployment's answer is what its next invocations expect."""
    async with conn.transaction():
        if not await conn.fetchval(Q["run_on_former_deployment"], run_id):
            await conn.execute(Q["app_answered_with"], app_id, deployment_id)
