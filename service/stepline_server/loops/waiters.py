"""Long polls waiting on runs, woken by notifications: a run's end (``stepline_ended``) or
its published state (``stepline_state``), each with the run's id."""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import Iterator


class RunWaiters:
    """Callers waiting for something of a run (its end, its state), by run id."""

    def __init__(self) -> None:
        self._waiting: dict[str, set[asyncio.Event]] = defaultdict(set)

    def ended(self, run_id: str) -> None:
        """Wake the callers watching ``run_id`` (it ended, or set state: what they watch)."""
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
        """An event set when ``run_id`` is notified from now on. Watch before reading the run:
        a change committed after the read is then never missed."""
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
