"""Routes for apps, their sync, and the workflows they registered."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from stepline_server.api import auth, pagination
from stepline_server.api.context import orch, project
from stepline_server.api.errors import (
    AppUnreachable,
    InvalidState,
    NotFound,
    ValidationFailed,
    from_validation,
)
from stepline_server.api.responses import json_response, read_json, read_model, refuse_body
from stepline_server.application import appsync, serialize
from stepline_server.application.payloads import AppUrl
from stepline_server.engine import egress
from stepline_server.engine import pull as pull_rules
from stepline_server.store import apps, deployments
from stepline_server.store.db import Record


class AppCreate(BaseModel):
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$")
    url: AppUrl | None = None
    kind: Literal["push", "pull"] = "push"


class AppUpdate(BaseModel):
    name: str | None = Field(
        default=None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$"
    )
    url: AppUrl | None = None


async def app_of(request: Request, *, role: str | None = None) -> Record:
    """The app the path names, in the caller's environment (404 otherwise)."""
    return await _app(request, role=role)


async def _app(request: Request, *, role: str | None = None) -> Record:
    if role is None:
        pid = await project(request)
    else:
        pid = auth.require_role(await auth.caller(request), role).environment_id
    async with orch(request).pool.acquire() as conn:
        row = await apps.get(conn, pid, request.path_params["app"])
    if row is None:
        raise NotFound(f"no app {request.path_params['app']!r}")
    return row


async def check_egress(request: Request, url: str) -> None:
    """422 naming ``url`` when the egress rules refuse where it points (after DNS)."""
    refusal = await orch(request).caller.resolver.refusal(url)
    if refusal is not None:
        raise ValidationFailed("invalid fields: url", {"fields": {"url": refusal}})


async def create_app(request: Request) -> Response:
    pid = await project(request)
    body = await read_model(request, AppCreate)
    problem = pull_rules.registration_problem(body.kind, body.url)
    if problem is not None:
        field, message = problem
        raise ValidationFailed(f"invalid fields: {field}", {"fields": {field: message}})
    if body.url is not None:
        await check_egress(request, body.url)
    async with orch(request).pool.acquire() as conn:
        row = await apps.create(conn, pid, body.name, body.url, kind=body.kind)
    if row is None:
        raise InvalidState(f"the project already has an app named {body.name!r}")
    return json_response(serialize.app(row, secret=True), 201)


async def list_apps(request: Request) -> Response:
    pid = await project(request)
    limit = pagination.limit_of(request)
    cursor = pagination.decode(request, pagination.as_time, pagination.as_uuid)
    after = (cursor[0], cursor[1]) if cursor else None
    async with orch(request).read_pool.acquire() as conn:
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
    if body.url is not None:
        if row["kind"] == "pull":
            message = "a pull app has no URL: its workers poll the orchestrator"
            raise ValidationFailed("invalid fields: url", {"fields": {"url": message}})
        await check_egress(request, body.url)
    async with orch(request).pool.acquire() as conn:
        try:
            updated = await apps.update(conn, row["project_id"], row["id"], body.url, body.name)
        except apps.NameTaken as exc:
            raise InvalidState(str(exc)) from None
    assert updated is not None
    return json_response(serialize.app(updated))


async def delete_app(request: Request) -> Response:
    row = await _app(request)
    await refuse_body(request)
    async with orch(request).pool.acquire() as conn:
        await apps.delete(conn, row["project_id"], row["id"])
    return Response(status_code=204)


async def rotate_secret(request: Request) -> Response:
    """A new signing secret (admin): invocations are signed with it from now on."""
    row = await _app(request, role="admin")
    await refuse_body(request)
    async with orch(request).pool.acquire() as conn:
        rotated = await apps.rotate_secret(conn, row["project_id"], row["id"])
    if rotated is None:
        raise NotFound(f"no app {request.path_params['app']!r}")
    return json_response(serialize.app(rotated, secret=True))


def _take_over(request: Request) -> bool:
    """``?takeOver=true``: the sync may move workflows other apps registered to this one."""
    raw = request.query_params.get("takeOver", "false")
    if raw not in ("true", "false"):
        message = "takeOver must be true or false"
        raise ValidationFailed(message, {"fields": {"takeOver": message}})
    return raw == "true"


async def sync_app(request: Request) -> Response:
    row = await _app(request)
    take_over = _take_over(request)
    try:
        if row["kind"] == "pull":
            done = await _sync_pulled(request, row, take_over)
        else:
            done = await _sync_pushed(request, row, take_over)
    except apps.WorkflowsTaken as exc:
        held = [
            {"name": r["name"], "app": r["app_slug"], "appName": r["app_name"]} for r in exc.held
        ]
        raise InvalidState(str(exc), {"workflows": held}) from None
    synced, workflows = done.app, done.workflows
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
            "movedWorkflows": [{"name": r["name"], "fromApp": r["app_slug"]} for r in done.moved],
        }
    )


async def _sync_pushed(request: Request, row: Record, take_over: bool) -> appsync.Synced:
    """A push app's sync: the orchestrator asks the app what it hosts."""
    await refuse_body(request)
    try:
        egress.app_url(row["url"])
    except ValueError as exc:  # registered before URLs were checked
        raise AppUnreachable(f"the app's URL cannot be called ({exc}); change it first") from None
    try:
        return await appsync.sync(orch(request), row, take_over=take_over)
    except appsync.InvalidOptions as exc:
        raise ValidationFailed(str(exc), {"fields": exc.fields}) from None
    except appsync.SyncFailed as exc:
        raise AppUnreachable(str(exc)) from None
    except ValidationError as exc:
        raise from_validation(exc) from None


async def _sync_pulled(request: Request, row: Record, take_over: bool) -> appsync.Synced:
    """A pull app's sync: its worker sends the description the SDK's describe answers. A
    worker declaring a deployment that is not the current one records nothing."""
    data = await read_json(request, allow_empty=True)
    if data is None:
        raise ValidationFailed(
            "a pull app is synced by its worker: send its description (stepline worker does)",
            {"fields": {"workflows": "required"}},
        )
    if not isinstance(data, dict):
        raise ValidationFailed("the request body must be a JSON object")
    declared = request.query_params.get("deployment") or None
    old_deployment = False
    if declared is not None:
        async with orch(request).pool.acquire() as conn:
            deployment = await deployments.get(conn, row["id"], declared)
        if deployment is None:
            raise NotFound(f"app {row['slug']} has no deployment {declared!r}: register it first")
        old_deployment = not deployment["current"]
    try:
        described = appsync.described_of(data)
        if old_deployment:
            # A worker of an older deployment: the app's workflows are the current one's.
            return appsync.Synced(row, appsync.workflows_of(described), [])
        return await appsync.register(orch(request), row, described, take_over=take_over)
    except appsync.InvalidOptions as exc:
        raise ValidationFailed(str(exc), {"fields": exc.fields}) from None
    except appsync.SyncFailed as exc:
        raise ValidationFailed(str(exc), {"fields": {"workflows": str(exc)}}) from None
    except ValidationError as exc:
        raise from_validation(exc) from None


async def list_workflows(request: Request) -> Response:
    pid = await project(request)
    limit = pagination.limit_of(request)
    cursor = pagination.decode(request, pagination.as_text)
    async with orch(request).read_pool.acquire() as conn:
        rows = await apps.workflows_page(conn, pid, cursor[0] if cursor else None, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    nxt = pagination.encode([rows[-1]["name"]]) if more else None
    return json_response({"workflows": [serialize.workflow(r) for r in rows], "nextCursor": nxt})
