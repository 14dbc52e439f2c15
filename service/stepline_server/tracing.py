"""OpenTelemetry traces (the optional ``stepline[otel]`` extra): a span per run and per
invocation, and the W3C ``traceparent`` the app's step spans nest under.

A run's trace id is its id (the 128 bits of its UUID), so a run's trace is found from its id
alone, across invocations days apart and across orchestrators; its root span's id is derived
from it too. Invocation spans are children of that root while the run goes on; the root span
itself, from the run's creation to its end, is exported when the run ends (with
:class:`RunIds` as the provider's id generator, which ``configure`` installs). Without
opentelemetry installed every function here does nothing.
"""

from __future__ import annotations

import contextvars
import hashlib
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

try:
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags
except ImportError:  # pragma: no cover - the otel extra is not installed
    trace = None  # type: ignore[assignment]

TRACEPARENT = "traceparent"
_pinned: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "stepline_pinned_ids", default=None
)


def trace_id(run_id: uuid.UUID) -> str:
    """The run's trace id as W3C writes it (32 hex digits): its UUID without dashes."""
    return run_id.hex


def _root_span_id(run_id: uuid.UUID) -> int:
    return int.from_bytes(hashlib.sha256(run_id.bytes).digest()[:8], "big") or 1


def enabled() -> bool:
    """Whether spans go anywhere: opentelemetry is installed and a provider was set."""
    return trace is not None and not isinstance(
        trace.get_tracer_provider(), trace.ProxyTracerProvider
    )


def configure(service_name: str = "stepline") -> bool:
    """Export spans over OTLP when the standard variables ask for it (``OTEL_TRACES_EXPORTER``
    or an ``OTEL_EXPORTER_OTLP_*ENDPOINT``; the exporter reads the rest of ``OTEL_*`` itself)
    and no provider is set yet; whether tracing is on."""
    if trace is None or enabled():
        return enabled()
    wanted = os.environ.get("OTEL_TRACES_EXPORTER", "otlp" if _endpoint() else "none")
    if wanted == "none" or os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        return False
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service_name)})
    provider = TracerProvider(resource=resource, id_generator=RunIds())
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return True


def _endpoint() -> bool:
    return any(
        os.environ.get(name)
        for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


try:
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class RunIds(RandomIdGenerator):
        """Random ids, except while a run's root span is made: then the run's own."""

        def generate_span_id(self) -> int:
            pinned = _pinned.get()
            return pinned[1] if pinned else super().generate_span_id()

        def generate_trace_id(self) -> int:
            pinned = _pinned.get()
            return pinned[0] if pinned else super().generate_trace_id()

except ImportError:  # pragma: no cover - the SDK is not installed

    class RunIds:  # type: ignore[no-redef]
        """Stands in for the SDK's id generator when it is not installed."""


def _run_context(run_id: uuid.UUID) -> Any:
    parent = SpanContext(
        run_id.int, _root_span_id(run_id), is_remote=True, trace_flags=TraceFlags(1)
    )
    return trace.set_span_in_context(NonRecordingSpan(parent))


@contextmanager
def invocation(run_id: uuid.UUID, workflow: str, attempt: int) -> Iterator[dict[str, str]]:
    """A span for one invocation of a run, under the run's root; yields the headers that
    carry it to the app (``traceparent``), none when tracing is off."""
    if not enabled():
        yield {}
        return
    tracer = trace.get_tracer("stepline.orchestrator")
    attributes: dict[str, str | int] = {
        "stepline.run_id": str(run_id),
        "stepline.workflow": workflow,
        "stepline.attempt": attempt,
    }
    with tracer.start_as_current_span(
        f"invoke {workflow}", context=_run_context(run_id), kind=SpanKind.CLIENT,
        attributes=attributes,
    ) as span:  # fmt: skip
        ctx = span.get_span_context()
        yield {TRACEPARENT: f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-01"}


def run_ended(run_id: uuid.UUID, workflow: str, status: str, created_at: datetime | None) -> None:
    """Export the run's root span, from its creation to now, with the run's own ids."""
    if not enabled():
        return
    tracer = trace.get_tracer("stepline.orchestrator")
    start = int(created_at.timestamp() * 1e9) if created_at is not None else None
    token = _pinned.set((run_id.int, _root_span_id(run_id)))
    try:
        span = tracer.start_span(
            f"run {workflow}",
            context=trace.set_span_in_context(trace.INVALID_SPAN),
            start_time=start,
            attributes={"stepline.run_id": str(run_id), "stepline.workflow": workflow,
                        "stepline.status": status},
        )  # fmt: skip
    finally:
        _pinned.reset(token)
    if status != "completed":
        span.set_status(trace.Status(trace.StatusCode.ERROR, status))
    span.end()
