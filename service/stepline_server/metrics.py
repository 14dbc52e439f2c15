"""Prometheus metrics for ``/metrics`` (prometheus-client), safe across ``serve --workers``.

Each :class:`Metrics` owns its registry, so orchestrators in one process (tests) count apart.
Several worker processes share counts through prometheus-client's multiprocess mode: the
``serve`` command points ``PROMETHEUS_MULTIPROC_DIR`` at a fresh folder before this module is
imported (:mod:`stepline_server.multiproc`), each process writes its values there, and the
worker answering a scrape adds them up. Facts about the database (the backlog) are read at
scrape time by whichever worker answers, never summed.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily

from stepline_server.multiproc import multiprocess_mode

# No *_created series: they double what is scraped for nothing.
disable_created_metrics()  # type: ignore[no-untyped-call]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# From 1 ms to a minute: steps and invocations are short, a slow app is not.
_DURATIONS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# Timers fire a few ms late when healthy; seconds late means the dispatcher is behind.
_LATENESS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_BATCH = (1, 2, 4, 8, 16, 32, 64, 128)
_ENDED_STEP = {"completed", "failed", "retrying"}
_MAX_OPEN_STEPS = 50_000  # steps seen starting, kept to time them: bounded, oldest dropped


@dataclass(frozen=True)
class Sample:
    """What the database says at scrape time."""

    backlog: int  # runs due now and not yet invoked
    oldest_due_seconds: float  # how long the oldest of them has been due


class Metrics:
    """The orchestrator's metrics; one method per thing measured."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._runs_started = Counter(
            "stepline_runs_started", "Runs started.", ["workflow", "trigger"], registry=r
        )
        self._runs_ended = Counter(
            "stepline_runs_ended", "Runs ended, by final status.", ["workflow", "status"],
            registry=r,
        )  # fmt: skip
        self._invocations = Counter(
            "stepline_invocations", "Invocations ended, by outcome.", ["outcome"], registry=r
        )
        self._invocation_seconds = Histogram(
            "stepline_invocation_duration_seconds",
            "How long the app took to answer an invocation, by outcome.",
            ["outcome"],
            buckets=_DURATIONS,
            registry=r,
        )
        self._step_seconds = Histogram(
            "stepline_step_duration_seconds",
            "From a step's start to its result (completed, failed or retrying), as committed.",
            ["kind", "status"],
            buckets=_DURATIONS,
            registry=r,
        )
        self._delivery_failures = Counter(
            "stepline_delivery_failures",
            "Invocations that could not be delivered to the app (tried again later).",
            registry=r,
        )
        self._timer_lateness = Histogram(
            "stepline_timer_lateness_seconds",
            "How late a sleep's end or a wait's timeout was acted on: the app called after it.",
            buckets=_LATENESS,
            registry=r,
        )
        self._takeovers = Counter(
            "stepline_lease_takeovers",
            "Runs claimed while another invocation's lease had run out (its orchestrator "
            "died or stalled).",
            registry=r,
        )
        self._repaired = Counter(
            "stepline_runs_repaired",
            "Runs found with no way forward (no live lease, no due time, no open wait) and "
            "invoked again by the way-forward check.",
            ["workflow"],
            registry=r,
        )
        self._progress_calls = Counter(
            "stepline_progress_calls",
            "Step updates committed: the SDK's progress calls and invocations' last updates.",
            registry=r,
        )
        self._commits = Counter(
            "stepline_progress_commits", "Group commits that wrote progress calls.", registry=r
        )
        self._batch = Histogram(
            "stepline_group_commit_size",
            "Progress calls committed together in one statement.",
            buckets=_BATCH,
            registry=r,
        )
        self._inflight = Gauge(
            "stepline_invocations_inflight",
            "Invocations this orchestrator is running.",
            multiprocess_mode="livesum",
            registry=r,
        )
        self._pool_size = Gauge(
            "stepline_pool_connections",
            "Database connections open in the pool.",
            multiprocess_mode="livesum",
            registry=r,
        )
        self._pool_busy = Gauge(
            "stepline_pool_connections_in_use",
            "Database connections taken from the pool now.",
            multiprocess_mode="livesum",
            registry=r,
        )
        self._pool_max = Gauge(
            "stepline_pool_connections_max",
            "The pool's largest size.",
            multiprocess_mode="livesum",
            registry=r,
        )
        self._open_steps: dict[tuple[uuid.UUID, str], float] = {}

    def run_started(self, workflow: str, trigger: str, n: int = 1) -> None:
        self._runs_started.labels(workflow, trigger).inc(n)

    def run_ended(self, workflow: str, status: str) -> None:
        self._runs_ended.labels(workflow, status).inc()

    def invocation_ended(self, outcome: str, duration_ms: int | None) -> None:
        self._invocations.labels(outcome).inc()
        if duration_ms is not None:
            self._invocation_seconds.labels(outcome).observe(duration_ms / 1000)

    def delivery_failed(self) -> None:
        self._delivery_failures.inc()

    def timer_late(self, seconds: float) -> None:
        self._timer_lateness.observe(max(0.0, seconds))

    def lease_taken_over(self, n: int = 1) -> None:
        if n:
            self._takeovers.inc(n)

    def run_repaired(self, workflow: str) -> None:
        self._repaired.labels(workflow).inc()

    def progress_committed(self, calls: int, *, grouped: bool = True) -> None:
        """``calls`` progress calls committed in one statement (``grouped``) or alone."""
        self._progress_calls.inc(calls)
        if grouped:
            self._commits.inc()
            self._batch.observe(calls)

    def steps_changed(self, run_id: uuid.UUID, changes: Iterable[tuple[str, str, str]]) -> None:
        """Time steps from the commit of their start to the commit of their result;
        ``changes``: (name, kind, status) as committed. A result whose start another worker
        committed is not timed."""
        now = time.monotonic()
        for name, kind, status in changes:
            key = (run_id, name)
            if status == "running":
                if len(self._open_steps) >= _MAX_OPEN_STEPS:
                    self._open_steps.pop(next(iter(self._open_steps)))
                self._open_steps[key] = now
            elif status in _ENDED_STEP and (start := self._open_steps.pop(key, None)):
                self._step_seconds.labels(kind, status).observe(now - start)

    def sample_process(self, inflight: int, pool_size: int, pool_idle: int, pool_max: int) -> None:
        """This process's gauges, as they are now."""
        self._inflight.set(inflight)
        self._pool_size.set(pool_size)
        self._pool_busy.set(pool_size - pool_idle)
        self._pool_max.set(pool_max)

    def render(self, sample: Sample) -> bytes:
        """The Prometheus text format: this process's (or every worker's) metrics, then the
        database's gauges."""
        if multiprocess_mode():
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
            text = generate_latest(registry)
        else:
            text = generate_latest(self.registry)
        return text + generate_latest(_Database(sample))  # type: ignore[arg-type,unused-ignore]


class _Database:
    """A collector of the gauges read from the database for one scrape."""

    def __init__(self, sample: Sample) -> None:
        self.sample = sample

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "stepline_runs_due",
            "Runs due now and not yet invoked (the backlog), on the whole database.",
            value=self.sample.backlog,
        )
        yield GaugeMetricFamily(
            "stepline_runs_due_oldest_seconds",
            "How long the longest-waiting due run has been due (0 when none is).",
            value=self.sample.oldest_due_seconds,
        )
