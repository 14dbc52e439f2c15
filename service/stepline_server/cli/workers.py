"""``stepline serve --workers N``: N orchestrator processes sharing one listening socket.

One orchestrator is one Python process, so it orchestrates on one core at most. Several
orchestrators on one database are safe by design (leases, ``SKIP LOCKED`` claims, per-tick
keys), so a bigger machine runs several: this process binds the port, serves as the first
worker, and starts the others as child processes that inherit the socket (the kernel spreads
connections among them). A child that exits while the server is running is started again after
a second; on Ctrl-C or SIGTERM every worker finishes what it is doing and stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys

import structlog

from stepline_server import multiproc

log = structlog.get_logger("stepline.workers")

LISTEN_FD = "STEPLINE_LISTEN_FD"  # set in a worker's environment: the inherited socket


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` that child processes can inherit."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def is_child() -> bool:
    """Whether this process is a worker started by another (it serves an inherited socket)."""
    return LISTEN_FD in os.environ


def inherited() -> socket.socket | None:
    """The socket this worker was started with, when it is a child worker."""
    fd = os.environ.get(LISTEN_FD)
    return socket.socket(fileno=int(fd)) if fd else None


class Children:
    """The other workers: started, kept running, and stopped with the first."""

    def __init__(self, count: int, sock: socket.socket, database_url: str) -> None:
        self.count = count
        self.env = {
            **os.environ,
            LISTEN_FD: str(sock.fileno()),
            "DATABASE_URL": database_url,
            "STEPLINE_WORKERS": "1",
        }
        self.fd = sock.fileno()
        self.procs: list[subprocess.Popen[bytes]] = []
        self._keeper: asyncio.Task[None] | None = None

    def _start_one(self) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "stepline_server.cli.main", "serve"]
        return subprocess.Popen(argv, env=self.env, pass_fds=(self.fd,))

    def start(self) -> None:
        """Start the children, and keep them running until :meth:`stop`."""
        self.procs = [self._start_one() for _ in range(self.count)]
        self._keeper = asyncio.create_task(self._keep())

    async def _keep(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            for i, proc in enumerate(self.procs):
                code = proc.poll()
                if code is not None:
                    log.warning("worker_exited", pid=proc.pid, code=code)
                    multiproc.worker_exited(proc.pid)
                    self.procs[i] = self._start_one()

    async def stop(self, grace: float = 30.0) -> None:
        """SIGTERM every child, then SIGKILL what has not exited after ``grace`` seconds."""
        if self._keeper is not None:
            self._keeper.cancel()
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                await asyncio.to_thread(proc.wait, grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await asyncio.to_thread(proc.wait)
