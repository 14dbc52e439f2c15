"""Routes for apps, their sync, and the workflows they registered."""

from __future__ import annotations

import re

from pydantic import BaseModel, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from stepline.protocol import DescribeResponse
from stepline_server.api import pagination, serialize
from stepline_server.api.context import orch, project
from stepline_server.api.errors import AppUnreachable, InvalidState, NotFound, from_validation
from stepline_server.api.responses import json_response, read_model
from stepline_server.store import apps
from stepline_server.store.db import Record

_URL = r"^https?://[^\s/$.?#][^\s]*$"


class AppCreate(BaseModel):
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$")
    url: str = Field(max_length=2048, pattern=_URL)


class AppUpdate(BaseModel):
    name: str | None = Field(
        default=None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$"
    )
    url: str | None = Field(default=None, max_length=2048, pattern=_URL)


async def _app(request: Request) -> Record:
    pid = await project(request)
    async with orch(request).pool.acquire() as conn:
        row = await apps.get(conn, pid, request.path_params["app"])
    if row is None:
        raise NotFound(f"no app {request.path_params['app']!r}")
    return row


async def create_app(request: Request) -> Response:
    pid = await project(request)
    body = await read_model(request, AppCreate)
    async with orch(request).pool.acquire() as conn:
        row = await apps.create(conn, pid, body.name, body.url)
    if row is None:
        raise InvalidState(f"the project already has an app named {body.name!r}")
    return json_response(serialize.app(row, secret=True), 201)


async def list_apps(request: Request) -> Response:
    pid = await project(request)
    limit = pagination.limit_of(request)
    cursor = pagination.decode(request, pagination.as_time, pagination.as_uuid)
    after = (cursor[0], cursor[1]) if cursor else None
    async with orch(request).pool.acquire() as conn:
        rows = await apps.page(conn, pid, after, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    nxt = (
        pagination.encode([rows[-1]["created_at"].isoformat(), str(rows[-1]["id"])])
        if more
        else None
    )
    return json_response({"apps": [serialize.app(r) for r in rows], "nextCursor": nxt})


async def get_app(request: Request) -> Response:
    return json_response(serialize.app(await _app(request)))


async def update_app(request: Request) -> Response:
    row = await _app(request)
    body = await read_model(request, AppUpdate)
    async with orch(request).pool.acquire() as conn:
        try:
            updated = await apps.update(conn, row["project_id"], row["id"], body.url, body.name)
        except apps.NameTaken as exc:
            raise InvalidState(str(exc)) from None
    assert updated is not None
    return json_response(serialize.app(updated))


async def delete_app(request: Request) -> Response:
    row = await _app(request)
    async with orch(request).pool.acquire() as conn:
        await apps.delete(conn, row["project_id"], row["id"])
    return Response(status_code=204)


async def sync_app(request: Request) -> Response:
    row = await _app(request)
    o = orch(request)
    result = await o.caller.describe(row["url"], list(row["signing_secrets"]))
    if not result.ok or not isinstance(result.response, DescribeResponse):
        raise AppUnreachable(f"could not sync the app at {row['url']}: {result.reason}")
    described = result.response
    workflows = []
    for wf in described.workflows:
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", wf.name):
            raise AppUnreachable(f"the app described a workflow with an invalid name {wf.name!r}")
        options = wf.model_dump(mode="json", by_alias=True, exclude={"name"}, exclude_none=True)
        workflows.append((wf.name, options))
    try:
        async with o.pool.acquire() as conn, conn.transaction():
            synced = await apps.record_sync(conn, row, workflows, described.deployment_id)
            await o.after_sync(conn, synced, described)
    except ValidationError as exc:
        raise from_validation(exc) from None
    return json_response(
        {
            "app": serialize.app(synced),
            "workflows": [
                {
                    "name": n,
                    "app": synced["slug"],
                    "options": opts,
                    "syncedAt": serialize.ts(synced["synced_at"]),
                }
                for n, opts in workflows
            ],
        }
    )


async def list_workflows(request: Request) -> Response:
    pid = await project(request)
    limit = pagination.limit_of(request)
    cursor = pagination.decode(request, pagination.as_text)
    async with orch(request).pool.acquire() as conn:
        rows = await apps.workflows_page(conn, pid, cursor[0] if cursor else None, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    nxt = pagination.encode([rows[-1]["name"]]) if more else None
    return json_response({"workflows": [serialize.workflow(r) for r in rows], "nextCursor": nxt})
