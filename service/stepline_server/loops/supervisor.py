"""Runs the background loops as named tasks and restarts any that crash.

A loop that meets a database that is away (a restart, a failover) has not crashed: that is an
expected state. It is called again after a growing pause, with one warning per outage and no
traceback, until the database (the new primary) answers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import structlog

from stepline_server.loops.backoff import Backoff
from stepline_server.store import db

log = structlog.get_logger("stepline.supervisor")

LoopFactory = Callable[[], Awaitable[None]]

OUTAGE_OVER_SECONDS = 10.0
"""A loop that ran this long before the database failed it again meets a new outage."""


class Supervisor:
    """Owns the loops: start them, restart them after a crash, stop them all."""

    def __init__(self, restart_delay: float = 1.0) -> None:
        self._loops: dict[str, LoopFactory] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._restart_delay = restart_delay

    def add(self, name: str, factory: LoopFactory) -> None:
        self._loops[name] = factory

    def start(self) -> None:
        for name, factory in self._loops.items():
            self._tasks[name] = asyncio.create_task(self._keep(name, factory), name=name)

    async def _keep(self, name: str, factory: LoopFactory) -> None:
        away = Backoff(cap=self._restart_delay)
        while True:
            began = time.monotonic()
            try:
                await factory()
                log.warning("loop_returned", loop=name)
            except asyncio.CancelledError:
                raise
            except db.UNAVAILABLE as exc:
                if time.monotonic() - began > OUTAGE_OVER_SECONDS:
                    away.reset()
                if away.failures == 0:
                    log.warning("loop_waits_for_database", loop=name, error=str(exc))
                await away.wait()
                continue
            except Exception:
                log.exception("loop_crashed", loop=name)
            await asyncio.sleep(self._restart_delay)

    async def stop(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        self._tasks.clear()
