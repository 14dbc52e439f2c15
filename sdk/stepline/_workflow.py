"""The workflow registry: :class:`Stepline` (one per app) and its ``workflow`` decorator.

It records what the app hosts and answers ``describe``; running an invocation is the runtime's
(:class:`stepline._runtime.Runtime`: replay, parked executions, kept histories), which it owns
and hands each ``invoke`` to."""

from __future__ import annotations

import inspect
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

from stepline import protocol
from stepline._definitions import (
    WORKFLOW_NAME,
    Batch,
    Concurrency,
    Debounce,
    RateLimit,
    Retries,
    WorkflowDef,
)
from stepline._deployment import code_deployment_id, detect_deployment_id
from stepline._durations import Duration, to_ms
from stepline._handler import Handler
from stepline._history import DEFAULT_MAX_BYTES, HistoryCache
from stepline._parked import DEFAULT_MAX_RUNS, ParkedRuns
from stepline._payloads import Codec, Payloads, S3Store
from stepline._runtime import Runtime
from stepline._transport import Transport
from stepline._types import signature_of
from stepline._version import __version__

if TYPE_CHECKING:
    from stepline._context import Context
    from stepline._engine import Invocation

__all__ = [
    "WORKFLOW_NAME",
    "Batch",
    "Concurrency",
    "Debounce",
    "RateLimit",
    "Retries",
    "Stepline",
    "WorkflowDef",
    "__version__",
]

WorkflowFn = Callable[["Context", Any], Awaitable[Any]]
F = TypeVar("F", bound=WorkflowFn)


def _schedule(
    value: str | dict[str, Any] | protocol.ScheduleSpec | None,
) -> protocol.ScheduleSpec | None:
    if value is None or isinstance(value, protocol.ScheduleSpec):
        return value
    if isinstance(value, str):
        return protocol.ScheduleSpec(cron=value)
    if "sla" in value:  # a duration, like every duration the SDK takes
        sla = value["sla"]
        value = {k: v for k, v in value.items() if k != "sla"}
        value["slaMs"] = None if sla is None else to_ms(sla)
    return protocol.ScheduleSpec.model_validate(value)


def _secrets(value: str | Sequence[str] | None) -> tuple[str, ...]:
    if value is None:
        value = os.environ.get("STEPLINE_SIGNING_SECRET", "")
    parts = value.split(",") if isinstance(value, str) else list(value)
    return tuple(p.strip() for p in parts if p and p.strip())


def _check_gathering(
    on_event: str | None,
    singleton_key: str | None,
    debounce: Debounce | None,
    batch: Batch | None,
) -> None:
    """Refuse a debounce or batch option that cannot work (the orchestrator checks the same
    at sync)."""
    if debounce is not None and not isinstance(debounce, Debounce):
        raise TypeError("debounce must be a stepline.Debounce")
    if batch is not None and not isinstance(batch, Batch):
        raise TypeError("batch must be a stepline.Batch")
    if debounce is not None and batch is not None:
        raise ValueError("a workflow takes debounce or batch, not both")
    if batch is not None and on_event is None:
        raise ValueError("batch gathers the events that start the workflow: give on_event too")
    if singleton_key is not None and (debounce is not None or batch is not None):
        raise ValueError("singleton_key cannot be combined with debounce or batch")


