"""The events an environment received (``events``, kept a day), with the runs they touched."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from stepline_server.store.db import Conn, Q, Record


@dataclass(frozen=True)
class EventFilter:
    """What ``GET /v1/events`` searches by."""

    name: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None


async def recent(conn: Conn, project_id: uuid.UUID, limit: int) -> list[Record]:
    """The newest ``limit`` events received, newest first, with their ``answer``."""
    return list(await conn.fetch(Q["received_events"], project_id, limit))


async def page(
    conn: Conn,
    project_id: uuid.UUID,
    f: EventFilter,
    before: tuple[datetime, uuid.UUID] | None,
    limit: int,
) -> list[Record]:
    """The events received that ``f`` matches, newest first, after the keyset cursor
    ``before``."""
    at, ident = before if before else (None, None)
    return list(
        await conn.fetch(
            Q["events_page"],
            project_id,
            f.name,
            f.created_after,
            f.created_before,
            at,
            ident,
            limit,
        )
    )


async def runs_named(conn: Conn, project_id: uuid.UUID, ids: list[uuid.UUID]) -> list[Record]:
    """``id, workflow, status`` of each of these runs that still exists."""
    if not ids:
        return []
    return list(await conn.fetch(Q["event_runs"], project_id, ids))
