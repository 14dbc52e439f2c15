"""Routes that move waiting runs: callbacks (by key or signed URL) and events, and the list
of events received."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import Response

from stepline_server.api import pagination, patience
from stepline_server.api.context import orch, path_uuid, project
from stepline_server.api.errors import InvalidState, NotFound
from stepline_server.api.responses import json_response, read_json, read_model
from stepline_server.application import actions, callbacks, serialize
from stepline_server.store import received_events, waits

if TYPE_CHECKING:
    from stepline_server.orchestrator import Orchestrator


class EventSend(BaseModel):
    name: str = Field(min_length=1, max_length=256)
    data: Any = None
    id: str | None = Field(default=None, min_length=1, max_length=256)


async def get_callback(request: Request) -> Response:
    pid = await project(request)
    cid = path_uuid(request, "callbackId", "callback")
    o = orch(request)
    async with o.pool.acquire() as conn:
        row = await waits.get_callback(conn, cid, pid)
    if row is None:
        raise NotFound(f"no callback with id {cid}")
    return json_response(serialize.callback(row, o.signer.url(o.settings.base_url, str(cid))))


async def _complete(request: Request, cid: uuid.UUID, pid: uuid.UUID | None) -> Response:
    o = orch(request)
    body = await read_json(request)
    return await patience.patiently(lambda again: _completed(o, cid, pid, body, again), "callback")


async def _completed(
    o: Orchestrator, cid: uuid.UUID, pid: uuid.UUID | None, body: Any, again: bool
) -> Response:
    """Complete the callback; ``again``: a try before this one was cut off at its commit, so
    a callback completed with this very body was completed by it."""
    done = await callbacks.complete_callback(o, cid, pid, body)
    row = done.callback
    if row is None:
        raise NotFound(f"no callback with id {cid}")
    if not done.completed and not done.repeated:
        raise InvalidState(
            f"the callback is already {row['status']}; its first body is kept",
            {"status": row["status"]},
        )
    answer = serialize.callback(row, o.signer.url(o.settings.base_url, str(cid)))
    if done.repeated and not again:  # the same body again (a retried delivery), not our own
        answer["deduplicated"] = True  # try whose commit was lost: already completed with it
    return json_response(answer)


async def complete_callback(request: Request) -> Response:
    pid = await project(request)
    return await _complete(request, path_uuid(request, "callbackId", "callback"), pid)


async def complete_signed_callback(request: Request) -> Response:
    cid = path_uuid(request, "callbackId", "callback")
    if not orch(request).signer.verify(str(cid), request.path_params["signature"]):
        raise NotFound("no such callback URL")
    return await _complete(request, cid, None)


async def send_event(request: Request) -> Response:
    pid = await project(request)
    body = await read_model(request, EventSend)
    o = orch(request)
    event_id = waits.event_row_id(pid, body.id)  # the same on every try

    async def send(again: bool) -> Response:
        async with o.pool.acquire() as conn:
            public_id, sent = await actions.send_event(
                o, conn, pid, body.name, body.data, body.id, event_id=event_id
            )
        answer = {
            "id": public_id,
            "name": body.name,
            "matchedRuns": len(sent.matched),
            "startedRuns": [str(r) for r in sent.started],
        }
        if sent.repeated and not again:  # after a lost commit, the repeat may be our own
            answer["deduplicated"] = True
        return json_response(answer, 202)

    return await patience.patiently(send, "event")


async def list_events(request: Request) -> Response:
    """``GET /v1/events``: the events the environment received (kept a day), newest first."""
    pid = await project(request)
    f = received_events.EventFilter(
        name=request.query_params.get("name"),
        created_after=pagination.time_of(request, "createdAfter"),
        created_before=pagination.time_of(request, "createdBefore"),
    )
    limit = pagination.limit_of(request)
    before = pagination.keyset_before(request)
    async with orch(request).read_pool.acquire() as conn:
        found = await received_events.page(conn, pid, f, before, limit + 1)
    rows, nxt = pagination.keyset_page(found, limit, "received_at")
    return json_response({"events": [serialize.received_event(r) for r in rows], "nextCursor": nxt})
