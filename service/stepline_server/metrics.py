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
# A batch run gathers from one event to thousands.
_GATHERED = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 5000)
# Runs take from milliseconds to days (sleeps, approvals): up to a week.
_RUN_DURATIONS = (
    0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400, 86400, 604800,
)  # fmt: skip
# A scheduled run starts a few ms after its tick when healthy; minutes late is an outage.
_START_LAG = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
MAX_WORKFLOW_LABELS = 200
"""Distinct ``workflow`` label values a metric takes at most; the rest count as ``_other``."""
OTHER_WORKFLOW = "_other"
_MAX_RUN_WORKFLOWS = 50_000  # runs being invoked, kept to label their steps: bounded
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
            "How long the app took to answer an invocation, by workflow and outcome.",
            ["workflow", "outcome"],
            buckets=_DURATIONS,
            registry=r,
        )
        self._step_seconds = Histogram(
            "stepline_step_duration_seconds",
            "From a step's start to its result (completed, failed or retrying), as committed, "
            "by workflow, step kind and status.",
            ["workflow", "kind", "status"],
            buckets=_DURATIONS,
            registry=r,
        )
        self._run_seconds = Histogram(
            "stepline_run_duration_seconds",
            "From a run's creation to its end, by workflow and final status.",
            ["workflow", "status"],
            buckets=_RUN_DURATIONS,
            registry=r,
        )
        self._start_lag = Histogram(
            "stepline_schedule_start_lag_seconds",
            "From a schedule's tick to the start of its run, by workflow.",
            ["workflow"],
            buckets=_START_LAG,
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
        self._absorbed = Counter(
            "stepline_debounce_absorbed",
            "Starts a debounce folded into a run already gathering (the run's own first start "
            "is not counted).",
            ["workflow"],
            registry=r,
        )
        self._gatherings_fired = Counter(
            "stepline_gatherings_fired",
            "Debounced and batch runs made due when their gathering fired (kind: debounce or "
            "batch).",
            ["workflow", "kind"],
            registry=r,
        )
        self._gathered = Histogram(
            "stepline_gathered_starts",
            "How many starts (debounce) or events (batch) a run gathered when it fired.",
            ["workflow", "kind"],
            buckets=_GATHERED,
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
        self._run_workflows: dict[uuid.UUID, str] = {}
        self._workflows: set[str] = set()

    def _workflow(self, name: str) -> str:
        """``name`` as a label value: the first :data:`MAX_WORKFLOW_LABELS` names seen keep
        theirs, later ones count as ``_other`` (a label set that cannot grow without bound)."""
        if name in self._workflows:
            return name
        if len(self._workflows) >= MAX_WORKFLOW_LABELS:
            return OTHER_WORKFLOW
        self._workflows.add(name)
        return name

    def run_started(self, workflow: str, trigger: str, n: int = 1) -> None:
        """``n`` runs of ``workflow`` started (``trigger``: api, schedule, manual, event,
        parent, retry, bulk)."""
        if n:
            self._runs_started.labels(self._workflow(workflow), trigger).inc(n)

    def run_ended(self, workflow: str, status: str, seconds: float | None = None) -> None:
        """A run ended ``status``, ``seconds`` after it was created (when known)."""
        label = self._workflow(workflow)
        self._runs_ended.labels(label, status).inc()
        if seconds is not None:
            self._run_seconds.labels(label, status).observe(max(0.0, seconds))

    def schedule_started(self, workflow: str, lag_seconds: float) -> None:
        """A schedule's run started ``lag_seconds`` after its tick."""
        self._start_lag.labels(self._workflow(workflow)).observe(max(0.0, lag_seconds))

    def invocation_began(self, run_id: uuid.UUID, workflow: str) -> None:
        """An invocation of ``run_id`` (a run of ``workflow``) began: its steps are labelled so."""
        if len(self._run_workflows) >= _MAX_RUN_WORKFLOWS:
            self._run_workflows.pop(next(iter(self._run_workflows)))
        self._run_workflows[run_id] = workflow

    def invocation_ended(
        self,
        outcome: str,
        duration_ms: int | None,
        workflow: str = OTHER_WORKFLOW,
        run_id: uuid.UUID | None = None,
    ) -> None:
        self._invocations.labels(outcome).inc()
        if duration_ms is not None:
            label = self._workflow(workflow)
            self._invocation_seconds.labels(label, outcome).observe(duration_ms / 1000)
        if run_id is not None:  # its steps are observed by now; the next invocation says again
            self._run_workflows.pop(run_id, None)

    def delivery_failed(self) -> None:
        self._delivery_failures.inc()

    def timer_late(self, seconds: float) -> None:
        self._timer_lateness.observe(max(0.0, seconds))

    def lease_taken_over(self, n: int = 1) -> None:
        if n:
            self._takeovers.inc(n)

    def debounce_absorbed(self, workflow: str, n: int = 1) -> None:
        """``n`` starts of ``workflow`` joined a debounced run already gathering."""
        if n:
            self._absorbed.labels(self._workflow(workflow)).inc(n)

    def gathering_fired(self, workflow: str, kind: str, starts: int) -> None:
        """A debounced or batch run of ``workflow`` was made due, having gathered ``starts``."""
        label = self._workflow(workflow)
        self._gatherings_fired.labels(label, kind).inc()
        self._gathered.labels(label, kind).observe(starts)

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
                workflow = self._workflow(self._run_workflows.get(run_id, OTHER_WORKFLOW))
                self._step_seconds.labels(workflow, kind, status).observe(now - start)

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
