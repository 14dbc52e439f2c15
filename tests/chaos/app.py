"""The chaos test's user app, served by uvicorn in its own process (``tests.chaos.app:app``).

The SDK handler sits behind :class:`FlakyRecorder`, a pure-ASGI wrapper that answers ``503`` to
an invocation (a POST whose JSON body has ``kind: "invoke"``) with probability
``CHAOS_FAIL_RATE`` before the SDK sees it, and otherwise writes an ``invoke`` record when the
invocation begins and when it is answered (with the SDK's answer status, e.g. ``stale``).
Every step execution writes a ``start`` and an ``end`` record with the run, the step, its
attempt, the invocation id and a hash of its token, and the orchestrator that sent it (the
invocation's ``apiUrl``). Records are JSON lines appended with one ``write`` each to
``CHAOS_RECORDS``, so they survive ``kill -9`` of this process.

The workflow ``chaos``: work, a durable sleep, a callback completed by its signed URL, one
completed with the API key, more work, an event wait, more work; its output is a function of
its input and of the bodies the driver sends (see :func:`expected_output`).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
import random
import time
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

import stepline

__all__ = ["EVENT_NAME", "app", "callback_body", "event_data", "expected_output", "work_value"]

EVENT_NAME = "chaos.go"


@dataclass(frozen=True)
class Invocation:
    """What a step needs to know about the invocation it runs in."""

    run_id: str
    invocation_id: str
    token: str
    orchestrator: str
    steps: dict[str, tuple[str, int]]  # recorded step name -> (status, attempt)
    api_url: str = ""


_current: contextvars.ContextVar[Invocation | None] = contextvars.ContextVar(
    "chaos_invocation", default=None
)


class Records:
    """Appends JSON lines to one file, each with a single ``write`` of an ``O_APPEND`` fd."""

    def __init__(self, path: str | None) -> None:
        self.fd = -1 if not path else os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, **fields: Any) -> None:
        if self.fd < 0:
            return
        fields.setdefault("at", time.time())
        fields.setdefault("pid", os.getpid())
        os.write(self.fd, (json.dumps(fields, separators=(",", ":")) + "\n").encode())


RECORDS = Records(os.environ.get("CHAOS_RECORDS"))
FAIL_RATE = float(os.environ.get("CHAOS_FAIL_RATE", "0.2"))
API_KEY = os.environ.get("CHAOS_API_KEY", "")
SELF_EVENT_NAME = "chaos.self"


def _token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()[:16]


# -- what the output must be ---------------------------------------------------------------


def work_value(i: int, step: str) -> int:
    """The result of the work step ``step`` of run number ``i``."""
    return i * 1000 + sum(step.encode()) % 997


def callback_body(i: int, how: str) -> dict[str, Any]:
    """The body the driver POSTs to complete the callback ``how`` (``url`` or ``key``)."""
    return {"how": how, "i": i, "check": hashlib.sha256(f"{how}:{i}".encode()).hexdigest()[:12]}


def event_data(key: str, i: int) -> dict[str, Any]:
    """The data of the event the driver sends for the run with run key ``key``."""
    return {"key": key, "i": i, "value": i * 7 + 3}


def expected_output(chaos_input: dict[str, Any]) -> dict[str, Any]:
    """The output a run of ``chaos`` with this input must end with."""
    i = int(chaos_input["i"])
    return {
        "i": i,
        "work": [work_value(i, f"work-{n}") for n in range(len(chaos_input["ms"]))],
        "byUrl": callback_body(i, "url"),
        "byKey": callback_body(i, "key"),
        "event": event_data(str(chaos_input["key"]), i),
        "self": {"key": str(chaos_input["key"]), "from": "step"},
    }


# -- the workflow --------------------------------------------------------------------------

sl = stepline.Stepline()


async def work(run_id: str, step: str, i: int, ms: int) -> int:
    """Real work: sleep ``ms`` between two records of this execution."""
    import asyncio

    inv = _current.get()
    attempt = 1
    if inv is not None and step in inv.steps:
        status, recorded = inv.steps[step]
        attempt = recorded + 1 if status in ("retrying", "running") else recorded
    common: dict[str, Any] = {
        "kind": "step",
        "run": run_id,
        "step": step,
        "attempt": attempt,
        "inv": inv.invocation_id if inv else None,
        "token": _token_hash(inv.token) if inv else None,
        "orch": inv.orchestrator if inv else None,
    }
    RECORDS.write(phase="start", **common)
    finished = False
    try:
        await asyncio.sleep(ms / 1000)
        finished = True
    finally:  # also when the SDK cancels the step (a stale invocation)
        RECORDS.write(phase="end", finished=finished, **common)
    return work_value(i, step)


async def signal(key: str) -> bool:
    """A step that sets off the very event the workflow's next line waits for (POST
    /v1/events to the orchestrator that invoked it, riding out one that is down)."""
    import asyncio

    import httpx

    inv = _current.get()
    assert inv is not None
    body = {"name": SELF_EVENT_NAME, "data": {"key": key, "from": "step"}}
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with httpx.AsyncClient(timeout=5.0) as client:
        for _ in range(100):  # at most about 30 s
            try:
                answer = await client.post(f"{inv.api_url}/v1/events", json=body, headers=headers)
                if answer.status_code == 202:
                    RECORDS.write(
                        kind="signal", run=inv.run_id, matched=answer.json()["matchedRuns"]
                    )
                    return True
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.3)
    raise RuntimeError("the orchestrator did not take the event")


async def announce(url: str) -> str:
    """A step whose result is the signed callback URL, so the driver can read it from the run."""
    return url


# The SDK's default retries (3 attempts): delivery failures must not use them (openapi.yaml).
@sl.workflow("chaos", timeout="1h")
async def chaos(ctx: stepline.Context, input: dict[str, Any]) -> dict[str, Any]:
    i = int(input["i"])
    ms = [int(m) for m in input["ms"]]
    results = [await ctx.step("work-0", work, ctx.run_id, "work-0", i, ms[0])]
    await ctx.sleep("nap", f"{int(input['sleepMs'])}ms")
    by_url = await ctx.callback("cb-url", timeout="1h")
    await ctx.step("announce", announce, by_url.url)
    url_body = await by_url.wait()
    by_key = await ctx.callback("cb-key", timeout="1h")
    key_body = await by_key.wait()
    for n in range(1, len(ms) - 1):
        results.append(await ctx.step(f"work-{n}", work, ctx.run_id, f"work-{n}", i, ms[n]))
    event = await ctx.wait_for_event(
        "evt", event=EVENT_NAME, match={"key": input["key"]}, timeout="1h"
    )
    # A step sets off the event the next line waits for: the two must never miss each other.
    await ctx.step("signal", signal, input["key"])
    mine = await ctx.wait_for_event(
        "self-evt", event=SELF_EVENT_NAME, match={"key": input["key"]}, timeout="1h"
    )
    last = len(ms) - 1
    results.append(await ctx.step(f"work-{last}", work, ctx.run_id, f"work-{last}", i, ms[last]))
    return {
        "i": i, "work": results, "byUrl": url_body, "byKey": key_body, "event": event,
        "self": mine,
    }  # fmt: skip


# -- the wrapper ---------------------------------------------------------------------------


class FlakyRecorder:
    """Answers 503 to one invocation in ``1 / fail_rate`` and records the others (see above)."""

    def __init__(self, app: ASGIApp, fail_rate: float) -> None:
        self.app = app
        self.fail_rate = fail_rate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        for _ in range(100_000):  # bodies are at most a few MiB
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        try:
            payload = json.loads(body)
        except ValueError:
            payload = None
        if not isinstance(payload, dict) or payload.get("kind") != "invoke":
            await self.app(scope, _replay(body, receive), send)
            return
        common: dict[str, Any] = {
            "kind": "invoke",
            "run": payload.get("runId"),
            "inv": payload.get("invocationId"),
            "token": _token_hash(str(payload.get("token"))),
            "orch": payload.get("apiUrl"),
        }
        if random.random() < self.fail_rate:
            RECORDS.write(phase="refused", **common)
            await _answer(send, 503, b'{"error":"injected"}')
            return
        steps = {
            str(s.get("name")): (str(s.get("status")), int(s.get("attempt") or 1))
            for s in payload.get("steps") or []
            if isinstance(s, dict)
        }
        inv = Invocation(
            str(common["run"]), str(common["inv"]), str(payload.get("token")),
            str(common["orch"]), steps, str(payload.get("apiUrl") or ""),
        )  # fmt: skip
        RECORDS.write(phase="begin", **common)
        answer: dict[str, Any] = {"status": None, "parts": []}

        async def recording_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                answer["status"] = message["status"]
            elif message["type"] == "http.response.body":
                answer["parts"].append(message.get("body", b""))
            await send(message)

        reset = _current.set(inv)
        try:
            await self.app(scope, _replay(body, receive), recording_send)
        finally:
            _current.reset(reset)
            outcome = None
            with contextlib.suppress(ValueError, AttributeError):
                outcome = json.loads(b"".join(answer["parts"])).get("status")
            RECORDS.write(phase="end", http=answer["status"], outcome=outcome, **common)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that yields the body read already, then the real channel's messages."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _answer(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


app = FlakyRecorder(sl.asgi(), FAIL_RATE)
