"""The sweeper: deletes what is kept only for a while (events past their day)."""

from __future__ import annotations

import asyncio

import structlog

from stepline_server.store import waits
from stepline_server.store.db import Pool

log = structlog.get_logger("stepline.sweeper")

EVENT_RETENTION_SECONDS = 86_400.0


async def sweep(pool: Pool, *, interval: float = 60.0) -> None:
    """Every ``interval`` seconds, delete events older than a day."""
    while True:
        async with pool.acquire() as conn:
            deleted = await waits.delete_old_events(conn, EVENT_RETENTION_SECONDS)
        if deleted:
            log.info("events_deleted", count=deleted)
        await asyncio.sleep(interval)
