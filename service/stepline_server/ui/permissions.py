"""What the signed-in key may do: the one place the dashboard asks, by the key's role."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from stepline_server.engine import access
from stepline_server.store import keys
from stepline_server.store.db import Conn


@dataclass(frozen=True)
class Viewer:
    """Who is signed in: the stored form of their API key, the environment it sees (the scope
    of every read and action, kept as ``project_id`` like the store's columns) and its role."""

    key_hash: str
    project_id: uuid.UUID
    role: str = "read"
    environment: str = ""
    project: str = ""


async def viewer_of(conn: Conn, key_hash: str) -> Viewer | None:
    """The viewer a session's key names, or None once the key is no longer valid (revoked)."""
    row = await keys.find_key_hash(conn, key_hash)
    if row is None:
        return None
    return Viewer(key_hash, row["environment_id"], row["role"], row["environment"], row["project"])


def can_write(viewer: Viewer) -> bool:
    """May this key change anything (cancel, retry, complete, sync, pause, send)? Not a
    ``read`` key: its buttons are not shown and its posts are refused."""
    return access.allows(viewer.role, "write")


def is_admin(viewer: Viewer) -> bool:
    """May this key manage keys? Only ``admin``."""
    return access.allows(viewer.role, "admin")
