"""Alerts and their outbox: the alerts of an environment, the notifications recorded for them
(one per alert, run and type), and the attempts that deliver them."""

from __future__ import annotations

import secrets
import uuid
from datetime import datetime

from stepline_server.store.db import Conn, Q, Record


def new_secret() -> str:
    """A fresh secret that signs an alert's webhook bodies."""
    return "whsec_" + secrets.token_urlsafe(32)


async def create(
    conn: Conn,
    project_id: uuid.UUID,
    name: str,
    types: list[str],
    workflow: str | None,
    destination_type: str,
    url: str,
) -> Record:
    """A new alert, with a fresh secret."""
    row = await conn.fetchrow(
        Q["insert_alert"],
        uuid.uuid4(),
        project_id,
        name,
        types,
        workflow,
        destination_type,
        url,
        new_secret(),
    )
    assert row is not None
    return row


async def page(
    conn: Conn, project_id: uuid.UUID, after: tuple[datetime, uuid.UUID] | None, limit: int
) -> list[Record]:
    at, ident = after if after else (None, None)
    return list(await conn.fetch(Q["list_alerts"], project_id, at, ident, limit))


async def get(conn: Conn, project_id: uuid.UUID, alert_id: uuid.UUID) -> Record | None:
    return await conn.fetchrow(Q["get_alert"], project_id, alert_id)


async def update(
    conn: Conn,
    project_id: uuid.UUID,
    alert_id: uuid.UUID,
    *,
    name: str | None = None,
    types: list[str] | None = None,
    set_workflow: bool = False,
    workflow: str | None = None,
    destination_type: str | None = None,
    url: str | None = None,
    secret: str | None = None,
) -> Record | None:
    """Change the fields given; None when there is no such alert."""
    return await conn.fetchrow(
        Q["update_alert"],
        project_id,
        alert_id,
        name,
        types,
        set_workflow,
        workflow,
        destination_type,
        url,
        secret,
    )


async def delete(conn: Conn, project_id: uuid.UUID, alert_id: uuid.UUID) -> bool:
    """Remove an alert and its notifications; False when there is no such alert."""
    return await conn.fetchval(Q["delete_alert"], project_id, alert_id) is not None


async def record_test(conn: Conn, project_id: uuid.UUID, alert_id: uuid.UUID) -> Record | None:
    """An ``alert.test`` notification, due now; None when there is no such alert."""
    return await conn.fetchrow(Q["insert_test_notification"], project_id, alert_id, uuid.uuid4())


async def record_run_stuck(conn: Conn, project_id: uuid.UUID, run_id: uuid.UUID) -> int:
    """Record a ``run.stuck`` notification of run ``run_id`` for each alert listening for it
    (of the run's workflow), in the caller's transaction; at most one per alert and run ever.
    Answers how many were recorded. Called by the check that finds runs without a way forward.
    """
    return len(await conn.fetch(Q["record_run_stuck"], project_id, run_id))


async def record_schedule_disabled(conn: Conn, schedule_id: str, run_id: uuid.UUID) -> int:
    """Record ``schedule.disabled`` notifications of a schedule the failure of ``run_id`` just
    disabled, in that transaction; how many."""
    return len(await conn.fetch(Q["record_schedule_disabled"], schedule_id, run_id))


async def record_sla_breaches(conn: Conn) -> int:
    """Record ``schedule.slaBreached`` notifications of the runs found late; how many."""
    return int(await conn.fetchval(Q["record_sla_breaches"]))


async def claim(conn: Conn, limit: int, lease: uuid.UUID, lease_seconds: float) -> list[Record]:
    """Take up to ``limit`` due notifications for an attempt each, under ``lease``."""
    return list(await conn.fetch(Q["claim_notifications"], limit, lease, lease_seconds))


async def record_attempt(
    conn: Conn,
    notification_id: uuid.UUID,
    lease: uuid.UUID,
    status: str,
    http_status: int | None,
    error: str | None,
    retry_in_seconds: float | None,
) -> bool:
    """Record one attempt's outcome; False when the lease was lost meanwhile."""
    attempts = await conn.fetchval(
        Q["record_attempt"],
        notification_id,
        lease,
        status,
        http_status,
        error,
        retry_in_seconds or 0.0,
    )
    return attempts is not None


async def deliveries(
    conn: Conn, alert_id: uuid.UUID, after: tuple[datetime, uuid.UUID] | None, limit: int
) -> list[Record]:
    """The alert's notifications, newest first."""
    at, ident = after if after else (None, None)
    return list(await conn.fetch(Q["list_deliveries"], alert_id, at, ident, limit))


async def delete_old(conn: Conn, days: int, batch: int = 1000) -> int:
    """Delete one batch of settled notifications older than ``days``; how many."""
    status = await conn.execute(Q["delete_old_notifications"], days, batch)
    return int(status.split()[-1])
