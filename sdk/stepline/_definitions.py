"""A workflow's definition: its function and options (:class:`WorkflowDef`), and the option
types a user passes to ``@sl.workflow`` (:class:`Retries`, :class:`Concurrency`,
:class:`RateLimit`, :class:`Debounce`, :class:`Batch`). Plain data: the registry
(:mod:`stepline._workflow`) makes them and the runtime (:mod:`stepline._engine`) reads them;
this module imports neither."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from stepline import protocol
from stepline._durations import Duration, to_ms
from stepline._types import Signature

WORKFLOW_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

WorkflowFn = Callable[..., Awaitable[Any]]
"""``async def fn(ctx, input)``: the registry's decorator types its arguments."""


@dataclass(frozen=True)
class Retries:
    """How often a failing step runs: ``attempts`` counts every try, the first included. A try
    whose outcome was never recorded (the app, the orchestrator or the database went away
    mid-step) runs again as the same attempt: that is a delivery failure, not a used attempt.

    The delay before try ``n + 1`` is ``min(max_delay, initial_delay * factor ** (n - 1))``.
    """

    attempts: int = 3
    initial_delay: Duration = "1s"
    max_delay: Duration = "1h"
    factor: float = 2.0

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise TypeError("Retries.attempts must be an int")
        if self.attempts < 1:
            raise ValueError("Retries.attempts must be at least 1 (it counts the first try)")
        if self.factor < 1:
            raise ValueError("Retries.factor must be at least 1")
        to_ms(self.initial_delay), to_ms(self.max_delay)  # validate early

    def delay_ms(self, attempt: int) -> int:
        """The delay after failed try ``attempt`` (counted from 1)."""
        delay = to_ms(self.initial_delay) * self.factor ** max(0, attempt - 1)
        return int(min(to_ms(self.max_delay), delay))

    def policy(self) -> protocol.RetryPolicy:
        """As the wire protocol describes it."""
        return protocol.RetryPolicy(
            attempts=self.attempts,
            initialDelayMs=to_ms(self.initial_delay),
            maxDelayMs=to_ms(self.max_delay),
            factor=self.factor,
        )


@dataclass(frozen=True)
class Concurrency:
    """At most ``limit`` runs of a workflow are invoked at once; with ``key`` (an input field),
    at most ``limit`` per value of that field, while runs of other values go on."""

    limit: int
    key: str | None = None


@dataclass(frozen=True)
class RateLimit:
    """At most ``limit`` runs of a workflow start (are invoked for the first time) in any
    window of ``period`` (a sliding window); with ``key`` (an input field), at most ``limit``
    per value of that field. The runs beyond it wait their turn; none is dropped."""

    limit: int
    period: Duration = "1m"
    key: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.limit, bool) or not isinstance(self.limit, int):
            raise TypeError("RateLimit.limit must be an int")
        if self.limit < 1:
            raise ValueError("RateLimit.limit must be at least 1")
        if to_ms(self.period) < 1:
            raise ValueError("RateLimit.period must be a duration of at least 1 ms")
        if self.key is not None and (not isinstance(self.key, str) or not self.key):
            raise ValueError("RateLimit.key must be the name of an input field")

    def spec(self) -> protocol.RateLimitSpec:
        """As the wire protocol describes it."""
        return protocol.RateLimitSpec(limit=self.limit, periodMs=to_ms(self.period), key=self.key)


def _key_field(owner: str, key: str | None) -> None:
    if key is not None and (not isinstance(key, str) or not key):
        raise ValueError(f"{owner}.key must be the name of a top-level field, or None")


def _positive_ms(owner: str, value: Duration) -> int:
    try:
        ms = to_ms(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{owner}: {exc}") from None
    if ms < 1:
        raise ValueError(f"{owner} must be a duration of at least 1 ms, not {value!r}")
    return ms


@dataclass(frozen=True)
class Debounce:
    """Starts of a workflow (``POST /v1/runs`` or its ``on_event``) with the same value of the
    input field ``key`` (every start, when ``key`` is None) within ``period`` of each other
    become one run, started with the last start's input ``period`` after the last start, and
    at most ``max_wait`` after the first (no cap when None). Every start answers that run."""

    period: Duration
    key: str | None = None
    max_wait: Duration | None = None

    def __post_init__(self) -> None:
        period = _positive_ms("Debounce.period", self.period)
        _key_field("Debounce", self.key)
        if self.max_wait is not None:
            max_wait = _positive_ms("Debounce.max_wait", self.max_wait)
            if max_wait < period:
                raise ValueError(
                    f"Debounce.max_wait ({self.max_wait!r}) must be at least the period"
                    f" ({self.period!r})"
                )

    def spec(self) -> protocol.DebounceSpec:
        """As the wire protocol describes it."""
        max_wait = None if self.max_wait is None else to_ms(self.max_wait)
        return protocol.DebounceSpec(periodMs=to_ms(self.period), key=self.key, maxWaitMs=max_wait)


@dataclass(frozen=True)
class Batch:
    """The events that start a workflow (its ``on_event``) are gathered into one run whose
    input is the list of their data (in the order received): at most ``size`` of them, started
    when ``size`` are there or ``wait`` after the first; with ``key`` (a field of the events'
    data), a batch per value of it."""

    size: int
    wait: Duration = "5s"
    key: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int):
            raise TypeError("Batch.size must be an int")
        if self.size < 1:
            raise ValueError("Batch.size must be at least 1")
        _positive_ms("Batch.wait", self.wait)
        _key_field("Batch", self.key)

    def spec(self) -> protocol.BatchSpec:
        """As the wire protocol describes it."""
        return protocol.BatchSpec(size=self.size, waitMs=to_ms(self.wait), key=self.key)


@dataclass(frozen=True)
class WorkflowDef:
    """A registered workflow: its function and options."""

    name: str
    fn: WorkflowFn
    retries: Retries = field(default_factory=Retries)
    timeout_ms: int | None = None
    concurrency: int | None = None
    schedule: protocol.ScheduleSpec | None = None
    delivery_window_ms: int | None = None
    signature: Signature = field(default_factory=Signature)
    on_event: str | None = None
    concurrency_key: str | None = None
    singleton_key: str | None = None
    rate_limit: RateLimit | None = None
    debounce: Debounce | None = None
    batch: Batch | None = None

    def info(self) -> protocol.WorkflowInfo:
        """As ``describe`` reports it."""
        return protocol.WorkflowInfo(
            name=self.name,
            retries=self.retries.policy(),
            timeoutMs=self.timeout_ms,
            concurrency=self.concurrency,
            schedule=self.schedule,
            deliveryWindowMs=self.delivery_window_ms,
            inputSchema=self.signature.input_schema(),
            outputSchema=self.signature.output_schema(),
            onEvent=self.on_event,
            concurrencyKey=self.concurrency_key,
            singletonKey=self.singleton_key,
            rateLimit=self.rate_limit.spec() if self.rate_limit else None,
            debounce=self.debounce.spec() if self.debounce else None,
            batch=self.batch.spec() if self.batch else None,
        )
