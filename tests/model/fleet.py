"""The model test's app fleet in a rolling upgrade: two replicas of one app behind one URL,
one on today's SDK and one on the oldest SDK still supported (protocol 1: whole histories
only; taken from this repository's history, as tests/e2e/test_protocol_versions.py does).
Each replica is a uvicorn process; the front (``Front``, served in the test's process) sends
each request to the next replica in turn, syncs included. Both host the workflow ``fleet``:
three steps, each appended to the record file with the run's tag, and short sleeps."""

from __future__ import annotations

import contextlib
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import httpx

from tests.chaos.procs import Proc, free_port
from tests.e2e.test_protocol_versions import OLDEST_SDK
from tests.support import read_body, unpack_sdk

STEPS = 3
HOP = ("content-length", "transfer-encoding", "content-encoding")  # not passed on by the front

SOURCE = textwrap.dedent(
    """
    import json, os
    import stepline

    sl = stepline.Stepline(os.environ["STEPLINE_MODEL_FLEET_SECRET"])
    RECORD = os.environ["STEPLINE_MODEL_RECORD"]

    def record(run, step, tag):
        line = json.dumps({"run": run, "step": step, "invocation": "", "tag": tag, "gen": 1,
                           "ok": True}) + "\\n"
        fd = os.open(RECORD, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    @sl.workflow("fleet")
    async def fleet(ctx, input):
        total = 0
        for i in range(STEPS):
            def add(i=i):
                record(ctx.run_id, f"add-{i}", input["tag"])
                return i + 1
            total += await ctx.step(f"add-{i}", add)
            await ctx.sleep(f"nap-{i}", "30ms")
        return {"tag": input["tag"], "total": total}

    app = sl.asgi()
    """
).replace("STEPS", str(STEPS))


def fleet_output(tag: str) -> dict[str, Any]:
    return {"tag": tag, "total": sum(range(1, STEPS + 1))}


def replicas(workdir: Path, env: dict[str, str], secret: str) -> list[Proc]:
    """The two replicas (today's SDK, then the old one), not started."""
    old = workdir / "old-sdk"
    if not old.exists():
        unpack_sdk(OLDEST_SDK, old)
    procs = []
    for name, path in (("new", workdir / "new-app"), ("old", old)):
        path.mkdir(exist_ok=True)
        (path / "fleetapp.py").write_text(SOURCE)
        port = free_port()
        extra = {"STEPLINE_MODEL_FLEET_SECRET": secret}
        if name == "old":  # its stepline is the old SDK's, found first
            extra["PYTHONPATH"] = f"{path}:{path / 'sdk'}"
        else:
            extra["PYTHONPATH"] = str(path)
        argv = [sys.executable, "-m", "uvicorn", "fleetapp:app", "--port", str(port),
                "--log-level", "warning"]  # fmt: skip
        procs.append(
            Proc(
                f"replica-{name}",
                argv,
                {**env, **extra},
                f"http://127.0.0.1:{port}",
                workdir / f"replica-{name}.log",
            )
        )
    return procs


class Front:
    """ASGI: each request to the next replica in turn (a load balancer in round robin)."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.turn = 0
        self.http = httpx.AsyncClient(timeout=60.0)
        self.served: list[str] = []  # which replica answered each request, in order

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        url = self.urls[self.turn % len(self.urls)]
        self.turn += 1
        headers = [
            (k, v) for k, v in scope["headers"] if k.lower() not in (b"host", b"content-length")
        ]
        try:
            answer = await self.http.request(
                scope["method"], url + scope["path"], content=body, headers=headers
            )
            status, content = answer.status_code, answer.content
            out = [
                (k.encode(), v.encode()) for k, v in answer.headers.items() if k.lower() not in HOP
            ]
        except httpx.TransportError:
            status, content, out = 502, b"replica away", []
        kind = ""
        with contextlib.suppress(ValueError, AttributeError):
            kind = str(json.loads(body).get("kind", ""))
        self.served.append(f"{kind}:{url}:{status}")
        await send({"type": "http.response.start", "status": status, "headers": out})
        await send({"type": "http.response.body", "body": content})
