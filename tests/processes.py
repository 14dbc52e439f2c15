"""An orchestrator as a process of its own (``stepline serve``), to be killed with SIGKILL."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import httpx


def spawn(env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``stepline serve`` with ``env`` over this process's environment, in its own group."""
    return subprocess.Popen(
        [sys.executable, "-m", "stepline_server.cli.main", "serve"],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


async def until_up(url: str, proc: subprocess.Popen[bytes]) -> None:
    """Wait until ``url`` answers; fail when the process exits first."""
    async with httpx.AsyncClient() as http:
        for _ in range(400):
            if proc.poll() is not None:
                raise RuntimeError(f"the orchestrator exited with {proc.returncode}")
            try:
                await http.get(url)
                return
            except httpx.HTTPError:
                await asyncio.sleep(0.05)
    raise TimeoutError(url)


def kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process and its group, unless it has exited."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
