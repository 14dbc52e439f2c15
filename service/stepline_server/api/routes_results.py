"""What the SDK fetches for an invocation, with its bearer token (as its progress calls).

- ``GET /v1/invocations/{invocationId}/results/{position}?runId=``: a large step result that
  the invocation carried by reference; the answer is the result's JSON text as stored, so its
  size and MD5 are those the invocation's ``outputRef`` gave.
- ``GET /v1/invocations/{invocationId}/steps?runId=``: the run's whole history as it stands,
  ``{"steps": [...]}``, when the invocation carried only what changed since a history the SDK
  did not keep (``historyBase``); without its ``state`` steps when the SDK declares a protocol
  before published state, or none (``Stepline-Protocol``), as an invocation would carry it.
"""

from __future__ import annotations

import uuid

from starlette.requests import Request
from starlette.responses import Response

from stepline.protocol import PROTOCOL_HEADER
from stepline_server.api.context import orch
from stepline_server.api.errors import NotFound, StaleInvocation, ValidationFailed
from stepline_server.api.responses import json_response
from stepline_server.api.routes_protocol import authorize
from stepline_server.engine import deltas
from stepline_server.invoke.body import readable, step_json
from stepline_server.store import history


async def step_result(request: Request) -> Response:
    o = orch(request)
    authorization = request.headers.get("authorization", "")
    invocation_id, lease = authorize(o, request.path_params["invocationId"], authorization)
    raw_position = request.path_params["position"]
    problems: dict[str, str] = {}
    if not raw_position.isdigit() or len(raw_position) > 18:
        problems["position"] = "a step's position, a whole number"
    run_id = _run_id(request, problems)
    if problems or run_id is None:
        raise ValidationFailed("the result asked for is not valid", {"fields": problems})
    async with o.pool.acquire() as conn:
        found = await history.step_result(conn, run_id, invocation_id, lease, int(raw_position))
    if found is None:
        raise StaleInvocation("this invocation no longer owns the run; stop running it")
    if not found.found or found.text is None:
        raise NotFound(f"the run has no step result at position {raw_position}")
    return Response(found.text.encode(), media_type="application/json")


async def invocation_steps(request: Request) -> Response:
    o = orch(request)
    authorization = request.headers.get("authorization", "")
    invocation_id, lease = authorize(o, request.path_params["invocationId"], authorization)
    problems: dict[str, str] = {}
    run_id = _run_id(request, problems)
    if run_id is None:
        raise ValidationFailed("the history asked for is not valid", {"fields": problems})
    async with o.pool.acquire() as conn:
        rows = await history.invocation_steps(conn, run_id, invocation_id, lease)
    if rows is None:
        raise StaleInvocation("this invocation no longer owns the run; stop running it")
    version = deltas.declared(request.headers.get(PROTOCOL_HEADER))
    steps = [step_json(row, o.settings.base_url, o.signer) for row in readable(rows, version)]
    return json_response({"steps": steps})


def _run_id(request: Request, problems: dict[str, str]) -> uuid.UUID | None:
    try:
        return uuid.UUID(request.query_params.get("runId", ""))
    except ValueError:
        problems["runId"] = "the invocation's run id (a UUID)"
        return None
