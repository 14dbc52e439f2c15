"""Pausing and resuming a workflow or an app (the lease transition holds their runs back)."""

from __future__ import annotations

import uuid

from stepline_server.store.db import Conn, Q, Record


async def pause_workflow(conn: Conn, project_id: uuid.UUID, name: str) -> Record | None:
    """Pause the workflow (idempotent); None when there is none of that name."""
    return await conn.fetchrow(Q["pause_workflow"], project_id, name)


async def resume_workflow(conn: Conn, project_id: uuid.UUID, name: str) -> Record | None:
    """Resume the workflow (idempotent): its waiting runs go in their usual order."""
    return await conn.fetchrow(Q["resume_workflow"], project_id, name)


async def pause_app(conn: Conn, project_id: uuid.UUID, app_id: uuid.UUID) -> Record | None:
    """Pause the app (idempotent); None when it does not exist."""
    return await conn.fetchrow(Q["pause_app"], project_id, app_id)


async def resume_app(conn: Conn, project_id: uuid.UUID, app_id: uuid.UUID) -> Record | None:
    """Resume the app (idempotent): its waiting runs go in their usual order."""
    return await conn.fetchrow(Q["resume_app"], project_id, app_id)
