"""What one step's exchange costs on the wire, by transport: a floor for the progress channel.

``python -m bench.transport [--calls N] [--rounds K]`` starts uvicorn (uvloop, httptools and
websockets-sansio) with a bare ASGI app that answers a progress-sized JSON body with a
progress-sized JSON answer, and nothing else: no token, no plan, no database. This process is
the SDK's side. Each round makes ``N`` exchanges over each transport, one after
another, as an invocation's steps are:

- ``http``: ``POST`` over the SDK's own keep-alive client (:mod:`stepline._http`, the one
  progress calls use), answered ahead of any router, as the orchestrator's progress fast path is;
- ``websocket``: one message each way on one open WebSocket (the ``websockets`` library that
  ``uvicorn[standard]`` brings, no compression): what a streaming channel would cost per step.

It prints, per transport and round, the CPU of each side per exchange (µs) and the round
trip's p50 (µs). The difference between the two rows is the most a streaming channel could
take off a step; the orchestrator's and the app's own work per step comes on top of either.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import uvloop

from bench.procs import Service, free_port

ANSWER = b'{"cancelRequested":false,"callbacks":{}}'
BODY = json.dumps(
    {
        "runId": "0190b8d2-7a3c-7def-8abc-0123456789ab",
        "seq": 3,
        "generation": 0,
        "updates": [
            {"name": "s2", "kind": "run", "status": "completed", "attempt": 1, "output": 2},
            {"name": "s3", "kind": "run", "status": "running", "attempt": 1},
        ],
    }
).encode()
HEADERS = {"Authorization": "Bearer " + "t" * 64, "Content-Type": "application/json"}
ME = psutil.Process()


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The far side: answers a POST's body, or each WebSocket message, with :data:`ANSWER`."""
    if scope["type"] == "http":
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if body:  # the readiness probe's GET has none
            json.loads(body)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(ANSWER)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": ANSWER})
    elif scope["type"] == "websocket":
        message = await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        while True:
            message = await receive()
            if message["type"] != "websocket.receive":
                return
            json.loads(message.get("bytes") or message.get("text") or b"")
            await send({"type": "websocket.send", "bytes": ANSWER})
    elif scope["type"] == "lifespan":
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def _line(name: str, calls: int, client: float, server: float, rtts: list[float]) -> str:
    return (
        f"{name:<10} {calls:>6} {1e6 * client / calls:>10.0f} {1e6 * server / calls:>10.0f}"
        f" {1e6 * statistics.median(rtts):>8.0f}"
    )


async def _http_round(url: str, calls: int, server: psutil.Process) -> str:
    from stepline import _http

    client = _http.HttpClient(timeout=30.0)
    try:
        for _ in range(min(calls, 200)):  # a warm connection, as a running invocation has
            await client.post(url, BODY, HEADERS, idempotent=True)
        rtts: list[float] = []
        mine, theirs = _cpu(ME), _cpu(server)
        for _ in range(calls):
            started = time.perf_counter()
            answer = await client.post(url, BODY, HEADERS, idempotent=True)
            rtts.append(time.perf_counter() - started)
            assert answer.status == 200, answer.status
        return _line("http", calls, _cpu(ME) - mine, _cpu(server) - theirs, rtts)
    finally:
        await client.aclose()


async def _websocket_round(url: str, calls: int, server: psutil.Process) -> str:
    from websockets.asyncio.client import connect

    auth = {"Authorization": HEADERS["Authorization"]}
    async with connect(url, additional_headers=auth, compression=None) as ws:
        for _ in range(min(calls, 200)):
            await ws.send(BODY)
            await ws.recv()
        rtts: list[float] = []
        mine, theirs = _cpu(ME), _cpu(server)
        for _ in range(calls):
            started = time.perf_counter()
            await ws.send(BODY)
            answer = await ws.recv()
            rtts.append(time.perf_counter() - started)
            assert answer == ANSWER
        return _line("websocket", calls, _cpu(ME) - mine, _cpu(server) - theirs, rtts)


async def run(calls: int, rounds: int) -> list[str]:
    """Start the far side, make the rounds, stop it; the table's lines."""
    port = free_port()
    argv = [sys.executable, "-m", "uvicorn", "bench.transport:app", "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--loop", "uvloop", "--http", "httptools"]
    argv += ["--ws", "websockets-sansio", "--log-level", "warning", "--no-access-log"]
    with tempfile.TemporaryDirectory() as logs:
        far = Service("far side", argv, os.environ, f"http://127.0.0.1:{port}", Path(logs) / "log")
        far.start()
        try:
            await far.wait_ready("/")
            server = psutil.Process(far.pid)
            lines = [
                f"{'transport':<10} {'calls':>6} {'client us':>10} {'server us':>10} {'rtt us':>8}"
            ]
            for _ in range(rounds):
                lines.append(await _http_round(f"{far.url}/progress", calls, server))
                lines.append(await _websocket_round(f"ws://127.0.0.1:{port}/stream", calls, server))
            return lines
        finally:
            far.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.transport", description=__doc__)
    parser.add_argument("--calls", type=int, default=3000, help="exchanges per round [3000]")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of both transports [3]")
    args = parser.parse_args(argv)
    for line in uvloop.run(run(args.calls, args.rounds)):
        print(line)


if __name__ == "__main__":
    main()
