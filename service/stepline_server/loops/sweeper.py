"""The sweeper: deletes what is kept only for a while, in batches (events after a day; ended
runs, schedule ticks and the old history of long-lived runs after ``STEPLINE_RETENTION_DAYS``).

Every batch is its own statement (and transaction) and goes through an index, so a sweep costs
what it deletes and never holds locks long; sweepers of several orchestrators pass over each
other's rows (``SKIP LOCKED``); between batches the sweeper rests (``SWEEP_DUTY``), so a large
sweep slows the runs going on only a little.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import NamedTuple

import structlog

from stepline_server.store import waits
from stepline_server.store.db import Conn, Pool

log = structlog.get_logger("stepline.sweeper")

EVENT_RETENTION_SECONDS = 86_400.0
# Deleting a day of runs costs the database as much as a burst of work: the sweeper deletes
# during at most a quarter of its time (a day of one run a second, 86,400 runs with their steps
# and history, takes it about a minute and a half on 2 cores), leaving the rest to the runs.
SWEEP_DUTY = 0.25


class Swept(NamedTuple):
    """What one sweep deleted."""

    events: int
    runs: int
    ticks: int
    history: int


async def _batches(delete: Callable[[], Awaitable[int]], duty: float = SWEEP_DUTY) -> int:
    """Run ``delete`` until a batch deletes nothing; how many it deleted in all. After each
    batch the sweeper rests, so that it deletes during at most ``duty`` of the time."""
    total = 0
    while True:
        began = time.monotonic()
        batch = await delete()
        if batch <= 0:
            return total
        total += batch
        await asyncio.sleep(rest_after(time.monotonic() - began, duty))


def rest_after(batch_seconds: float, duty: float = SWEEP_DUTY) -> float:
    """How long to rest after a batch that took ``batch_seconds``, so that deleting takes at
    most ``duty`` (0 to 1) of the sweeper's time."""
    if duty >= 1.0:
        return 0.0
    return max(0.0, batch_seconds) * (1.0 - duty) / max(duty, 0.01)


async def sweep_once(pool: Pool, retention_days: float) -> Swept:
    """Delete old events and, when runs are not kept for ever, what is older than the
    retention: ended runs (with their steps, callbacks, history and log lines), schedule ticks,
    and the history of runs still going."""
    async with pool.acquire() as conn:
        events = await _batches(lambda: waits.delete_old_events(conn, EVENT_RETENTION_SECONDS))
        swept = Swept(events, 0, 0, 0)
        if retention_days > 0:
            swept = Swept(events, *await _retained(conn, retention_days * 86_400))
    if any(swept):
        log.info("swept", **swept._asdict())
    return swept


async def _retained(conn: Conn, seconds: float) -> tuple[int, int, int]:
    runs = await _batches(lambda: waits.delete_old_runs(conn, seconds))
    ticks = await _batches(lambda: waits.delete_old_ticks(conn, seconds))
    history = await _batches(lambda: waits.delete_old_history(conn, seconds))
    return runs, ticks, history


async def sweep(pool: Pool, retention_days: float, *, interval: float = 60.0) -> None:
    """Every ``interval`` seconds, sweep (0 days of retention keeps runs for ever)."""
    while True:
        await sweep_once(pool, retention_days)
        await asyncio.sleep(interval)
