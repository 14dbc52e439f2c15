"""OpenTelemetry: a run's spans (run, invocations, steps) share the run's trace, and the app's
own span nests under its step, carried there by the invocation's W3C traceparent."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import stepline
from stepline_server import tracing
from tests.support import app_server, orchestrator_stack

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def _provider() -> None:
    """One in-memory provider for the process (OpenTelemetry allows one to be set)."""
    if not tracing.enabled():
        provider = TracerProvider(id_generator=tracing.RunIds())
        provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
        trace.set_tracer_provider(provider)


def make_app() -> stepline.Stepline:
    sl = stepline.Stepline("secret-tracing")

    @sl.workflow("traced")
    async def traced(ctx: stepline.Context, n: int) -> int:
        async def work() -> int:
            with trace.get_tracer("app").start_as_current_span("app work"):
                return n + 1

        a = await ctx.step("a", work)
        await ctx.sleep("rest", "10ms")
        return await ctx.step("b", lambda: a * 2)  # type: ignore[no-any-return]

    return sl


def _parent(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


async def test_run_invocation_step_and_app_spans_nest_in_the_runs_trace(
    database_url: str,
) -> None:
    """After a run of two steps and a sleep: one run span, two invocation spans under it, a
    span per step under its invocation, the app's span under its step, all in the trace whose
    id the run shows."""
    EXPORTER.clear()
    sl = make_app()
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        run = await stack.client.start_run("traced", 1)
        ended: dict[str, Any] = await stack.client.wait_run(run["id"], timeout=20)
    assert ended["output"] == 4
    trace_id = int(ended["traceId"], 16)
    assert ended["traceId"] == uuid.UUID(run["id"]).hex == run["traceId"]
    spans = [s for s in EXPORTER.get_finished_spans() if s.context.trace_id == trace_id]
    by_name: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)
    [root] = by_name["run traced"]
    invocations = by_name["invoke traced"]
    [step_a], [step_b], [app] = by_name["step a"], by_name["step b"], by_name["app work"]
    assert root.parent is None and root.attributes["stepline.status"] == "completed"
    assert len(invocations) == 2
    assert {_parent(i) for i in invocations} == {root.context.span_id}
    assert _parent(step_a) in {i.context.span_id for i in invocations}
    assert _parent(step_b) in {i.context.span_id for i in invocations}
    assert _parent(step_a) != _parent(step_b)  # the sleep ended the first invocation
    assert _parent(app) == step_a.context.span_id
    assert root.start_time is not None and root.end_time is not None
    assert all(root.start_time <= s.start_time for s in spans if s.start_time is not None)
