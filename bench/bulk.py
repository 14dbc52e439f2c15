"""The ``bulk`` workload: the latency of lone runs of another workflow while a bulk retry of N
failed runs proceeds, against the same lone runs with nothing else going on.

N runs of ``breaks`` (a trivial step, then a terminal error) are started and fail; lone
``steps`` runs (N steps each, one at a time) are measured; then ``POST /v1/runs/bulk`` retries
every failed ``breaks`` run and lone ``steps`` runs are measured, one after another, until the
operation has ended and every retried run has ended again (each fails again after one
invocation, so a retry costs what a retry of a fixed run costs). The rows: ``bulk-before``
and ``bulk-during`` (their latencies are the lone runs'), and ``bulk-retry`` (the operation:
runs retried, its wall time, and the ratios of the lone runs' p50 and p95 during to before).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench import workloads
from bench.workloads import Bench, Result

START_CONCURRENCY = 32
POLL_SECONDS = 0.5


async def _lone(bench: Bench, n: int) -> tuple[float | None, dict[str, Any] | None]:
    """One lone ``steps`` run: its latency (the orchestrator's clock) and the run."""
    started = await bench.start_many("steps", [{"n": n}])
    ended = await bench.wait_many([r for r, _ in started], bench.deadline())
    for e in ended.values():
        if e.run.get("status") == "completed":
            return workloads.run_latency_ms(e.run), e.run
    return None, None


def _ratio(during: float | None, before: float | None) -> float | None:
    return round(during / before, 2) if during is not None and before else None


async def bulk(bench: Bench, failed_runs: int, repeats: int, n: int) -> list[Result]:
    deadline = bench.deadline()
    started = await bench.start_many(
        "breaks", [{"i": i} for i in range(failed_runs)], START_CONCURRENCY
    )
    ids = [r for r, _ in started]
    ended = await bench.wait_many(ids, deadline)
    failed = sum(1 for e in ended.values() if e.run.get("status") == "failed")

    before: list[float] = []
    with bench.monitor.measure() as usage_before:
        t0 = time.monotonic()
        for _ in range(repeats):
            ms, _ = await _lone(bench, n)
            if ms is not None:
                before.append(ms)
        wall_before = time.monotonic() - t0

    during: list[float] = []
    op: dict[str, Any] = {}
    with bench.monitor.measure() as usage_during:
        t0 = time.monotonic()
        op = await bench.api.bulk_runs("retry", {"workflow": "breaks", "status": "failed"})
        watcher = asyncio.create_task(_follow(bench, op["id"], ids, deadline))
        while not watcher.done() and time.monotonic() < deadline:
            ms, _ = await _lone(bench, n)
            if ms is not None:
                during.append(ms)
        op, retried_s, op_s = await watcher
        wall_during = time.monotonic() - t0

    rows = [
        Result("bulk-before", repeats, len(before), wall_before, len(before) * n, before,
               usage_before, {"steps_per_run": n, "runs_one_at_a_time": repeats}),
        Result("bulk-during", len(during), len(during), wall_during, len(during) * n, during,
               usage_during, {"steps_per_run": n, "failed_runs_retried": failed_runs}),
    ]  # fmt: skip
    p_before, p_during = workloads.summary(before), workloads.summary(during)
    rows.append(
        Result(
            "bulk-retry",
            attempted=failed_runs,
            completed=int(op.get("succeeded", 0)),
            wall_s=retried_s,
            steps=0,
            latencies_ms=[],
            usage=usage_during,
            extra={
                "failed_runs": failed,
                "operation": {
                    k: op.get(k) for k in ("status", "matched", "succeeded", "skipped", "failed")
                },
                "operation_s": round(op_s, 1),
                "retried_runs_ended_s": round(retried_s, 1),
                "lone_p50_ratio": _ratio(p_during["p50"], p_before["p50"]),
                "lone_p95_ratio": _ratio(p_during["p95"], p_before["p95"]),
            },
        )
    )
    return rows


async def _follow(
    bench: Bench, op_id: str, ids: list[str], deadline: float
) -> tuple[dict[str, Any], float, float]:
    """Wait for the operation to end, then for every retried run to end again: the operation
    as it ended, the seconds until the last run ended, and the seconds the operation took."""
    t0 = time.monotonic()
    op: dict[str, Any] = {}
    while time.monotonic() < deadline:
        op = await bench.api.get_operation(op_id)
        if op["status"] != "running":
            break
        await asyncio.sleep(POLL_SECONDS)
    op_s = time.monotonic() - t0
    await bench.wait_many(ids, deadline)
    return op, time.monotonic() - t0, op_s
