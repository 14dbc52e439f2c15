"""The SDK's fetch of a large step result that an invocation carried by reference.

``GET /v1/invocations/{invocationId}/results/{position}?runId=`` with the invocation's bearer
token (as its progress calls): the answer is the result's JSON text as stored, so its size and
MD5 are those the invocation's ``outputRef`` gave.
"""

from __future__ import annotations

import uuid

from starlette.requests import Request
from starlette.responses import Response

from stepline_server.api.context import orch
from stepline_server.api.errors import NotFound, StaleInvocation, ValidationFailed
from stepline_server.api.routes_protocol import authorize
from stepline_server.store import history


async def step_result(request: Request) -> Response:
    o = orch(request)
    authorization = request.headers.get("authorization", "")
    invocation_id, lease = authorize(o, request.path_params["invocationId"], authorization)
    raw_position = request.path_params["position"]
    raw_run = request.query_params.get("runId", "")
    problems: dict[str, str] = {}
    if not raw_position.isdigit() or len(raw_position) > 18:
        problems["position"] = "a step's position, a whole number"
    try:
        run_id = uuid.UUID(raw_run)
    except ValueError:
        problems["runId"] = "the invocation's run id (a UUID)"
    if problems:
        raise ValidationFailed("the result asked for is not valid", {"fields": problems})
    async with o.pool.acquire() as conn:
        found = await history.step_result(conn, run_id, invocation_id, lease, int(raw_position))
    if found is None:
        raise StaleInvocation("this invocation no longer owns the run; stop running it")
    if not found.found or found.text is None:
        raise NotFound(f"the run has no step result at position {raw_position}")
    return Response(found.text.encode(), media_type="application/json")
