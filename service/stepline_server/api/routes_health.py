"""Liveness, readiness and Prometheus metrics (no API key needed)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from stepline_server.api.context import orch
from stepline_server.api.responses import json_response
from stepline_server.metrics import CONTENT_TYPE, Sample
from stepline_server.store import claims
from stepline_server.store.db import Q


async def healthz(request: Request) -> Response:
    return json_response({"status": "ok"})


async def readyz(request: Request) -> Response:
    """Ready while a primary answers: a server that is away, or read-only (a standby, the old
    primary after a failover), is not ready."""
    try:
        async with orch(request).pool.acquire(timeout=2) as conn:
            writable = await conn.fetchval(Q["writable"])
    except Exception:
        writable = False
    if not writable:
        response = json_response({"status": "unavailable"}, 503)
        response.headers["retry-after"] = "1"
        return response
    return json_response({"status": "ok"})


async def metrics(request: Request) -> Response:
    o = orch(request)
    o.sample()
    try:
        async with o.read_pool.acquire(timeout=2) as conn:
            sample = Sample(*await claims.backlog(conn))
    except Exception:
        sample = Sample(-1, -1.0)  # the database did not answer: the scrape still works
    return Response(o.metrics.render(sample), media_type=CONTENT_TYPE)
