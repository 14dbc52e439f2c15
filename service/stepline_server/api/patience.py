"""A write tried again, with the same ids, while the database is away.

When the connection drops during a write (the primary killed, a failover under way) the
orchestrator cannot tell whether it was committed. It does not guess: it tries the same write
again, with the ids it chose the first time (a run's id, an event's id, a callback's id, a
progress call's seq and digest), until a primary answers or its patience runs out (then the
caller gets ``503 unavailable`` and may send the request again). Each write then either finds
what the first try kept and answers as that try would have, or does it now: recorded once,
never reported as refused when it was kept.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import structlog

from stepline_server.loops.backoff import Backoff
from stepline_server.store import db

log = structlog.get_logger("stepline.api")

T = TypeVar("T")

DATABASE_PATIENCE_SECONDS = 10.0
"""How long a write waits for the database before answering 503 (a restart takes a few
seconds; a promotion, under a managed service or pg_auto_failover, a few more)."""


async def patiently(write: Callable[[bool], Awaitable[T]], what: str) -> T:
    """``write(again)``'s answer: ``again`` is True once a try's outcome is unknown (the
    database went away under it), so that the write first looks for what that try kept."""
    pause = Backoff(cap=0.5)
    give_up = time.monotonic() + DATABASE_PATIENCE_SECONDS
    again = False
    while True:
        try:
            return await write(again)
        except db.UNAVAILABLE as exc:
            if time.monotonic() > give_up:
                raise
            if pause.failures == 0:
                log.warning("write_waits_for_database", write=what, error=str(exc))
            again = True
            await pause.wait()
