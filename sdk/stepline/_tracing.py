"""Step spans for OpenTelemetry, when the app has opentelemetry-api installed (never needed).

The orchestrator sends each invocation with a W3C ``traceparent`` header; each step runs inside
a span that is its child, so the spans the step's own code makes nest under the step.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

try:
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the app does not use OpenTelemetry
    trace = None  # type: ignore[assignment]


@contextmanager
def step_span(traceparent: str | None, run_id: str, name: str, attempt: int) -> Iterator[None]:
    """Run the body inside a span for step ``name``, under the invocation's ``traceparent``."""
    if trace is None or not traceparent:
        yield
        return
    parent = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
    attributes: dict[str, str | int] = {
        "stepline.run_id": run_id,
        "stepline.step": name,
        "stepline.attempt": attempt,
    }
    tracer = trace.get_tracer("stepline.sdk")
    with tracer.start_as_current_span(f"step {name}", context=parent, attributes=attributes):
        yield
