"""Long polls waiting for runs to end, woken by the ``stepline_ended`` notification."""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import Iterator


class RunWaiters:
    """Callers waiting for a run to end, by run id."""

    def __init__(self) -> None:
        self._waiting: dict[str, set[asyncio.Event]] = defaultdict(set)

    def ended(self, run_id: str) -> None:
        for event in self._waiting.pop(run_id, ()):
            event.set()

    def wake_all(self) -> None:
        """Have every caller look again (notifications may have been missed)."""
        waiting, self._waiting = self._waiting, defaultdict(set)
        for events in waiting.values():
            for event in events:
                event.set()

    @contextlib.contextmanager
    def watch(self, run_id: str) -> Iterator[asyncio.Event]:
        """An event set when ``run_id`` ends from now on. Watch before reading the run: an end
        committed after the read is then never missed."""
        event = asyncio.Event()
        self._waiting[run_id].add(event)
        try:
            yield event
        finally:
            waiting = self._waiting.get(run_id)
            if waiting is not None:
                waiting.discard(event)
                if not waiting:
                    self._waiting.pop(run_id, None)
