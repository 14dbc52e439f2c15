"""The workloads: each starts runs over the REST API, waits for them and returns its figures.

Run latency is the orchestrator's own ``endedAt - createdAt`` of each run; wall time is what
this process saw, from before the first start to the return of the last wait. Waiting uses the
API's long poll (``wait_run``) on a few lanes that take the next run as soon as one ends, so a
handful of connections serve hundreds of runs.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx

import stepline
from bench.procs import Monitor, Usage
from stepline import _http

JSON = dict[str, Any]
START_CONCURRENCY = 8
WAIT_LANES = 32
ENDED = frozenset({"completed", "failed", "cancelled", "timedOut"})


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) with linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary(values: Sequence[float]) -> dict[str, float | None]:
    """p50, p95, p99 and max, rounded to 0.1."""
    out: dict[str, float | None] = {}
    for label, q in (("p50", 50.0), ("p95", 95.0), ("p99", 99.0), ("max", 100.0)):
        v = percentile(values, q)
        out[label] = None if v is None else round(v, 1)
    return out


def ts(text: str) -> float:
    """An RFC 3339 timestamp as Unix seconds."""
    return datetime.fromisoformat(text).timestamp()


def run_latency_ms(run: JSON) -> float | None:
    if run.get("createdAt") and run.get("endedAt"):
        return (ts(run["endedAt"]) - ts(run["createdAt"])) * 1000
    return None


@dataclass
class Result:
    """One row of the table."""

    name: str
    attempted: int
    completed: int
    wall_s: float
    steps: int
    latencies_ms: list[float]
    usage: dict[str, Usage] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> JSON:
        wall = max(self.wall_s, 1e-9)
        return {
            "workload": self.name,
            "runs_completed": self.completed,
            "runs_attempted": self.attempted,
            "wall_s": round(self.wall_s, 3),
            "runs_per_s": round(self.completed / wall, 1),
            "steps": self.steps,
            "steps_per_s": round(self.steps / wall, 1),
            "latency_ms": summary(self.latencies_ms),
            "processes": {
                name: {"cpu_s": u.cpu_s, "peak_rss_mb": u.peak_rss_mb, "end_rss_mb": u.end_rss_mb}
                for name, u in self.usage.items()
            },
            "extra": self.extra,
        }


@dataclass
class Ended:
    """A run as the last wait saw it, and when this process saw it end."""

    run: JSON
    seen_at: float


class Bench:
    """The load generator's handles: the API clients, the app's stats, the monitor."""

    def __init__(
        self,
        api: stepline.AsyncClient,
        waiter: stepline.AsyncClient,
        orchestrator_url: str,
        app_base: str,
        monitor: Monitor,
        timeout: float,
    ) -> None:
        self.api = api
        self.waiter = waiter
        self.orchestrator_url = orchestrator_url
        self.app_base = app_base
        self.monitor = monitor
        self.timeout = timeout
        self.http = httpx.AsyncClient(timeout=10.0, transport=_http.AsyncTransport())
        self.errors: list[str] = []

    async def aclose(self) -> None:
        await self.http.aclose()

    # -- the app and the orchestrator's own figures ---------------------------------------

    async def app_stats(self) -> JSON:
        response = await self.http.get(self.app_base + "/stats")
        response.raise_for_status()
        return dict(response.json())

    async def reset_app_stats(self) -> None:
        (await self.http.post(self.app_base + "/stats/reset")).raise_for_status()

    async def inflight(self) -> int:
        """Invocations the orchestrator is running now (from ``/metrics``)."""
        text = (await self.http.get(self.orchestrator_url + "/metrics")).text
        for line in text.splitlines():
            if line.startswith("stepline_invocations_inflight "):
                return int(float(line.split()[1]))
        return 0

    async def settle(self, deadline: float, ready: Callable[[JSON], bool] | None = None) -> bool:
        """Wait until the app and the orchestrator have no invocation in flight (and ``ready``)."""
        while time.monotonic() < deadline:
            stats = await self.app_stats()
            idle = (ready is None or ready(stats)) and stats["active"] == 0
            if idle and await self.inflight() == 0:
                return True
            await asyncio.sleep(0.1)
        return False

    # -- starting and waiting ----------------------------------------------------------------

    def _error(self, text: str) -> None:
        if len(self.errors) < 20:
            self.errors.append(text)

    async def start_many(
        self, workflow: str, inputs: Iterable[Any], concurrency: int = START_CONCURRENCY
    ) -> list[tuple[str, float]]:
        """Start a run per input, ``concurrency`` at a time: (run id, Unix time of the POST)."""
        gate = asyncio.Semaphore(concurrency)
        started: list[tuple[str, float]] = []

        async def one(value: Any) -> None:
            async with gate:
                at = time.time()
                try:
                    run = await self.api.start_run(workflow, value)
                except (stepline.ApiError, httpx.HTTPError) as exc:
                    self._error(f"start {workflow}: {exc!r}")
                    return
                started.append((str(run["id"]), at))

        await asyncio.gather(*(one(v) for v in inputs))
        return started

    async def wait_many(self, run_ids: Sequence[str], deadline: float) -> dict[str, Ended]:
        """Long-poll each run until it ends or ``deadline`` (monotonic) passes."""
        queue = list(reversed(run_ids))
        ended: dict[str, Ended] = {}

        async def lane() -> None:
            while queue:
                run_id = queue.pop()
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                try:
                    run = await self.waiter.wait_run(run_id, timeout=left)
                except (stepline.ApiError, httpx.HTTPError) as exc:
                    self._error(f"wait {run_id}: {exc!r}")
                    continue
                if run.get("status") in ENDED:
                    ended[run_id] = Ended(run, time.time())

        await asyncio.gather(*(lane() for _ in range(min(WAIT_LANES, len(run_ids)))))
        return ended

    def deadline(self) -> float:
        return time.monotonic() + self.timeout


def _completed(ended: dict[str, Ended]) -> list[JSON]:
    return [e.run for e in ended.values() if e.run.get("status") == "completed"]


def _failures(ended: dict[str, Ended]) -> list[str]:
    return [
        f"{e.run['id']}: {e.run.get('status')} {e.run.get('error')}"
        for e in ended.values()
        if e.run.get("status") != "completed"
    ][:3]


async def _batch(
    bench: Bench, name: str, workflow: str, inputs: list[Any], extra: JSON | None = None
) -> tuple[Result, dict[str, Ended], list[tuple[str, float]]]:
    """Start all ``inputs`` at once, wait for every run, and measure it as one row."""
    deadline = bench.deadline()
    with bench.monitor.measure() as usage:
        t0 = time.monotonic()
        started = await bench.start_many(workflow, inputs)
        ended = await bench.wait_many([r for r, _ in started], deadline)
        wall = time.monotonic() - t0
    done = _completed(ended)
    result = Result(
        name=name,
        attempted=len(inputs),
        completed=len(done),
        wall_s=wall,
        steps=sum(len(r.get("steps") or []) for r in done),
        latencies_ms=[v for r in done if (v := run_latency_ms(r)) is not None],
        usage=usage,
        extra=dict(extra or {}),
    )
    if failures := _failures(ended):
        result.extra["failures"] = failures
    return result, ended, started


# -- the workloads ------------------------------------------------------------------------


async def warmup(bench: Bench, runs: int = 10) -> None:
    """A few short runs first, so connections and caches are warm (not reported)."""
    started = await bench.start_many("steps", [{"n": 2}] * runs)
    await bench.wait_many([r for r, _ in started], bench.deadline())


async def steps(bench: Bench, runs: int, n: int) -> list[Result]:
    """``runs`` concurrent runs of ``n`` sequential trivial steps."""
    result, _, _ = await _batch(
        bench, "steps", "steps", [{"n": n}] * runs, {"steps_per_run": n, "concurrent_runs": runs}
    )
    return [result]


async def keyed(bench: Bench, runs: int, keys: int, n: int) -> list[Result]:
    """``runs`` runs of ``n`` steps over ``keys`` concurrency key values, one run at a time
    per value (``Concurrency(limit=1, key=...)``): beside ``steps``, what the per-key cap
    costs."""
    inputs = [{"n": n, "key": f"k{i % keys}"} for i in range(runs)]
    extra = {"steps_per_run": n, "runs": runs, "keys": keys, "limit_per_key": 1}
    result, _, _ = await _batch(bench, "keyed", "keyed", inputs, extra)
    return [result]


async def latency(bench: Bench, repeats: int, n: int) -> list[Result]:
    """One run of ``n`` steps at a time, ``repeats`` times: the latency of a lone run."""
    deadline = bench.deadline()
    client_ms: list[float] = []
    runs: list[JSON] = []
    with bench.monitor.measure() as usage:
        t0 = time.monotonic()
        for _ in range(repeats):
            began = time.monotonic()
            started = await bench.start_many("steps", [{"n": n}])
            ended = await bench.wait_many([r for r, _ in started], deadline)
            for e in ended.values():
                runs.append(e.run)
                if e.run.get("status") == "completed":
                    client_ms.append((time.monotonic() - began) * 1000)
        wall = time.monotonic() - t0
    done = [r for r in runs if r.get("status") == "completed"]
    return [
        Result(
            name="steps-1",
            attempted=repeats,
            completed=len(done),
            wall_s=wall,
            steps=sum(len(r.get("steps") or []) for r in done),
            latencies_ms=[v for r in done if (v := run_latency_ms(r)) is not None],
            usage=usage,
            extra={
                "steps_per_run": n,
                "runs_one_at_a_time": repeats,
                "client_latency_ms": summary(client_ms),
            },
        )
    ]


async def fanout(bench: Bench, width: int) -> list[Result]:
    """One run gathering ``width`` parallel steps."""
    extra = {"parallel_steps": width}
    result, _, _ = await _batch(bench, "fanout", "fanout", [{"n": width}], extra)
    return [result]


async def sleep(bench: Bench, runs: int, ms: int) -> list[Result]:
    """``runs`` runs sleeping ``ms``; lateness = ``ctx.now`` after minus (before + ``ms``)."""
    result, ended, _ = await _batch(
        bench, "sleep", "sleep", [{"ms": ms}] * runs, {"sleep_ms": ms, "concurrent_runs": runs}
    )
    late: list[float] = []
    late_wake: list[float] = []
    for run in _completed(ended):
        out = run["output"]
        after = ts(out["after"])
        late.append((after - ts(out["before"]) - ms / 1000) * 1000)
        nap = next((s for s in run.get("steps") or [] if s["name"] == "nap"), None)
        if nap is not None and nap.get("wakeAt"):
            late_wake.append((after - ts(nap["wakeAt"])) * 1000)
    result.extra["lateness_ms"] = summary(late)
    result.extra["lateness_vs_wakeAt_ms"] = summary(late_wake)
    return [result]


async def callback(bench: Bench, runs: int) -> list[Result]:
    """``runs`` runs waiting on a callback, all completed by POST to their signed URLs.

    The runs are started and left to suspend (every callback URL announced to the app, no
    invocation in flight); then each callback is POSTed and the run's ``endedAt`` is compared
    with the time the POST was sent.
    """
    deadline = bench.deadline()
    await bench.reset_app_stats()
    posted: dict[str, float] = {}
    post_ms: list[float] = []
    with bench.monitor.measure() as usage:
        t0 = time.monotonic()
        started = await bench.start_many("callback", [None] * runs)
        ids = {r for r, _ in started}
        suspended = await bench.settle(
            deadline, lambda stats: ids <= set(stats["callbacks"]) or not ids
        )
        t_suspended = time.monotonic()
        urls: dict[str, str] = (await bench.app_stats())["callbacks"]
        gate = asyncio.Semaphore(START_CONCURRENCY)

        async def complete(run_id: str) -> None:
            async with gate:
                at = time.time()
                began = time.monotonic()
                try:
                    await bench.api.complete_callback(urls[run_id], {"ok": True})
                except (stepline.ApiError, httpx.HTTPError) as exc:
                    bench._error(f"callback {run_id}: {exc!r}")
                    return
                post_ms.append((time.monotonic() - began) * 1000)
                posted[run_id] = at

        await asyncio.gather(*(complete(r) for r in ids if r in urls))
        ended = await bench.wait_many(list(posted), deadline)
        wall = time.monotonic() - t0
    done = _completed(ended)
    to_end = [(ts(r["endedAt"]) - posted[r["id"]]) * 1000 for r in done if r["id"] in posted]
    seen = [(e.seen_at - posted[i]) * 1000 for i, e in ended.items() if i in posted]
    result = Result(
        name="callback",
        attempted=runs,
        completed=len(done),
        wall_s=wall,
        steps=sum(len(r.get("steps") or []) for r in done),
        latencies_ms=[v for r in done if (v := run_latency_ms(r)) is not None],
        usage=usage,
        extra={
            "concurrent_runs": runs,
            "all_suspended": suspended,
            "suspend_s": round(t_suspended - t0, 2),
            "completion_to_ended_ms": summary(to_end),
            "completion_to_seen_ms": summary(seen),
            "post_ms": summary(post_ms),
        },
    )
    if failures := _failures(ended):
        result.extra["failures"] = failures
    return [result]


async def long(bench: Bench, sizes: Sequence[int]) -> list[Result]:
    """One run of N steps per size: bytes sent to the app and time, in total and per step."""
    results: list[Result] = []
    for n in sizes:
        await bench.settle(bench.deadline())
        await bench.reset_app_stats()
        result, _, _ = await _batch(bench, f"long-{n}", "long", [{"n": n}], {"steps_per_run": n})
        stats = await bench.app_stats()
        to_app = stats["invoke_request_bytes"] + stats["progress_response_bytes"]
        from_app = stats["invoke_response_bytes"] + stats["progress_request_bytes"]
        result.extra.update(
            {
                "bytes_to_app": to_app,
                "bytes_to_app_per_step": round(to_app / n, 1),
                "bytes_from_app": from_app,
                "bytes_from_app_per_step": round(from_app / n, 1),
                "invocations": stats["invocations"],
                "progress_calls": stats["progress_calls"],
                "ms_per_step": round(result.wall_s * 1000 / n, 3),
            }
        )
        results.append(result)
    if len(results) > 1:
        first, last = results[0].extra, results[-1].extra
        growth = {
            "bytes_per_step_ratio": round(
                last["bytes_to_app_per_step"] / max(first["bytes_to_app_per_step"], 1e-9), 2
            ),
            "ms_per_step_ratio": round(last["ms_per_step"] / max(first["ms_per_step"], 1e-9), 2),
        }
        results[-1].extra[f"growth_vs_long_{sizes[0]}"] = growth
    return results


def _per_invocation(result: Result, stats: JSON, iterations: int) -> None:
    """Bytes the orchestrator sent the app per invocation (bodies and progress answers), and
    time per iteration."""
    to_app = stats["invoke_request_bytes"] + stats["progress_response_bytes"]
    invocations = max(stats["invocations"], 1)
    result.extra.update(
        {
            "iterations": iterations,
            "invocations": stats["invocations"],
            "bytes_to_app": to_app,
            "bytes_to_app_per_invocation": round(to_app / invocations, 1),
            "largest_invoke_body": stats.get("largest_invoke_body", 0),
            "ms_per_iteration": round(result.wall_s * 1000 / max(iterations, 1), 3),
        }
    )


async def long_sleep(bench: Bench, sizes: Sequence[int], every: int = 0) -> list[Result]:
    """One run of N iterations of a step and a 10 ms sleep per size (each iteration is an
    invocation); with ``every``, the run continues as new after each ``every`` iterations."""
    results: list[Result] = []
    suffix = f"-can{every}" if every else ""
    for n in sizes:
        await bench.settle(bench.deadline())
        await bench.reset_app_stats()
        result, _, _ = await _batch(
            bench, f"long-sleep-{n}{suffix}", "long-sleep", [{"n": n, "every": every}]
        )
        _per_invocation(result, await bench.app_stats(), n)
        results.append(result)
    if len(results) > 1:
        first, last = results[0].extra, results[-1].extra
        results[-1].extra[f"growth_vs_{results[0].name}"] = {
            "bytes_per_invocation_ratio": round(
                last["bytes_to_app_per_invocation"]
                / max(first["bytes_to_app_per_invocation"], 1e-9),
                2,
            ),
            "ms_per_iteration_ratio": round(
                last["ms_per_iteration"] / max(first["ms_per_iteration"], 1e-9), 2
            ),
        }
    return results


async def big(bench: Bench, steps: int = 20, kb: int = 900) -> list[Result]:
    """One run of ``steps`` steps of ``kb`` KB each, then a sleep: large results by reference."""
    await bench.settle(bench.deadline())
    await bench.reset_app_stats()
    result, _, _ = await _batch(bench, "big", "big", [{"n": steps, "kb": kb}])
    _per_invocation(result, await bench.app_stats(), steps)
    return [result]


async def idle(bench: Bench, runs: int, window: float, sleep_ms: int = 3_600_000) -> list[Result]:
    """``runs`` runs sleeping (an hour); then the processes' CPU and memory over ``window`` s."""
    deadline = bench.deadline()
    await bench.reset_app_stats()
    with bench.monitor.measure() as usage:
        t0 = time.monotonic()
        started = await bench.start_many("idle", [{"ms": sleep_ms}] * runs)
        t_created = time.monotonic()
        count = len(started)
        await bench.settle(deadline, lambda stats: stats["idle_reached"] >= count)
        t_settled = time.monotonic()
        reached = int((await bench.app_stats())["idle_reached"])
        span = bench.monitor.begin()
        await asyncio.sleep(window)
        quiet = bench.monitor.end(span)
    per_min = 60.0 / window
    result = Result(
        name="idle",
        attempted=runs,
        completed=min(reached, count),
        wall_s=t_settled - t0,
        steps=min(reached, count),
        latencies_ms=[],
        usage=usage,
        extra={
            "sleeping_runs": min(reached, count),
            "create_s": round(t_created - t0, 2),
            "create_per_s": round(count / max(t_created - t0, 1e-9), 1),
            "settle_s": round(t_settled - t_created, 2),
            "window_s": window,
            "cpu_s_per_min": {n: round(u.cpu_s * per_min, 2) for n, u in quiet.items()},
            "rss_mb_end": {n: u.end_rss_mb for n, u in quiet.items()},
            "peak_rss_mb_window": {n: u.peak_rss_mb for n, u in quiet.items()},
        },
    )
    return [result]
