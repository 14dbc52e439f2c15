"""One failover run: the chaos load on a pg_auto_failover formation whose primary is killed.

The set-up, the load, the read-back and the invariant table are the chaos test's
(:mod:`tests.chaos.scenario`, :mod:`tests.chaos.checks`) on a :class:`Formation` instead of a
private server, with two orchestrators on the multi-host DSN. The faults: ``kill -9`` of the
primary's postmaster, then, once a primary is back, of the primary's whole node (keeper and
PostgreSQL), which comes back as a standby later. Every call the driver makes goes through a
transport that counts the answers of 500 and the requests that got no answer; the orchestrators'
logs are read for restarts, crashed loops and uvicorn's ``Exception in ASGI application``.

With ``asynchronous`` the promotion may lose what a standby had not received yet: the driver
sends again what it sees lost (a start whose run is not found, a callback whose step waits
again, an event whose wait still waits), the table counts it, and losses are information, not
failures; a run failed with ``nondeterminism`` is a failure in both modes.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from tests.chaos import checks
from tests.chaos import scenario as chaos
from tests.chaos.config import Config
from tests.chaos.driver import Ledger, RunLedger, plan_runs
from tests.failover.formation import Formation

__all__ = ["SIZES", "run", "sized"]

SIZES = {
    "small": Config(
        runs=24, lease_seconds=5, step_ms=(20, 150), sleep_ms=(1000, 2000), start_seconds=60,
        settle_seconds=120, fail_rate=0.0, event_lost_seconds=20, size="small",
    ),
    "default": Config(
        runs=300, lease_seconds=5, step_ms=(30, 300), sleep_ms=(1000, 2000), start_seconds=120,
        settle_seconds=180, fail_rate=0.1, event_lost_seconds=30, size="default",
    ),
}  # fmt: skip

# Rows of the chaos table that count losses: information only under asynchronous replication.
_LOSSES = (
    "acknowledged runs found",
    "runs completed, right output",
    "recorded steps run again",
    "acknowledged callback bodies lost",
    "acknowledged events lost",
    "app invocations without invocation.started",  # a begin the rewind took back
)


@dataclass
class Answers:
    """What the driver's calls got: statuses, and the calls that got no answer at all."""

    statuses: Counter[int] = field(default_factory=Counter)
    unanswered: Counter[str] = field(default_factory=Counter)


class CountingTransport(httpx.AsyncHTTPTransport):
    """Counts each answer's status and each request that got none (a dropped connection)."""

    def __init__(self, answers: Answers) -> None:
        super().__init__()
        self.answers = answers

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            response = await super().handle_async_request(request)
        except httpx.TransportError as exc:
            self.answers.unanswered[f"{request.method} {_route(request.url.path)}: {exc!r}"] += 1
            raise
        self.answers.statuses[response.status_code] += 1
        return response


def _route(path: str) -> str:
    parts = path.split("/")
    return "/".join("{id}" if len(p) > 20 else p for p in parts[:4])


async def _kill_primary(formation: Formation, kind: str, log: list[chaos.Fault]) -> None:
    """``kill -9`` of the primary's postmaster (``kill-postmaster``) or whole node
    (``kill-node``, started again 5 s after the new timeline), then wait for a new timeline
    and three nodes again."""
    primary = await asyncio.to_thread(formation.primary)
    assert primary is not None, f"no primary before {kind}"
    fault = chaos.Fault(kind, [primary.name], time.time())
    log.append(fault)
    timeline = await asyncio.to_thread(formation.timeline)
    if kind == "kill-node":
        formation.kill_node(primary)
    else:
        formation.kill_postmaster(primary)
    await asyncio.to_thread(formation.wait_timeline, timeline + 1, 90)
    if kind == "kill-node":
        await asyncio.sleep(5)
        formation.start_node(primary)
    await asyncio.to_thread(formation.wait_formed, 240)
    fault.ended = time.time()


async def _faults(formation: Formation, config: Config, log: list[chaos.Fault]) -> None:
    """Kill the primary's postmaster at 20% of the start window; once a new timeline (the
    keeper's restart or a promotion) and two standbys are there, the primary's whole node at
    50%."""
    began = time.monotonic()
    for fraction, kind in ((0.2, "kill-postmaster"), (0.5, "kill-node")):
        delay = began + fraction * config.start_seconds - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        await _kill_primary(formation, kind, log)


