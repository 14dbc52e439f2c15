"""Projects, API keys (stored hashed) and the server's own signing secrets."""

from __future__ import annotations

import hashlib
import secrets
import uuid

from stepline_server.store.db import Conn, Q

DEFAULT_PROJECT = uuid.UUID("00000000-0000-4000-8000-000000000001")


def hash_key(key: str) -> str:
    """The stored form of an API key."""
    return hashlib.sha256(key.encode()).hexdigest()


async def bootstrap(conn: Conn) -> None:
    """Make the default project and the first callback-signing secret if they are missing."""
    await conn.execute(Q["ensure_project"], DEFAULT_PROJECT, "default")
    await conn.execute(Q["insert_server_secret"], secrets.token_urlsafe(32))


async def create_key(conn: Conn, name: str, project_id: uuid.UUID = DEFAULT_PROJECT) -> str:
    """Make an API key and return it (only its hash is kept)."""
    key = "sl_" + secrets.token_urlsafe(32)
    await conn.execute(Q["insert_key"], uuid.uuid4(), project_id, name, hash_key(key))
    return key


async def project_of_key(conn: Conn, key: str) -> uuid.UUID | None:
    """The project an API key belongs to, or None for an unknown key."""
    value = await conn.fetchval(Q["find_key"], hash_key(key))
    return value if isinstance(value, uuid.UUID) else None


async def server_secrets(conn: Conn) -> list[str]:
    """Secrets that sign callback URLs, newest first."""
    return [r["secret"] for r in await conn.fetch(Q["server_secrets"])]


async def project_of_key_hash(conn: Conn, digest: str) -> uuid.UUID | None:
    """The project of the API key whose stored form is ``digest`` (a dashboard session keeps
    that, never the key), or None when no such key is valid."""
    value = await conn.fetchval(Q["find_key"], digest)
    return value if isinstance(value, uuid.UUID) else None
