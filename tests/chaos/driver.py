"""The load: starts the runs and completes their callbacks and events, riding out the faults.

:class:`Api` spreads calls over both orchestrators and retries a call that met a connection
error, a timeout or a 5xx on the other one, with backoff, for a bounded time. Starting a run
always carries a ``runKey``, so a retried start cannot create a second run. :class:`Ledger`
keeps what the orchestrators acknowledged: run ids, callback bodies, events.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from tests.chaos import app as chaos_app
from tests.chaos.config import Config

__all__ = ["Api", "ApiGaveUp", "Ledger", "RunPlan", "drive_run", "plan_runs"]

_ENDED = {"completed", "failed", "cancelled", "timedOut"}


class ApiGaveUp(RuntimeError):
    """An API call kept failing for longer than its budget."""


class Api:
    """The orchestrators' REST API with retries (see the module docstring)."""

    def __init__(self, bases: list[str], key: str, budget: float = 90.0) -> None:
        self.bases = bases
        self.key = key
        self.budget = budget
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(15.0, connect=3.0))
        self.limit = asyncio.Semaphore(24)
        self.retried = 0
        self._next = 0

    async def close(self) -> None:
        await self.http.aclose()

    async def call(
        self, method: str, target: str, body: Any = None, *, auth: bool = True
    ) -> httpx.Response:
        """``target`` is a path (``/v1/...``) or a full URL of either orchestrator."""
        parts = urlsplit(target)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        start = self._next = (self._next + 1) % len(self.bases)
        if parts.scheme:  # a signed URL: try its own orchestrator first
            own = f"{parts.scheme}://{parts.netloc}"
            start = self.bases.index(own) if own in self.bases else start
        headers = {"authorization": f"Bearer {self.key}"} if auth else {}
        deadline = time.monotonic() + self.budget
        problem = "no attempt"
        for attempt in range(1000):
            base = self.bases[(start + attempt) % len(self.bases)]
            try:
                async with self.limit:
                    response = await self.http.request(
                        method, base + path, json=body, headers=headers
                    )
                if response.status_code < 500 and response.status_code != 429:
                    return response
                problem = f"{response.status_code} {response.text[:200]}"
            except httpx.TransportError as exc:
                problem = repr(exc)
            self.retried += 1
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(min(2.0, 0.1 * 2 ** min(attempt, 5)) * random.uniform(0.5, 1.0))
        raise ApiGaveUp(f"{method} {path}: {problem}")


@dataclass
class RunPlan:
    """One run to start: its number, run key and input."""

    i: int
    key: str
    input: dict[str, Any]


def plan_runs(config: Config, tag: str) -> list[RunPlan]:
    rng = random.Random(config.seed)
    plans = []
    for i in range(config.runs):
        key = f"chaos-{tag}-{i}"
        ms = [rng.randint(*config.step_ms) for _ in range(3)]
        chaos_input = {"i": i, "key": key, "ms": ms, "sleepMs": rng.randint(*config.sleep_ms)}
        plans.append(RunPlan(i, key, chaos_input))
    return plans


@dataclass
class RunLedger:
    """What the orchestrators acknowledged about one run."""

    plan: RunPlan
    run_id: str | None = None
    start_status: int | None = None
    callbacks: dict[str, dict[str, Any]] = field(default_factory=dict)  # how -> body acked
    event_acks: int = 0  # 202 answers that matched at least one run
    event_unmatched: int = 0  # 202 answers that matched none (sent again later)
    events_lost: int = 0  # acked, yet the wait still waited event_lost_seconds later
    # Acknowledged, then gone (an asynchronous failover's rewind): sent again, as a client would.
    starts_lost: int = 0  # the run answered 404: started again with its run key
    stale_reads: int = 0  # the run answered 404, yet its run key still named it
    callbacks_lost: int = 0  # the callback's step waited again: its body sent again
    last_status: str | None = None
    problems: list[str] = field(default_factory=list)


@dataclass
class Ledger:
    runs: list[RunLedger] = field(default_factory=list)


async def _start(api: Api, entry: RunLedger) -> None:
    plan = entry.plan
    body = {"workflow": "chaos", "input": plan.input, "runKey": plan.key}
    response = await api.call("POST", "/v1/runs", body)
    if response.status_code not in (200, 201):
        entry.problems.append(f"start answered {response.status_code}: {response.text[:200]}")
        return
    entry.run_id = str(response.json()["id"])
    entry.start_status = response.status_code


async def _complete_callback(api: Api, entry: RunLedger, how: str, target: str, auth: bool) -> bool:
    body = chaos_app.callback_body(entry.plan.i, how)
    response = await api.call("POST", target, body, auth=auth)
    # 409: completed already, by an earlier try of ours whose answer was lost.
    if response.status_code in (200, 409):
        entry.callbacks[how] = body
        return True
    entry.problems.append(f"callback {how} answered {response.status_code}")
    return False


async def drive_run(
    api: Api, entry: RunLedger, config: Config, deadline: float, poll: float
) -> None:
    """Start the run, then act on what it waits for until it ends or ``deadline`` passes."""
    try:
        await _start(api, entry)
    except (ApiGaveUp, ValueError, KeyError, TypeError) as exc:
        entry.problems.append(repr(exc))
        return
    if entry.run_id is None:
        return
    event_acked_at: float | None = None
    data = chaos_app.event_data(entry.plan.key, entry.plan.i)
    for _ in range(100_000):
        if time.monotonic() > deadline:
            return
        try:
            response = await api.call("GET", f"/v1/runs/{entry.run_id}")
            if response.status_code == 404:  # acknowledged, then lost? start it again
                before = entry.run_id
                await _start(api, entry)
                if entry.run_id == before:  # its run key found it: a read behind, not a loss
                    entry.stale_reads += 1
                else:
                    entry.starts_lost += 1
                await asyncio.sleep(poll)
                continue
            run = response.json()
            entry.last_status = run.get("status")
            if entry.last_status in _ENDED:
                return
            steps = {s["name"]: s for s in run.get("steps") or []}
            announce = steps.get("announce", {})
            url_step = steps.get("cb-url", {})
            if announce.get("status") == "completed" and url_step.get("status") == "waiting":
                entry.callbacks_lost += "url" in entry.callbacks  # acknowledged, then lost
                await _complete_callback(api, entry, "url", str(announce["output"]), auth=False)
            key_step = steps.get("cb-key", {})
            if key_step.get("status") == "waiting" and key_step.get("callbackId"):
                entry.callbacks_lost += "key" in entry.callbacks
                target = f"/v1/callbacks/{key_step['callbackId']}"
                await _complete_callback(api, entry, "key", target, auth=True)
            evt = steps.get("evt", {})
            if evt.get("status") == "waiting":
                now = time.monotonic()
                if event_acked_at is not None and now - event_acked_at > config.event_lost_seconds:
                    entry.events_lost += 1
                    event_acked_at = None
                if event_acked_at is None:
                    sent = await api.call(
                        "POST", "/v1/events", {"name": chaos_app.EVENT_NAME, "data": data}
                    )
                    if sent.status_code == 202 and int(sent.json().get("matchedRuns", 0)) > 0:
                        entry.event_acks += 1
                        event_acked_at = now
                    elif sent.status_code == 202:
                        entry.event_unmatched += 1
                    else:
                        entry.problems.append(f"event answered {sent.status_code}")
        except (ApiGaveUp, ValueError, KeyError, TypeError) as exc:
            # A bad answer is the engine's finding, never a reason to stop driving the others.
            entry.problems.append(repr(exc))
        await asyncio.sleep(poll * random.uniform(0.7, 1.3))
