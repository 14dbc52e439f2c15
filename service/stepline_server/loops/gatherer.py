"""The gatherer: fires the debounces and batches whose time has come.

A run gathering starts has no due time, so no dispatcher takes it; every ``interval`` the
gatherer fires the gatherings due (each claimed with ``FOR UPDATE SKIP LOCKED``, so the
gatherers of several orchestrators never fire one twice), which makes their runs due now and
wakes every dispatcher: from there each is invoked like any other run. A batch that fills is
fired by the start that filled it, not here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from stepline_server.metrics import Metrics
from stepline_server.store import gatherings
from stepline_server.store.db import Pool

log = structlog.get_logger("stepline.gatherer")

GATHER_SECONDS = 0.25  # how late a gathering fires at most, when the database keeps up
FIRE_BATCH = 100


async def fire_once(
    pool: Pool, metrics: Metrics, on_fired: Callable[[], None] | None = None
) -> list[gatherings.Fired]:
    """Fire every gathering due now, ``FIRE_BATCH`` a statement; the ones fired."""
    fired: list[gatherings.Fired] = []
    async with pool.acquire() as conn:
        while True:
            batch = await gatherings.fire_due(conn, FIRE_BATCH)
            fired.extend(batch)
            if len(batch) < FIRE_BATCH:
                break
    for f in fired:
        metrics.gathering_fired(f.workflow, f.kind, f.starts)
        log.info("gathering_fired", run_id=str(f.run_id), workflow=f.workflow, kind=f.kind,
                 starts=f.starts)  # fmt: skip
    if fired and on_fired is not None:
        on_fired()
    return fired


async def fire_forever(
    pool: Pool,
    metrics: Metrics,
    on_fired: Callable[[], None] | None = None,
    interval: float = GATHER_SECONDS,
) -> None:
    """Fire what is due every ``interval`` seconds, forever (the supervisor restarts it after
    a fault)."""
    while True:
        await fire_once(pool, metrics, on_fired)
        await asyncio.sleep(interval)
