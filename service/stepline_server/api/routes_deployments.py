"""Routes for an app's deployments (each at its own URL, the newest current) and for moving
runs between them."""

from __future__ import annotations

from pydantic import BaseModel, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from stepline_server.api import routes_apps
from stepline_server.api.context import orch, path_uuid, project
from stepline_server.api.errors import (
    AppUnreachable,
    InvalidState,
    NotFound,
    ValidationFailed,
    from_validation,
)
from stepline_server.api.responses import json_response, read_model, refuse_body
from stepline_server.application import actions, appsync, reads, serialize
from stepline_server.application.payloads import AppUrl
from stepline_server.store import apps, deployments, runs
from stepline_server.store.db import Record


class DeploymentCreate(BaseModel):
    url: AppUrl | None = None
    deployment_id: str | None = Field(
        default=None, alias="deploymentId", min_length=1, max_length=128
    )


class RunMove(BaseModel):
    deployment: str = Field(min_length=1, max_length=128)


async def list_deployments(request: Request) -> Response:
    """The app's deployments, newest first, each with its running runs."""
    row = await routes_apps.app_of(request)
    async with orch(request).read_pool.acquire() as conn:
        rows = await deployments.listed(conn, row["id"])
    return json_response({"deployments": [serialize.deployment(r) for r in rows]})


async def create_deployment(request: Request) -> Response:
    """Register and sync another deployment of the app (admin); it becomes the current one."""
    row = await routes_apps.app_of(request, role="admin")
    body = await read_model(request, DeploymentCreate)
    o = orch(request)
    if row["kind"] == "pull":
        if body.url is not None:
            message = "a pull app has no URL: its workers declare their deployment"
            raise ValidationFailed("invalid fields: url", {"fields": {"url": message}})
        if body.deployment_id is None:
            message = "required: the id the app's workers declare (stepline worker --deployment)"
            raise ValidationFailed(
                "invalid fields: deploymentId", {"fields": {"deploymentId": message}}
            )
        async with o.pool.acquire() as conn:
            try:
                ident = await deployments.create(conn, row["id"], None, body.deployment_id)
            except deployments.Taken as exc:
                raise InvalidState(str(exc)) from None
    else:
        if body.url is None:
            raise ValidationFailed("invalid fields: url", {"fields": {"url": "required"}})
        await routes_apps.check_egress(request, body.url)
        try:
            ident, _ = await appsync.deploy(o, row, body.url, body.deployment_id)
        except deployments.Taken as exc:
            raise InvalidState(str(exc)) from None
        except apps.WorkflowsTaken as exc:
            raise InvalidState(str(exc)) from None
        except appsync.InvalidOptions as exc:
            raise ValidationFailed(str(exc), {"fields": exc.fields}) from None
        except appsync.SyncFailed as exc:
            raise AppUnreachable(str(exc)) from None
        except ValidationError as exc:
            raise from_validation(exc) from None
    async with o.pool.acquire() as conn:
        created = await deployments.get(conn, row["id"], str(ident))
    assert created is not None
    return json_response(serialize.deployment(created), 201)


async def _deployment(request: Request, app: Record) -> Record:
    async with orch(request).pool.acquire() as conn:
        found = await deployments.get(conn, app["id"], request.path_params["deployment"])
    if found is None:
        raise NotFound(f"app {app['slug']} has no deployment {request.path_params['deployment']!r}")
    return found


async def get_deployment(request: Request) -> Response:
    row = await routes_apps.app_of(request)
    return json_response(serialize.deployment(await _deployment(request, row)))


async def delete_deployment(request: Request) -> Response:
    """Delete a deployment (admin): ``409`` while runs not ended are on it, unless
    ``?moveTo=current`` (they go to the current deployment first)."""
    row = await routes_apps.app_of(request, role="admin")
    move_to = request.query_params.get("moveTo")
    if move_to not in (None, "current"):
        message = "moveTo must be current"
        raise ValidationFailed(message, {"fields": {"moveTo": message}})
    await refuse_body(request)
    found = await _deployment(request, row)
    async with orch(request).pool.acquire() as conn:
        try:
            await deployments.delete(conn, row["id"], found, move=move_to == "current")
        except deployments.IsCurrent as exc:
            raise InvalidState(str(exc)) from None
        except deployments.RunsLeft as exc:
            raise InvalidState(
                f"{exc}: move them first, or delete with ?moveTo=current",
                {"runningRuns": exc.count},
            ) from None
    actions.made_due(orch(request))
    return Response(status_code=204)


async def move_run(request: Request) -> Response:
    """Move a run not ended to another deployment of its app: its next invocation goes to that
    deployment's URL (an invocation under way finishes where it is)."""
    pid = await project(request)
    run_id = path_uuid(request, "runId", "run")
    body = await read_model(request, RunMove)
    o = orch(request)
    async with o.pool.acquire() as conn:
        row = await runs.get(conn, pid, run_id)
        if row is None:
            raise NotFound(f"no run with id {run_id}")
        target = await deployments.get(conn, row["app_id"], body.deployment)
        if target is None:
            message = f"app {row['app_slug']} has no deployment {body.deployment!r}"
            raise ValidationFailed(message, {"fields": {"deployment": message}})
        if not await deployments.move_run(conn, pid, run_id, target["id"]):
            raise InvalidState(f"run {run_id} has ended: it is on no deployment any more")
        moved = await runs.get(conn, pid, run_id)
        assert moved is not None
        return json_response(await reads.run_json(conn, moved, callback_url=reads.callback_url(o)))
