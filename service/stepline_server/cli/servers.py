"""uvicorn servers that stop cleanly on Ctrl-C or SIGTERM, so the embedded PostgreSQL stops too.

uvicorn's own signal handling re-raises the signal once it has shut down, which kills the
process before the code around it can clean up; these servers leave signals to
:func:`stop_on_signals`, which asks every server to exit and lets the caller finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn

KEEP_ALIVE_SECONDS = 75  # as nginx: longer than clients keep an idle connection


class Server(uvicorn.Server):
    """A uvicorn server that installs no signal handlers of its own."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Tell the app first (the orchestrator ends its long polls), then shut down: a
        request still waiting would hold the exit up until it ended."""
        hook = getattr(self.config.app, "on_shutdown", None)
        if callable(hook):
            hook()
        await super().shutdown(sockets)


def server(app: Any, host: str, port: int, *, log_level: str = "warning") -> Server:
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        loop="none",
        http="httptools",
        access_log=False,
        proxy_headers=False,
        log_config=None,  # uvicorn's records go through stepline's logging (logs.py)
        # An idle keep-alive connection is closed by the client, not by us: closed here after
        # uvicorn's 5 s (httpx's own idle limit too), a request the client sends on it at that
        # moment gets no answer at all.
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
    )
    return Server(config)


def stop_on_signals(*servers: uvicorn.Server) -> None:
    """On SIGINT or SIGTERM, ask every server to finish what it is doing and exit."""
    loop = asyncio.get_running_loop()

    def stop() -> None:
        for s in servers:
            s.should_exit = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)


def tune_gc() -> None:
    """Collect garbage less often: a server allocates many short-lived objects per request, and
    the default thresholds spend several percent of its CPU in young-generation collections.
    What was loaded at start (modules, the app) is frozen out of every collection."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 50)


def port_in_use(host: str, port: int) -> bool:
    """Whether something already listens on ``host:port`` (so binding it would fail)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def busy_port_message(host: str, port: int) -> str:
    return (
        f"stepline: {host}:{port} is already in use; stop what listens there or choose another"
        " port with --port (or STEPLINE_PORT)"
    )
