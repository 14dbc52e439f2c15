"""How long a loop waits before trying again after the database (or an app) failed it."""

from __future__ import annotations

import asyncio


class Backoff:
    """Doubling pauses from ``first`` up to ``cap`` seconds; ``reset`` after a success."""

    def __init__(self, first: float = 0.05, cap: float = 1.0) -> None:
        self.first = first
        self.cap = cap
        self.failures = 0

    def next_delay(self) -> float:
        """The pause the next :meth:`wait` takes."""
        return min(self.cap, self.first * 2.0**self.failures)

    async def wait(self) -> None:
        """Pause, and make the next pause longer."""
        delay = self.next_delay()
        self.failures += 1
        await asyncio.sleep(delay)

    def reset(self) -> None:
        self.failures = 0
