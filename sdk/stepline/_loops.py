"""What belongs to an event loop, and letting it go once that loop is closed.

Some hosts run each request on a fresh event loop and close it once the request is answered
(serverless runtimes, some ASGI adapters). Pooled connections and parked executions are bound
to the loop they were made on, so the SDK keeps them per loop and, meeting a new loop, lets go
of those of loops that are closed. A closed loop runs nothing any more, not even the callbacks
that would end what it left, so that is done here without it: sockets closed, tasks' coroutines
closed and their tasks not reported as destroyed while pending.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any

__all__ = ["release_tasks", "release_transport", "running"]


def running() -> asyncio.AbstractEventLoop | None:
    """The event loop running in this thread, if any."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def release_transport(transport: asyncio.BaseTransport) -> None:
    """Close ``transport``, whose loop is closed: abort it, then run the callback that closes
    its socket, which the loop can no longer run (asyncio's own transports; any other is
    closed when collected)."""
    with contextlib.suppress(RuntimeError):  # it is marked closing before the loop refuses
        transport.abort()  # type: ignore[attr-defined]
    inner: Any = getattr(getattr(transport, "_ssl_protocol", None), "_transport", transport)
    lost = getattr(inner, "_call_connection_lost", None)
    if lost is not None and getattr(inner, "_sock", None) is not None:
        with contextlib.suppress(RuntimeError):  # the protocol's own callbacks cannot be run
            lost(None)


def release_tasks(tasks: Iterable[asyncio.Future[Any] | None]) -> None:
    """Let go of ``tasks``, whose loop is closed: they can never run again, so their
    coroutines are closed now (their ``finally`` blocks run) rather than when collected, and
    they are not reported as destroyed while pending (as ``run_until_complete`` does)."""
    for task in tasks:
        if task is None or task.done() or not isinstance(task, asyncio.Task):
            continue
        task._log_destroy_pending = False  # type: ignore[attr-defined]
        with contextlib.suppress(Exception):
            task.get_coro().close()
