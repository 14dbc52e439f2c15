"""Pull apps' workers' long polls waiting in this process, woken when work may have come due."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import defaultdict
from collections.abc import Iterator


class Pollers:
    """Events of the polls waiting for work, by app id. A wake-up names no app (a NOTIFY
    carries none), so :meth:`wake_all` has every waiting poll look again."""

    def __init__(self) -> None:
        self._waiting: dict[uuid.UUID, set[asyncio.Event]] = defaultdict(set)

    def wake(self, app_id: uuid.UUID) -> None:
        """Have the polls of one app look again."""
        for event in self._waiting.get(app_id, ()):
            event.set()

    def wake_all(self) -> None:
        """Have every waiting poll look again."""
        for events in self._waiting.values():
            for event in events:
                event.set()

    @property
    def waiting(self) -> int:
        """Polls waiting now."""
        return sum(len(events) for events in self._waiting.values())

    @contextlib.contextmanager
    def watch(self, app_id: uuid.UUID) -> Iterator[asyncio.Event]:
        """An event set at the next wake-up of ``app_id``'s polls. Watch before claiming: a
        wake-up that comes while the claim runs is then never missed."""
        event = asyncio.Event()
        self._waiting[app_id].add(event)
        try:
            yield event
        finally:
            waiting = self._waiting.get(app_id)
            if waiting is not None:
                waiting.discard(event)
                if not waiting:
                    self._waiting.pop(app_id, None)
