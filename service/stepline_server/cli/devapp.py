"""The child process of ``stepline dev MODULE:ATTR``: the user's Stepline served on loopback.

It imports ``MODULE:ATTR`` afresh (a new process per code change, so no stale module is kept),
gives it the dev signing secret and serves its handler with uvicorn on ``127.0.0.1:PORT`` until
it is told to stop. A module that does not import prints why and exits 3, and the dev loop
waits for the next change. :class:`ChildApp` is the dev loop's side of it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import traceback

import uvicorn

from stepline.cli import replaycheck
from stepline_server.cli import servers

SECRET_VARIABLE = "STEPLINE_SIGNING_SECRET"
IMPORT_FAILED = 3
READY_SECONDS = 30.0  # how long a (re)started app may take before it answers


class ChildApp:
    """The parent's side: this module run as a child process, started again on every change."""

    def __init__(self, target: str, port: int, secret: str) -> None:
        self.target, self.port, self.secret = target, port, secret
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def start(self) -> None:
        env = {**os.environ, SECRET_VARIABLE: self.secret}
        argv = [sys.executable, "-m", "stepline_server.cli.devapp", self.target]
        self.proc = subprocess.Popen([*argv, "--port", str(self.port)], env=env)

    async def ready(self) -> bool:
        """Whether the child listens (False once it exited: its error is on stderr)."""
        for _ in range(int(READY_SECONDS / 0.05)):
            if self.proc is None or self.proc.poll() is not None:
                return False
            if servers.port_in_use("127.0.0.1", self.port):
                return True
            await asyncio.sleep(0.05)
        return False

    async def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(proc.wait, 10)
        except subprocess.TimeoutExpired:
            proc.kill()
            await asyncio.to_thread(proc.wait)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="stepline dev (app)")
    p.add_argument("target", metavar="MODULE:ATTR")
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args(argv)
    try:
        sl = replaycheck.load(args.target)
    except replaycheck.UsageError as exc:
        print(f"stepline dev: {exc}", file=sys.stderr, flush=True)
        return IMPORT_FAILED
    except Exception:  # the user's module raised while importing: show where
        print(f"stepline dev: {args.target} raised while importing:", file=sys.stderr)
        traceback.print_exc()
        sys.stderr.flush()
        return IMPORT_FAILED
    secret = os.environ.get(SECRET_VARIABLE)
    if secret:  # the dev secret wins over one the code passed to Stepline(...)
        sl.signing_secrets = (secret,)
    config = uvicorn.Config(
        sl.asgi(), host="127.0.0.1", port=args.port, log_level="warning", lifespan="on"
    )
    uvicorn.Server(config).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