def _log_counts(paths: list[Path]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for path in paths:
        text = path.read_text(errors="replace") if path.exists() else ""
        for needle in (
            "Exception in ASGI application",
            "loop_crashed",
            "request_failed",
            "loop_waits_for_database",
            "write_waits_for_database",
        ):
            counts[needle] += text.count(needle)
    return counts


def _extend(
    report: checks.Report,
    ledger: Ledger,
    observed: checks.Observed,
    answers: Answers,
    restarts: int,
    logs: Counter[str],
    asynchronous: bool,
) -> None:
    """The failover rows, after the chaos ones (which count losses as failures only when
    replication is synchronous)."""
    if asynchronous:
        for row in report.rows:
            if row.name in _LOSSES:
                row.ok = None
    codes = Counter(
        str((run.get("error") or {}).get("code"))
        for run in observed.runs.values()
        if run.get("status") == "failed"
    )
    lost = {
        "starts": sum(e.starts_lost for e in ledger.runs),
        "callback bodies": sum(e.callbacks_lost for e in ledger.runs),
        "events": sum(e.events_lost for e in ledger.runs),
    }
    for what, n in lost.items():
        ok = None if asynchronous else n == 0
        report.add(f"acknowledged {what} gone after a promotion (sent again)", "0", n, ok)
    stale = sum(e.stale_reads for e in ledger.runs)
    report.add("runs answered 404, then found by their run key", "-", stale, None)
    nondeterminism = codes.get("nondeterminism", 0)
    report.add("runs failed with nondeterminism", "0", nondeterminism, nondeterminism == 0)
    server_errors = sum(n for s, n in answers.statuses.items() if s >= 500 and s != 503)
    report.add("answers of 500 (any 5xx but 503)", "0", server_errors, server_errors == 0)
    report.add("answers of 503 unavailable", "-", answers.statuses.get(503, 0), None)
    unanswered = sum(answers.unanswered.values())
    report.add("requests without an answer", "0", unanswered, unanswered == 0)
    for what, n in answers.unanswered.most_common(5):
        report.sample("requests without an answer", f"{n} x {what[:180]}")
    report.add("orchestrator restarts", "0", restarts, restarts == 0)
    crashed = logs["loop_crashed"] + logs["request_failed"]
    report.add("loops crashed or requests failed (logs)", "0", crashed, crashed == 0)
    asgi = logs["Exception in ASGI application"]
    report.add("'Exception in ASGI application' (logs)", "0", asgi, asgi == 0)
    waits = logs["loop_waits_for_database"] + logs["write_waits_for_database"]
    report.add("waits for the database (logs)", "-", waits, None)


async def run(config: Config, *, asynchronous: bool = False, out: Any = print) -> checks.Report:
    """One failover run end to end; the report says which invariants held."""
    workdir = Path(tempfile.mkdtemp(prefix="stepline-failover-run-"))
    formation = Formation()
    stack = chaos.Stack(workdir, formation)  # type: ignore[arg-type]
    fault_log: list[chaos.Fault] = []
    api = None
    try:
        out("failover: forming a monitor, a primary and two standbys (pg_auto_failover)")
        api, _ = await chaos._setup(stack, config)
        if asynchronous:
            await asyncio.to_thread(formation.make_asynchronous)
        answers = Answers()
        await api.http.aclose()
        api.http = httpx.AsyncClient(
            timeout=httpx.Timeout(15.0, connect=3.0), transport=CountingTransport(answers)
        )
        ledger = Ledger([RunLedger(p) for p in plan_runs(config, uuid.uuid4().hex[:8])])
        mode = "asynchronous" if asynchronous else "synchronous (ANY 1)"
        out(
            f"failover ({config.size}, {mode}): {config.runs} runs over "
            f"{config.start_seconds:.0f} s, lease {config.lease_seconds:g} s, two orchestrators"
        )
        began = time.time()
        deadline = time.monotonic() + config.start_seconds + config.settle_seconds
        await asyncio.gather(
            chaos._load(api, ledger, config, deadline), _faults(formation, config, fault_log)
        )
        for fault in fault_log:
            out(
                f"  fault {fault.kind} {','.join(fault.targets)} at +{fault.began - began:.1f} s,"
                f" three nodes again after {fault.ended - fault.began:.1f} s"
            )
        out(f"  timeline now {formation.timeline()}; load done after {time.time() - began:.1f} s")
        observed = await chaos._collect(api, ledger)
        observed.records = chaos._read_records(workdir / "records.jsonl")
        names = {o.url: o.name for o in stack.orchestrators}
        report = checks.check(
            ledger, observed, fault_log, formation.deadlocks(), api.retried, names
        )
        restarts = sum(
            max(0, p.starts - 1) + (p.proc is not None and p.proc.poll() is not None)
            for p in stack.orchestrators
        )
        logs = _log_counts([workdir / f"orch{n}.log" for n in (1, 2)])
        _extend(report, ledger, observed, answers, restarts, logs, asynchronous)
        if config.keep:
            out(f"  logs and records kept in {workdir} and {formation.root}")
        return report
    finally:
        if api is not None:
            await api.close()
        for proc in stack.orchestrators + ([stack.app] if stack.app else []):
            proc.close()
        await asyncio.to_thread(formation.remove, delete=not config.keep)
        if not config.keep:
            shutil.rmtree(workdir, ignore_errors=True)


def sized(size: str, **changes: Any) -> Config:
    """A preset with some fields changed (``runs``, ``keep``...)."""
    return replace(SIZES[size], **changes)
