"""Runs the background loops as named tasks and restarts any that crash."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

log = structlog.get_logger("stepline.supervisor")

LoopFactory = Callable[[], Awaitable[None]]


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
        while True:
            try:
                await factory()
                log.warning("loop_returned", loop=name)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("loop_crashed", loop=name)
            await asyncio.sleep(self._restart_delay)

    async def stop(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        self._tasks.clear()
