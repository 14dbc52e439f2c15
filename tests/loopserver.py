"""An ASGI app served as serverless runtimes and some adapters serve one: a threaded HTTP server
on loopback that runs each request on an event loop of its own, closed once it is answered.

Modes: ``run`` (``asyncio.run`` per request: what is left is cancelled, then the loop closes),
``close`` (``run_until_complete``, then the loop closes with whatever is left still pending) and
``process`` (each request in a fresh Python process: ``python -m tests.loopserver module:attr``
reads the request on stdin and writes the answer on stdout). Every status answered is kept.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import importlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[1]


async def _call(app: Any, request: dict[str, Any]) -> dict[str, Any]:
    """One ASGI http request: ``request`` has method, path, headers and body (base64)."""
    path, _, query = request["path"].partition("?")
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
        "method": request["method"], "scheme": "http", "path": path,
        "raw_path": path.encode(), "query_string": query.encode(), "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in request["headers"]],
        "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0),
    }  # fmt: skip
    body = base64.b64decode(request["body"])
    answer: dict[str, Any] = {"status": 500, "headers": [], "body": b""}
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            await asyncio.Event().wait()  # no disconnect until the answer is written
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer["status"] = message["status"]
            answer["headers"] = [(k.decode(), v.decode()) for k, v in message["headers"]]
        elif message["type"] == "http.response.body":
            answer["body"] += message.get("body", b"")

    await app(scope, receive, send)
    return {**answer, "body": base64.b64encode(answer["body"]).decode()}


def _load(target: str) -> Any:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


class LoopServer(ThreadingHTTPServer):
    """Serves ``app`` (or, in ``process`` mode, the app ``target`` names) one loop a request."""

    daemon_threads = True

    def __init__(self, app: Any, mode: str, target: str = "", env: dict[str, str] | None = None):
        super().__init__(("127.0.0.1", free_port()), _Handler)
        self.app, self.mode, self.target, self.env = app, mode, target, env or {}
        self.statuses: list[int] = []
        self.loops = 0

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        if self.mode == "process":
            done = subprocess.run(
                [sys.executable, "-m", "tests.loopserver", self.target],
                input=json.dumps(request).encode(), capture_output=True, cwd=ROOT,
                env={**os.environ, **self.env}, timeout=60, check=True,
            )  # fmt: skip
            return dict(json.loads(done.stdout))
        self.loops += 1
        if self.mode == "run":
            return asyncio.run(_call(self.app, request))
        loop = asyncio.new_event_loop()
        try:
            return loop.run_until_complete(_call(self.app, request))
        finally:
            loop.close()  # what the request left pending stays pending, as some adapters leave it


class _Handler(BaseHTTPRequestHandler):
    server: LoopServer

    def _any(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        request = {
            "method": self.command, "path": self.path, "headers": list(self.headers.items()),
            "body": base64.b64encode(self.rfile.read(length)).decode(),
        }  # fmt: skip
        answer = self.server.answer(request)
        body = base64.b64decode(answer["body"])
        self.server.statuses.append(answer["status"])
        self.send_response(answer["status"])
        for name, value in answer["headers"]:
            if name.lower() != "content-length":
                self.send_header(name, value)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _any

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def serving(
    app: Any, mode: str, target: str = "", env: dict[str, str] | None = None
) -> Iterator[LoopServer]:
    """Serve until the block ends; the server's URL is ``http://127.0.0.1:{port}``."""
    server = LoopServer(app, mode, target, env)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


if __name__ == "__main__":
    answer = asyncio.run(_call(_load(sys.argv[1]), json.loads(sys.stdin.read())))
    sys.stdout.write(json.dumps(answer))
