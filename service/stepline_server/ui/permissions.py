"""What the signed-in key may do: the one place the dashboard asks, so roles plug in here."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from stepline_server.store import keys
from stepline_server.store.db import Conn


@dataclass(frozen=True)
class Viewer:
    """Who is signed in: the stored form of their API key and the project it belongs to."""

    key_hash: str
    project_id: uuid.UUID


async def viewer_of(conn: Conn, key_hash: str) -> Viewer | None:
    """The viewer a session's key names, or None once the key is no longer valid."""
    project = await keys.project_of_key_hash(conn, key_hash)
    return None if project is None else Viewer(key_hash, project)


def can_write(viewer: Viewer) -> bool:
    """May this key change anything (cancel, retry, complete, sync, pause, send)? Today every
    key may; with roles, a ``read`` key may not (answer its role here)."""
    return True


def is_admin(viewer: Viewer) -> bool:
    """May this key manage keys? Today every key may; with roles, only ``admin``."""
    return True
