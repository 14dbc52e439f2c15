"""The chaos test's child processes: each in its own process group, killed with ``kill -9``.

A :class:`Proc` can be started again after a kill (same command, same port); its output is
appended to one log file across restarts. :func:`kill_group` is what the faults and the final
cleanup use: SIGKILL to the whole group, then a bounded wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

import httpx

from tests.ports import free_port

__all__ = ["Proc", "free_port", "kill_group", "orchestrator_argv", "stepline_argv"]

ROOT = Path(__file__).resolve().parents[2]


def _die_with_parent() -> None:
    """In the child before exec: get SIGKILL when the chaos test dies (Linux only)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def stepline_argv(*args: str) -> list[str]:
    """The ``stepline`` command of this Python's environment."""
    script = Path(sys.executable).parent / "stepline"
    if script.exists():
        return [str(script), *args]
    return [sys.executable, "-m", "stepline_server.cli.main", *args]


def orchestrator_argv(port: int) -> list[str]:
    return stepline_argv("serve", "--host", "127.0.0.1", "--port", str(port))


def kill_group(proc: subprocess.Popen[bytes] | None, timeout: float = 10.0) -> None:
    """SIGKILL ``proc``'s process group (it leads one) and reap it; never raises."""
    if proc is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout)


class Proc:
    """A child serving HTTP at ``url``; ``start`` after ``kill`` runs it again."""

    def __init__(
        self, name: str, argv: Sequence[str], env: Mapping[str, str], url: str, log_path: Path
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = dict(env)
        self.url = url
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        if self._log is None:
            self._log = self.log_path.open("ab")
        self._log.write(f"\n=== start {self.starts + 1} at {time.time():.3f}\n".encode())
        self._log.flush()
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, so kill_group gets its children
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        self.starts += 1

    def kill(self) -> None:
        """``kill -9`` of the whole process group."""
        kill_group(self.proc)

    async def wait_ready(self, path: str, timeout: float = 60.0) -> None:
        """Poll ``GET url+path`` until it answers below 500; fail if the process exits first."""
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.proc is None or self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited:\n{self.tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    response = await client.get(self.url + path)
                    if response.status_code < 500:
                        return
                await asyncio.sleep(0.1)
        raise RuntimeError(f"{self.name} was not ready within {timeout} s:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def close(self) -> None:
        """Kill it and close its log; never raises."""
        self.kill()
        if self._log is not None:
            with contextlib.suppress(OSError):
                self._log.close()
            self._log = None
