"""Liveness, readiness and Prometheus metrics (no API key needed)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from stepline_server.api.context import orch
from stepline_server.api.responses import json_response
from stepline_server.store.db import Q


async def healthz(request: Request) -> Response:
    return json_response({"status": "ok"})


async def readyz(request: Request) -> Response:
    try:
        async with orch(request).pool.acquire(timeout=2) as conn:
            await conn.fetchval(Q["ping"])
    except Exception:
        return json_response({"status": "unavailable"}, 503)
    return json_response({"status": "ok"})


async def metrics(request: Request) -> Response:
    o = orch(request)
    gauges = {
        "stepline_invocations_inflight": (
            "Invocations this orchestrator is running.",
            float(o.dispatcher.inflight),
        ),
        "stepline_pool_connections": ("Database connections in the pool.", o.pool.get_size()),
    }
    return PlainTextResponse(o.metrics.render(gauges), media_type="text/plain; version=0.0.4")
