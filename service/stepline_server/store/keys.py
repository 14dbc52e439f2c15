"""Projects, their environments, API keys (stored hashed) and the server's signing secrets.

Every scoped table's ``project_id`` column holds an *environment* id (projects → environments
→ resources). The default project's ``production`` environment has the project's own id,
:data:`DEFAULT_PROJECT`, so rows made before environments existed stay where they were.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid

from stepline_server.store.db import Conn, Q, Record

DEFAULT_PROJECT = uuid.UUID("00000000-0000-4000-8000-000000000001")
DEFAULT_ENVIRONMENT = DEFAULT_PROJECT
"""The default project's ``production`` environment (the same id as the project)."""

ENVIRONMENTS = ("production", "staging", "development")
"""The environments a new project starts with; the first gets the project's own id."""

ROLES = ("owner", "admin", "write", "read")


def hash_key(key: str) -> str:
    """The stored form of an API key."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


async def _ensure_environments(conn: Conn, project_id: uuid.UUID) -> None:
    for name in ENVIRONMENTS:
        env_id = project_id if name == "production" else uuid.uuid4()
        await conn.execute(Q["insert_environment"], env_id, project_id, name)


async def bootstrap(conn: Conn) -> None:
    """Make the default project, its environments and the first callback-signing secret if
    they are missing: in one transaction, one orchestrator at a time."""
    async with conn.transaction():
        await conn.execute(Q["bootstrap_lock"])
        await conn.execute(Q["ensure_project"], DEFAULT_PROJECT, "default")
        await _ensure_environments(conn, DEFAULT_PROJECT)
        await conn.execute(Q["insert_server_secret"], secrets.token_urlsafe(32))


async def create_project(conn: Conn, name: str) -> Record | None:
    """A new project with its three environments, or None when the name is taken."""
    async with conn.transaction():
        row = await conn.fetchrow(Q["insert_project"], uuid.uuid4(), name)
        if row is not None:
            await _ensure_environments(conn, row["id"])
    return row


async def get_project(conn: Conn, project_id: uuid.UUID) -> Record | None:
    return await conn.fetchrow(Q["get_project"], project_id)


async def projects(conn: Conn) -> list[Record]:
    """Every project, by name (for the operator's CLI)."""
    return list(await conn.fetch(Q["list_projects"]))


async def find_project(conn: Conn, name: str) -> Record | None:
    return await conn.fetchrow(Q["find_project"], name)


async def create_environment(conn: Conn, project_id: uuid.UUID, name: str) -> Record | None:
    """A new environment of the project, or None when it has one of that name."""
    return await conn.fetchrow(Q["insert_environment"], uuid.uuid4(), project_id, name)


async def find_environment(conn: Conn, project_id: uuid.UUID, name: str) -> Record | None:
    return await conn.fetchrow(Q["find_environment"], project_id, name)


async def environments(conn: Conn, project_id: uuid.UUID) -> list[Record]:
    return list(await conn.fetch(Q["project_environments"], project_id))


async def insert_key(
    conn: Conn, name: str, environment_id: uuid.UUID, role: str = "admin"
) -> tuple[Record, str]:
    """Make an API key; answers its row and the key itself (only its hash is kept)."""
    key = "sl_" + secrets.token_urlsafe(32)
    row = await conn.fetchrow(
        Q["insert_key"], uuid.uuid4(), environment_id, name, hash_key(key), role, key[:9]
    )
    assert row is not None
    return row, key


async def create_key(
    conn: Conn, name: str, project_id: uuid.UUID = DEFAULT_ENVIRONMENT, role: str = "admin"
) -> str:
    """Make an API key for environment ``project_id`` and return it."""
    return (await insert_key(conn, name, project_id, role))[1]


async def find_key(conn: Conn, key: str) -> Record | None:
    """An active key's context (id, name, role, environment_id, environment, project_id,
    project), or None for an unknown or revoked key."""
    return await conn.fetchrow(Q["find_key"], hash_key(key))


async def environment_keys(conn: Conn, environment_id: uuid.UUID) -> list[Record]:
    """The environment's active keys, oldest first (each with ``environment``, its name)."""
    return list(await conn.fetch(Q["environment_keys"], environment_id))


async def project_keys(conn: Conn, project_id: uuid.UUID) -> list[Record]:
    """Every active key of the project's environments."""
    return list(await conn.fetch(Q["project_keys"], project_id))


async def revoke_key(
    conn: Conn,
    key_id: uuid.UUID,
    environment_id: uuid.UUID | None,
    *,
    project_id: uuid.UUID | None = None,
    protected: tuple[str, ...] = (),
) -> bool:
    """Revoke a key (of ``environment_id``, or of any when None; of ``project_id`` when
    given) unless its role is ``protected``, ending its dashboard sessions; False if there was
    no such key."""
    found = await conn.fetchval(Q["revoke_key"], key_id, environment_id, project_id, protected)
    return found is not None


async def server_secrets(conn: Conn) -> list[str]:
    """Secrets that sign callback URLs, newest first."""
    return [r["secret"] for r in await conn.fetch(Q["server_secrets"])]
