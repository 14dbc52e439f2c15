"""The events an environment received (``events``, kept a day), with the runs they touched."""

from __future__ import annotations

import uuid

from stepline_server.store.db import Conn, Q, Record


async def recent(conn: Conn, project_id: uuid.UUID, limit: int) -> list[Record]:
    """The newest ``limit`` events received, newest first, with their ``answer``."""
    return list(await conn.fetch(Q["received_events"], project_id, limit))


async def runs_named(conn: Conn, project_id: uuid.UUID, ids: list[uuid.UUID]) -> list[Record]:
    """``id, workflow, status`` of each of these runs that still exists."""
    if not ids:
        return []
    return list(await conn.fetch(Q["event_runs"], project_id, ids))
