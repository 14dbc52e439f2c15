"""An app's deployments: each at its own URL, the current one where new runs start, and the
runs pinned to each (moved between them only when asked)."""

from __future__ import annotations

import uuid

from stepline_server.store import db
from stepline_server.store.db import Conn, Q, Record


class Taken(Exception):
    """Another deployment of the app already goes by that id."""


class RunsLeft(Exception):
    """The deployment still has runs not ended (``count``); it was not deleted."""

    def __init__(self, count: int) -> None:
        super().__init__(f"{count} run(s) not ended are on this deployment")
        self.count = count


class IsCurrent(Exception):
    """The current deployment of an app cannot be deleted."""


async def listed(conn: Conn, app_id: uuid.UUID) -> list[Record]:
    """The app's deployments, newest first, each with ``running_runs``."""
    return list(await conn.fetch(Q["list_deployments"], app_id))


async def get(conn: Conn, app_id: uuid.UUID, ident: str) -> Record | None:
    """The app's deployment with this id, or going by this deployment id."""
    return await conn.fetchrow(Q["get_deployment"], app_id, ident)


async def create(
    conn: Conn,
    app_id: uuid.UUID,
    url: str | None,
    deployment_id: str | None,
    *,
    given: bool = True,
) -> uuid.UUID:
    """Register a deployment of the app at ``url`` and make it the current one (the app's URL
    becomes its own); the one current until now keeps the id it went by. Raises
    :class:`Taken` when another deployment of the app goes by ``deployment_id`` and it was
    ``given`` (not what the app answered: two deploys of the same code answer the same)."""
    ident = uuid.uuid4()
    async with conn.transaction():
        await conn.execute(Q["lock_app_deployments"], app_id)
        if given and await get(conn, app_id, deployment_id or "") is not None:
            raise Taken(f"another deployment of the app goes by {deployment_id!r}")
        await conn.execute(Q["retire_current_deployment"], app_id)
        await conn.fetchval(Q["insert_deployment"], ident, app_id, deployment_id, url)
    return ident


async def delete(conn: Conn, app_id: uuid.UUID, deployment: Record, *, move: bool) -> int:
    """Delete a deployment that is not the current one; with ``move``, its runs not ended go
    to the current one first (answers how many), else :class:`RunsLeft` while it has any."""
    if deployment["current"]:
        raise IsCurrent("the current deployment cannot be deleted: register another first")
    async with conn.transaction():
        if db.on_citus(conn):
            # The runs moved one shard after another: the deployment, a reference table that
            # runs refer to, may then be deleted in the same transaction.
            await conn.execute(Q["citus_sequential_writes"])
        await conn.execute(Q["lock_app_deployments"], app_id)
        moved = 0
        if move:
            current = await conn.fetchval(Q["get_current_deployment"], app_id)
            moved = len(
                await conn.fetch(db.query(conn, "move_deployment_runs"), deployment["id"], current)
            )
        else:
            left = await conn.fetchval(Q["deployment_runs_left"], deployment["id"])
            if left:
                raise RunsLeft(int(left))
        await conn.execute(Q["delete_deployment"], deployment["id"])
    return moved


async def move_run(
    conn: Conn, project_id: uuid.UUID, run_id: uuid.UUID, deployment: uuid.UUID
) -> bool:
    """Pin a run not ended to another deployment of its app (its next invocation goes there);
    False when the run is ended or the deployment is not its app's."""
    return await conn.fetchval(Q["move_run"], run_id, project_id, deployment) is not None


async def for_worker(conn: Conn, app_id: uuid.UUID, declared: str | None) -> Record | None:
    """The deployment a pull app's worker declaring ``declared`` (None: none) polls for, with
    whether it is ``current``; None when the app has no such deployment."""
    return await conn.fetchrow(Q["pull_deployment"], app_id, declared)


async def in_environment(conn: Conn, project_id: uuid.UUID, deployment: uuid.UUID) -> bool:
    """Whether ``deployment`` is a deployment of an app of environment ``project_id``."""
    return await conn.fetchval(Q["deployment_in_environment"], project_id, deployment) is not None
