"""What the signed-in key may do: the one place the dashboard asks, by the key's role."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from stepline_server.engine import access
from stepline_server.store import sessions
from stepline_server.store.db import Conn


@dataclass(frozen=True)
class Viewer:
    """Who is signed in: their API key's id, the environment it sees (the scope of every read
    and action, kept as ``project_id`` like the store's columns), its role and project."""

    key_id: uuid.UUID
    project_id: uuid.UUID
    role: str = "read"
    environment: str = ""
    project: str = ""
    project_uuid: uuid.UUID | None = None


async def viewer_of(conn: Conn, session_id: str) -> Viewer | None:
    """Who the server-side session ``session_id`` signed in as, or None once it ended (signed
    out, expired, or its key revoked)."""
    row = await sessions.viewer(conn, session_id)
    if row is None:
        return None
    return Viewer(
        row["key_id"],
        row["environment_id"],
        row["role"],
        row["environment"],
        row["project"],
        row["project_id"],
    )


def can_write(viewer: Viewer) -> bool:
    """May this key change anything (cancel, retry, complete, sync, pause, send)? Not a
    ``read`` key: its buttons are not shown and its posts are refused."""
    return access.allows(viewer.role, "write")


def is_admin(viewer: Viewer) -> bool:
    """May this key manage keys? ``admin`` (its environment's) and ``owner`` (every
    environment's)."""
    return access.allows(viewer.role, "admin")


def is_owner(viewer: Viewer) -> bool:
    """May this key manage the keys of every environment of its project? Only ``owner``."""
    return access.manages_project(viewer.role)
