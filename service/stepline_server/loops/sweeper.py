"""The sweeper: deletes what is kept only for a while (events after a day, ended runs after
``STEPLINE_RETENTION_DAYS``)."""

from __future__ import annotations

import asyncio

import structlog

from stepline_server.store import waits
from stepline_server.store.db import Pool

log = structlog.get_logger("stepline.sweeper")

EVENT_RETENTION_SECONDS = 86_400.0


async def sweep_once(pool: Pool, retention_days: float) -> tuple[int, int]:
    """Delete old events and, in batches, runs ended longer ago than the retention."""
    async with pool.acquire() as conn:
        events = await waits.delete_old_events(conn, EVENT_RETENTION_SECONDS)
        runs = 0
        if retention_days > 0:
            while (batch := await waits.delete_old_runs(conn, retention_days * 86_400)) > 0:
                runs += batch
    if events or runs:
        log.info("swept", events=events, runs=runs)
    return events, runs


async def sweep(pool: Pool, retention_days: float, *, interval: float = 60.0) -> None:
    """Every ``interval`` seconds, sweep (0 days of retention keeps runs for ever)."""
    while True:
        await sweep_once(pool, retention_days)
        await asyncio.sleep(interval)
