"""Pausing and resuming a workflow or an app: its runs are still started and woken, but none is
invoked until it is resumed (role write)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from stepline_server.api.context import orch, project
from stepline_server.api.errors import NotFound
from stepline_server.api.responses import json_response
from stepline_server.application import actions, serialize
from stepline_server.store import apps


async def _workflow(request: Request, resume: bool) -> Response:
    pid = await project(request)
    name = request.path_params["name"]
    o = orch(request)
    async with o.pool.acquire() as conn:
        row = await actions.set_workflow_paused(o, conn, pid, name, paused=not resume)
    if row is None:
        raise NotFound(f"no workflow named {name!r}; sync the app that hosts it")
    return json_response(serialize.workflow(row))


async def pause_workflow(request: Request) -> Response:
    return await _workflow(request, resume=False)


async def resume_workflow(request: Request) -> Response:
    return await _workflow(request, resume=True)


async def _app(request: Request, resume: bool) -> Response:
    pid = await project(request)
    o = orch(request)
    async with o.pool.acquire() as conn:
        found = await apps.get(conn, pid, request.path_params["app"])
        if found is None:
            raise NotFound(f"no app {request.path_params['app']!r}")
        row = await actions.set_app_paused(o, conn, pid, found["id"], paused=not resume)
    if row is None:
        raise NotFound(f"no app {request.path_params['app']!r}")
    return json_response(serialize.app(row))


async def pause_app(request: Request) -> Response:
    return await _app(request, resume=False)


async def resume_app(request: Request) -> Response:
    return await _app(request, resume=True)
