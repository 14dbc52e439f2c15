"""Long polls waiting for runs to end, woken by the ``stepline_ended`` notification."""

from __future__ import annotations

import asyncio
from collections import defaultdict


class RunWaiters:
    """Callers waiting for a run to end, by run id."""

    def __init__(self) -> None:
        self._waiting: dict[str, set[asyncio.Event]] = defaultdict(set)

    def ended(self, run_id: str) -> None:
        for event in self._waiting.pop(run_id, ()):
            event.set()

    async def wait(self, run_id: str, timeout: float) -> None:
        """Return when ``run_id`` ends or after ``timeout`` seconds, whichever is first."""
        event = asyncio.Event()
        self._waiting[run_id].add(event)
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            pass
        finally:
            waiting = self._waiting.get(run_id)
            if waiting is not None:
                waiting.discard(event)
                if not waiting:
                    self._waiting.pop(run_id, None)