class Stepline:
    """An app's workflows, its signing secrets and its ASGI handler.

    ``signing_secret``: one secret or several (newest first; all verify); default
    ``STEPLINE_SIGNING_SECRET`` (comma separated). ``http_client``: the client used for
    progress calls to the orchestrator (default: one shared keep-alive client, made lazily).
    ``deployment_id``: sent with every answer; default ``STEPLINE_DEPLOYMENT_ID``, else the
    hosting platform's id, else one derived from the workflows' source (``code-…``).
    ``history_cache_bytes``: how much of its runs' histories the app keeps between invocations
    (default 64 MiB), so each invocation brings only the steps that changed; 0 keeps none.
    ``parked_runs``: how many runs suspended on sleeps alone the app keeps running in memory
    (default 256, for at most 10 minutes each), so the invocation after the sleep goes on
    without replaying; 0 keeps none. Parked runs and the progress calls' connections are kept
    per event loop: a host that runs each request on a fresh loop starts afresh on each
    (``docs/serverless.md``). ``codec``: a :class:`stepline.Encryption`, which encrypts every
    value the app sends the orchestrator and decrypts what it reads; ``store``: a
    :class:`stepline.S3Store`, where values over its size go instead (``docs/payloads.md``).
    """

    def __init__(
        self,
        signing_secret: str | Sequence[str] | None = None,
        *,
        deployment_id: str | None = None,
        http_client: httpx.AsyncClient | None = None,
        history_cache_bytes: int = DEFAULT_MAX_BYTES,
        parked_runs: int = DEFAULT_MAX_RUNS,
        codec: Codec | None = None,
        store: S3Store | None = None,
    ) -> None:
        self.signing_secrets: tuple[str, ...] = _secrets(signing_secret)
        self.payloads = Payloads(codec, store)
        self.runtime = Runtime(http_client, history_cache_bytes, parked_runs, self.payloads)
        self._named_deployment_id = deployment_id or detect_deployment_id()
        self._code_deployment_id: str | None = None  # derived when first needed
        self._workflows: dict[str, WorkflowDef] = {}

    @property
    def histories(self) -> HistoryCache:
        """The runs' histories kept between invocations (the runtime's)."""
        return self.runtime.histories

    @property
    def parked(self) -> ParkedRuns[Invocation]:
        """The executions parked between invocations (the runtime's)."""
        return self.runtime.parked

    @property
    def transport(self) -> Transport:
        """The progress calls' transport (the runtime's)."""
        return self.runtime.transport

    def workflow(
        self,
        name: str,
        *,
        retries: Retries | int | None = None,
        timeout: Duration | None = None,
        concurrency: int | Concurrency | None = None,
        schedule: str | dict[str, Any] | protocol.ScheduleSpec | None = None,
        delivery_window: Duration | None = None,
        on_event: str | None = None,
        singleton_key: str | None = None,
        rate_limit: RateLimit | None = None,
        debounce: Debounce | None = None,
        batch: Batch | None = None,
    ) -> Callable[[F], F]:
        """Register ``async def fn(ctx, input)`` as the workflow ``name``.

        ``concurrency``: at most this many invocations of the workflow run at once (a run that
        sleeps or waits holds no slot); the orchestrator holds the others back, oldest first.
        ``delivery_window``: how long the orchestrator keeps trying to invoke a run of it while
        the app cannot be reached (default: its ``STEPLINE_DELIVERY_WINDOW``, 24 h); failed
        deliveries never use ``retries``. ``concurrency`` may be
        ``Concurrency(limit=N, key="userId")``: at most N runs per value of that input field.
        ``on_event``: every event of that name starts a run, with the event's data as input.
        ``singleton_key``: while a run with that input field's value has not ended, starting
        another answers the existing run. ``rate_limit``: ``RateLimit(limit=N, period="1m")``
        lets at most N runs start in any window of that length (per value of its ``key``
        field, when given); the others wait their turn. An ``input`` parameter annotated with
        a pydantic model receives that model (and inputs are checked against its schema before
        a run is made); a return annotation with a model is dumped to JSON.
        ``debounce``: ``Debounce(period="5s", key="userId", max_wait="1m")`` makes the starts
        of one key value close together one run, started with the last input. ``batch``
        (with ``on_event``): ``Batch(size=100, wait="5s")`` gathers the events into runs whose
        input is the list of their data. See ``docs/debounce-and-batches.md``.
        """
        if not isinstance(name, str) or not WORKFLOW_NAME.match(name):
            raise ValueError(f"workflow name {name!r} must match {WORKFLOW_NAME.pattern}")
        if name in self._workflows:
            raise ValueError(f"workflow {name!r} is already registered")
        policy = Retries(attempts=retries) if isinstance(retries, int) else retries or Retries()
        limit = concurrency.limit if isinstance(concurrency, Concurrency) else concurrency
        concurrency_key = concurrency.key if isinstance(concurrency, Concurrency) else None
        if limit is not None and limit < 1:
            raise ValueError("concurrency must be at least 1")
        if rate_limit is not None and not isinstance(rate_limit, RateLimit):
            raise TypeError("rate_limit must be a stepline.RateLimit")
        if rate_limit is not None and limit is not None:
            raise ValueError("a workflow takes concurrency or rate_limit, not both")
        _check_gathering(on_event, singleton_key, debounce, batch)
        timeout_ms = None if timeout is None else to_ms(timeout)
        window_ms = None if delivery_window is None else to_ms(delivery_window)
        spec = _schedule(schedule)

        def register(fn: F) -> F:
            probe: Any = fn  # keeps mypy from narrowing F away
            if not inspect.iscoroutinefunction(probe):
                raise TypeError(f"workflow {name!r} must be an async function (async def)")
            if name in self._workflows:
                raise ValueError(f"workflow {name!r} is already registered")
            self._code_deployment_id = None  # the code changed: derive the id again
            self._workflows[name] = WorkflowDef(
                name=name,
                fn=fn,
                retries=policy,
                timeout_ms=timeout_ms,
                concurrency=limit,
                schedule=spec,
                delivery_window_ms=window_ms,
                signature=signature_of(fn),
                on_event=on_event,
                concurrency_key=concurrency_key,
                singleton_key=singleton_key,
                rate_limit=rate_limit,
                debounce=debounce,
                batch=batch,
            )
            return fn

        return register

    @property
    def deployment_id(self) -> str:
        """Which deployment answers: the one given or found in the environment, else
        ``code-`` and a hash of the registered workflows' source."""
        if self._named_deployment_id is not None:
            return self._named_deployment_id
        if self._code_deployment_id is None:
            self._code_deployment_id = code_deployment_id(
                (w.name, w.fn) for w in self._workflows.values()
            )
        return self._code_deployment_id

    @property
    def workflows(self) -> Mapping[str, WorkflowDef]:
        """The registered workflows by name."""
        return dict(self._workflows)

    def get(self, name: str) -> WorkflowDef | None:
        """The workflow registered as ``name``, if any."""
        return self._workflows.get(name)

    def describe(self) -> protocol.DescribeResponse:
        """The app's answer to ``describe``."""
        return protocol.DescribeResponse(
            workflows=[w.info() for w in self._workflows.values()],
            deploymentId=self.deployment_id,
            sdkVersion=__version__,
            protocolVersion=protocol.PROTOCOL_VERSION,
        )

    def asgi(self) -> Handler:
        """The pure ASGI app to mount (any path): answers the orchestrator's signed calls."""
        return Handler(self)

    async def invoke(
        self, request: protocol.InvokeRequest, traceparent: str | None = None
    ) -> protocol.InvokeResponse:
        """Run one invocation (replay, then continue) and return its answer; its steps' spans
        nest under ``traceparent`` (W3C) when the app uses OpenTelemetry.

        Raises ``LookupError`` for an unknown workflow and
        :class:`stepline._transport.OrchestratorUnavailable` when progress calls keep failing.
        """
        definition = self._workflows.get(request.workflow)
        if definition is None:
            raise LookupError(f"workflow {request.workflow!r} is not registered in this app")
        response = await self.runtime.invoke(definition, request, traceparent)
        response.deployment_id = self.deployment_id
        response.protocol_version = protocol.PROTOCOL_VERSION
        return response

    async def aclose(self) -> None:
        """Let parked executions go and close the HTTP client used for progress calls (when
        Stepline made it)."""
        await self.runtime.aclose()
