"""Pausing and resuming a workflow or an app: its runs are still started and woken, but none is
invoked until it is resumed (role write)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from stepline_server import serialize
from stepline_server.api.context import orch, project
from stepline_server.api.errors import NotFound
from stepline_server.api.responses import json_response
from stepline_server.store import apps, pause


async def _workflow(request: Request, resume: bool) -> Response:
    pid = await project(request)
    name = request.path_params["name"]
    o = orch(request)
    async with o.pool.acquire() as conn:
        change = pause.resume_workflow if resume else pause.pause_workflow
        row = await change(conn, pid, name)
    if row is None:
        raise NotFound(f"no workflow named {name!r}; sync the app that hosts it")
    if resume:
        o.dispatcher.wake()
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
        change = pause.resume_app if resume else pause.pause_app
        row = await change(conn, pid, found["id"])
    if row is None:
        raise NotFound(f"no app {request.path_params['app']!r}")
    if resume:
        o.dispatcher.wake()
    return json_response(serialize.app(row))


async def pause_app(request: Request) -> Response:
    return await _app(request, resume=False)


async def resume_app(request: Request) -> Response:
    return await _app(request, resume=True)
