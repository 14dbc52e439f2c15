"""The scheduler loop: fires the due ticks of cron schedules, one transaction per schedule.

Several orchestrators may run it at once: a schedule being fired is row-locked and passed over
by the others (``SKIP LOCKED``), and a tick's record and run id make it start at most once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import structlog

from stepline_server.metrics import Metrics
from stepline_server.settings import Settings
from stepline_server.store import db, schedules

log = structlog.get_logger("stepline.scheduler")

MISFIRE_CAP = 100
"""At most this many missed ticks start runs under ``fire_all`` (and are listed as skipped)."""


class Scheduler:
    """Turns due schedule ticks into runs; ``tick(now)`` is one pass with an explicit clock."""

    def __init__(
        self,
        pool: db.Pool,
        settings: Settings,
        *,
        on_started: Callable[[], None] | None = None,
        cap: int = MISFIRE_CAP,
        metrics: Metrics | None = None,
    ) -> None:
        self._metrics = metrics or Metrics()
        self._pool = pool
        self._poll = settings.scheduler_poll_seconds
        self._grace = timedelta(seconds=settings.misfire_grace_seconds)
        self._cap = cap
        self._on_started = on_started
        self._wakeup = asyncio.Event()

    def wake(self) -> None:
        """Look at the schedules now (one was created or changed)."""
        self._wakeup.set()

    async def tick(self, now: datetime) -> int:
        """Fire every tick due at ``now``; return how many runs started."""
        started = 0
        failed: list[str] = []  # passed over for the rest of this pass, so others still fire
        while True:
            try:
                async with self._pool.acquire() as conn:
                    fired = await schedules.fire_due(conn, now, self._grace, self._cap, failed)
            except schedules.TickFailed as exc:
                log.exception("schedule_tick_failed", schedule_id=exc.schedule_id)
                failed.append(exc.schedule_id)
                continue
            if fired is None:
                break
            _, workflow, ticks = fired
            started += len(ticks)
            self._metrics.run_started(workflow, "schedule", len(ticks))
            for at in ticks:  # from the tick to its run's start
                self._metrics.schedule_started(workflow, (now - at).total_seconds())
        if started:
            log.info("schedule_ticks_fired", runs=started)
            if self._on_started is not None:
                self._on_started()
        return started

    async def run(self) -> None:
        """Tick every ``scheduler_poll_seconds``, sooner when a tick or a wake-up comes first."""
        while True:
            self._wakeup.clear()
            await self.tick(datetime.now(UTC))
            async with self._pool.acquire() as conn:
                soonest = await schedules.next_fire_at(conn)
            delay = self._poll
            if soonest is not None:
                delay = min(delay, max(0.0, (soonest - datetime.now(UTC)).total_seconds()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), delay)
