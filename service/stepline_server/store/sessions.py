"""The dashboard's sessions, kept in the database: the browser's cookie holds a random id and
the row (found by that id's SHA-256) says which API key signed in. Signing out deletes the
row; revoking the key deletes its rows (``revoke_key``), so neither a copied cookie nor a
revoked key's session works again."""

from __future__ import annotations

import hashlib
import secrets
import uuid
from datetime import UTC, datetime, timedelta

from stepline_server.store.db import Conn, Q, Record

LIFETIME = timedelta(hours=12)
"""A session ends this long after its last request."""
_EXTEND_EVERY = timedelta(minutes=1)


def _hash(session_id: str) -> str:
    return hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()


async def start(conn: Conn, key_id: uuid.UUID) -> str:
    """A new session for the key; answers its id (for the cookie; only its hash is kept)."""
    session_id = secrets.token_urlsafe(32)
    await conn.execute(Q["delete_expired_sessions"])
    await conn.execute(Q["insert_session"], _hash(session_id), key_id, _now() + LIFETIME)
    return session_id


async def viewer(conn: Conn, session_id: str) -> Record | None:
    """The signed-in key's context (key_id, role, environment_id, environment, project_id,
    project), or None when the session is unknown, expired, ended or its key revoked; a
    session in use is extended."""
    digest = _hash(session_id)
    row = await conn.fetchrow(Q["session_viewer"], digest)
    if row is not None and row["expires_at"] < _now() + LIFETIME - _EXTEND_EVERY:
        await conn.execute(Q["extend_session"], digest, _now() + LIFETIME)
    return row


async def end(conn: Conn, session_id: str) -> None:
    """Sign out: the session is gone for every orchestrator."""
    await conn.execute(Q["delete_session"], _hash(session_id))


def _now() -> datetime:
    return datetime.now(UTC)
