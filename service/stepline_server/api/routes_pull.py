"""Routes of pull apps' workers: long polls for invocations (API key), and each invocation's
heartbeats and answer (its invocation token, as progress calls)."""

from __future__ import annotations

import asyncio
import uuid

from pydantic import BaseModel, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive

from stepline.protocol import OLDEST_PROTOCOL_VERSION, PROTOCOL_HEADER, InvocationAnswer
from stepline_server.api import routes_apps
from stepline_server.api.context import orch
from stepline_server.api.errors import (
    InvalidState,
    NotFound,
    StaleInvocation,
    ValidationFailed,
    from_validation,
)
from stepline_server.api.responses import json_response, read_json, read_model, refuse_body
from stepline_server.api.routes_protocol import MAX_PROGRESS_BODY, authorize
from stepline_server.engine import deltas
from stepline_server.engine import pull as rules
from stepline_server.store import deployments

__all__ = ["answer", "heartbeat", "poll"]

WORKER_HEADER = "stepline-worker"
"""Names the worker that sends an answer (``host:pid``), for the invocation's ``request``."""


class Heartbeat(BaseModel):
    run_id: uuid.UUID = Field(alias="runId")


async def poll(request: Request) -> Response:
    """Up to ``limit`` invocations of the pull app, each leased to the caller, after waiting
    at most ``wait`` for one; ``204`` when none came. Only runs on the deployment the worker
    declares (``?deployment=ID``; none: the app's current one). Each carries a history delta
    only when the worker declared a protocol that reads them (``Stepline-Protocol``), and its
    run's ``state`` steps only when that protocol has published state."""
    row = await routes_apps.app_of(request)
    await refuse_body(request)
    try:
        wait, limit = rules.poll_params(
            request.query_params.get("wait"), request.query_params.get("limit")
        )
    except rules.BadParam as exc:
        raise ValidationFailed(str(exc), {"fields": {exc.field: str(exc)}}) from None
    if row["kind"] != "pull":
        raise InvalidState(
            f"app {row['slug']} is a push app: the orchestrator calls it at its URL",
            {"kind": row["kind"]},
        )
    o = orch(request)
    declared = request.query_params.get("deployment") or None
    async with o.pool.acquire() as conn:
        deployment = await deployments.for_worker(conn, row["id"], declared)
    if deployment is None:
        raise NotFound(
            f"app {row['slug']} has no deployment {declared!r}: register it first"
            " (POST /v1/apps/{app}/deployments)"
        )
    gone = asyncio.Event()
    watch = asyncio.create_task(_until_disconnected(request.receive, gone))
    try:
        version = deltas.declared(request.headers.get(PROTOCOL_HEADER))
        bodies = await o.pull.poll(
            row,
            limit,
            wait,
            gone,
            deltas=deltas.reads_deltas(version),
            deployment=deployment["id"] if declared else None,
            protocol=version or OLDEST_PROTOCOL_VERSION,
        )
    finally:
        watch.cancel()
    if not bodies:
        return Response(status_code=204)
    return json_response({"invocations": bodies, "leaseSeconds": o.settings.lease_seconds})


async def _until_disconnected(receive: Receive, gone: asyncio.Event) -> None:
    """Set ``gone`` when the client goes away (a poll's request has no body to read)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    gone.set()


async def answer(request: Request) -> Response:
    """A worker's answer to an invocation it polled (the SDK's answer to ``invoke``)."""
    o = orch(request)
    invocation_id, lease = authorize(
        o, request.path_params["invocationId"], request.headers.get("authorization", "")
    )
    data = await read_json(request, MAX_PROGRESS_BODY)
    if not isinstance(data, dict):
        raise ValidationFailed("the request body must be a JSON object")
    try:
        given = InvocationAnswer.model_validate(data)
        run_id = uuid.UUID(given.run_id)
    except ValidationError as exc:
        raise from_validation(exc) from None
    except ValueError:
        raise ValidationFailed("runId is not a UUID", {"fields": {"runId": "not a UUID"}}) from None
    worker = rules.worker_name(request.headers.get(WORKER_HEADER), request.client)
    recorded = await o.pull.answer(
        run_id, lease, invocation_id, given, given.duration_ms or 0, worker=worker
    )
    if not recorded:
        raise StaleInvocation("this invocation no longer owns the run; its answer was not kept")
    return json_response({"recorded": True})


async def heartbeat(request: Request) -> Response:
    """Keep the lease of an invocation a worker is running."""
    o = orch(request)
    _, lease = authorize(
        o, request.path_params["invocationId"], request.headers.get("authorization", "")
    )
    body = await read_model(request, Heartbeat)
    cancel = await o.pull.beat(body.run_id, lease)
    if cancel is None:
        raise StaleInvocation("this invocation no longer owns the run; stop running it")
    return json_response({"cancelRequested": cancel, "leaseSeconds": o.settings.lease_seconds})
