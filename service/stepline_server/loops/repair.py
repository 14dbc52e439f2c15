"""The way-forward check: every ``REPAIR_SECONDS`` the orchestrator looks for runs that are not
ended and have no live lease, no due time and no open wait something outside can complete, and
invokes each again, counting it (``stepline_runs_repaired_total``) and logging it. Every
transition is meant to leave a run a way forward, so a repair is a defect found, not routine."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from stepline_server.metrics import Metrics
from stepline_server.store import repair
from stepline_server.store.db import Pool, Record

log = structlog.get_logger("stepline.repair")

REPAIR_SECONDS = 30.0

Repaired = Callable[[list[Record]], Awaitable[None]]
"""Told of the runs a check repaired (an alert on stuck runs, say)."""


async def check_once(
    pool: Pool,
    metrics: Metrics,
    on_repaired: Repaired | None = None,
) -> list[Record]:
    """One check: the runs repaired."""
    async with pool.acquire() as conn:
        repaired = await repair.repair_stuck(conn)
    for row in repaired:
        metrics.run_repaired(row["workflow"])
        log.warning("run_repaired", run_id=str(row["id"]), workflow=row["workflow"])
    if repaired and on_repaired is not None:
        await on_repaired(repaired)
    return repaired


async def check_forever(
    pool: Pool,
    metrics: Metrics,
    on_repaired: Repaired | None = None,
    interval: float = REPAIR_SECONDS,
) -> None:
    """Check every ``interval`` seconds, forever (the supervisor restarts it after a fault)."""
    while True:
        await check_once(pool, metrics, on_repaired)
        await asyncio.sleep(interval)
