"""The SDK's side channel: step progress committed while an invocation runs.

The answer has :class:`stepline.protocol.ProgressResponse`'s shape.
"""

from __future__ import annotations

import uuid

from starlette.requests import Request
from starlette.responses import Response

from stepline.protocol import ProgressRequest
from stepline_server.api.context import orch, path_uuid
from stepline_server.api.errors import StaleInvocation, Unauthorized, ValidationFailed
from stepline_server.api.responses import json_response, read_model
from stepline_server.engine.steps import InvalidUpdate, plan_updates
from stepline_server.store import dispatch

MAX_PROGRESS_BODY = 16 * 1024 * 1024


async def progress(request: Request) -> Response:
    invocation_id = path_uuid(request, "invocationId", "invocation")
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized("send the invocation's token as 'Authorization: Bearer <token>'")
    body = await read_model(request, ProgressRequest, MAX_PROGRESS_BODY)
    try:
        run_id = uuid.UUID(body.run_id)
        plan = plan_updates(body.run_id, body.updates)
    except (ValueError, InvalidUpdate) as exc:
        raise ValidationFailed(str(exc)) from None
    o = orch(request)
    item = dispatch.Progress(run_id, token.strip(), invocation_id, plan, seq=body.seq)
    done = await o.batcher.apply(item)
    if done is None:
        raise StaleInvocation("this invocation no longer owns the run; stop running it")
    base = o.settings.base_url
    callbacks = {
        name: {"id": cid, "url": o.signer.url(base, cid)} for cid, name, _ in plan.callbacks
    }
    return json_response({"cancelRequested": done.row["cancel_requested"], "callbacks": callbacks})
