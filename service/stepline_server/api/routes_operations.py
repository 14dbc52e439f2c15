"""Routes for bulk actions: ``POST /v1/runs/bulk`` (a dry run, or an operation), and the
operations: list, read (with the first errors), cancel."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import Response

from stepline_server.api import pagination
from stepline_server.api.context import orch, path_uuid, project
from stepline_server.api.errors import InvalidState, NotFound, ValidationFailed
from stepline_server.api.responses import json_response, read_model
from stepline_server.application import actions, serialize
from stepline_server.engine import bulk as rules
from stepline_server.engine import ids
from stepline_server.store import apps, deployments, operations
from stepline_server.store.db import Conn

_TEXT = 256


class BulkFilter(BaseModel):
    """The run list's filters, as a bulk action takes them."""

    model_config = ConfigDict(extra="forbid")

    workflow: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    status: str | list[str] | None = Field(default=None)
    app: str | None = Field(default=None, min_length=1, max_length=_TEXT)
    deployment_id: str | None = Field(
        default=None, alias="deploymentId", min_length=1, max_length=_TEXT
    )
    deployment: uuid.UUID | None = None  # the runs on this deployment (its id) of their app
    created_after: AwareDatetime | None = Field(default=None, alias="createdAfter")
    created_before: AwareDatetime | None = Field(default=None, alias="createdBefore")
    run_key: str | None = Field(default=None, alias="runKey", min_length=1, max_length=129)
    trigger: str | None = Field(default=None, max_length=_TEXT)


class BulkRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    action: Literal["cancel", "retry", "retryFromStep", "move"]
    filter: BulkFilter
    from_step: str | None = Field(default=None, alias="fromStep", min_length=1, max_length=256)
    deployment: uuid.UUID | None = None
    dry_run: bool = Field(default=False, alias="dryRun", strict=True)


def _selection(body: BulkRequest) -> rules.Selection:
    action = rules.Action(body.action)
    f = body.filter
    try:
        rules.check_from_step(action, body.from_step)
        rules.check_deployment(action, None if body.deployment is None else str(body.deployment))
        return rules.select(
            action,
            status=f.status,
            run_key=f.run_key,
            trigger=f.trigger,
            created_after=f.created_after,
            created_before=f.created_before,
            workflow=f.workflow,
            app=f.app,
            deployment_id=f.deployment_id,
            from_step=body.from_step,
            on_deployment=None if f.deployment is None else str(f.deployment),
        )
    except rules.FilterError as exc:
        where = exc.field if exc.field in ("fromStep", "deployment") else f"filter.{exc.field}"
        raise ValidationFailed(str(exc), {"fields": {where: str(exc)}}) from None


def _recorded(value: Any) -> Any:
    """A filter's value as the operation records it (and the dashboard's filters read)."""
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    return str(value) if isinstance(value, uuid.UUID) else value


async def _check_deployment(
    conn: Conn, pid: uuid.UUID, app_id: uuid.UUID | None, deployment: uuid.UUID
) -> None:
    """The filter's ``deployment`` is one of the app's (of its ``app``, when it names one)."""
    if app_id is None:
        found = await deployments.in_environment(conn, pid, deployment)
        message = f"no deployment {deployment} in this environment"
    else:
        row = await deployments.get(conn, app_id, str(deployment))
        found = row is not None and row["id"] == deployment
        message = f"the app has no deployment {deployment}"
    if not found:
        raise ValidationFailed(message, {"fields": {"filter.deployment": message}})


async def bulk_runs(request: Request) -> Response:
    """``POST /v1/runs/bulk``: ``dryRun`` answers how many runs the action would take and a
    sample; otherwise the operation, created with its set of runs fixed (202)."""
    pid = await project(request)
    body = await read_model(request, BulkRequest)
    selection = _selection(body)
    o = orch(request)
    async with o.pool.acquire() as conn:
        app_id = None
        if selection.app is not None:
            app = await apps.get(conn, pid, selection.app)
            if app is None:
                message = f"no app with id, slug or name {selection.app!r}"
                raise ValidationFailed(message, {"fields": {"filter.app": message}})
            app_id = app["id"]
        if body.filter.deployment is not None:
            await _check_deployment(conn, pid, app_id, body.filter.deployment)
        if body.deployment is not None and not await deployments.in_environment(
            conn, pid, body.deployment
        ):
            message = f"no deployment {body.deployment} in this environment"
            raise ValidationFailed(message, {"fields": {"deployment": message}})
        if body.dry_run:
            matched, sample = await operations.match(
                conn, pid, selection, app_id, rules.SAMPLE_SIZE
            )
            return json_response({"matched": matched, "sample": sample})
        given = body.filter.model_dump(by_alias=True, exclude_none=True)
        row = await operations.create(
            conn,
            ids.new_id(),
            pid,
            body.action,
            {k: _recorded(v) for k, v in given.items()},
            selection,
            app_id,
            body.deployment,
        )
    actions.operation_queued(o)
    return json_response(serialize.operation(row), 202)


async def list_operations(request: Request) -> Response:
    pid = await project(request)
    limit = pagination.limit_of(request)
    cursor = pagination.decode(request, pagination.as_time, pagination.as_uuid)
    before = (cursor[0], cursor[1]) if cursor else None
    async with orch(request).read_pool.acquire() as conn:
        rows = await operations.page(conn, pid, before, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    nxt = (
        pagination.encode([rows[-1]["created_at"].isoformat(), str(rows[-1]["id"])])
        if more
        else None
    )
    return json_response({"operations": [serialize.operation(r) for r in rows], "nextCursor": nxt})


async def get_operation(request: Request) -> Response:
    pid = await project(request)
    op_id = path_uuid(request, "operationId", "operation")
    async with orch(request).pool.acquire() as conn:
        row = await operations.get(conn, pid, op_id)
        if row is None:
            raise NotFound(f"no operation with id {op_id}")
        errors = await operations.errors(conn, pid, op_id, rules.FIRST_ERRORS)
    return json_response(serialize.operation(row, errors))


async def cancel_operation(request: Request) -> Response:
    """``POST /v1/operations/{id}/cancel``: stop it (202); what was done stays done. An
    operation that has ended: ``409 invalid_state``."""
    pid = await project(request)
    op_id = path_uuid(request, "operationId", "operation")
    async with orch(request).pool.acquire() as conn:
        row = await operations.cancel(conn, pid, op_id)
        if row is None:
            existing = await operations.get(conn, pid, op_id)
            if existing is None:
                raise NotFound(f"no operation with id {op_id}")
            raise InvalidState(
                f"the operation has already ended ({existing['status']}); it cannot be cancelled"
            )
    return json_response(serialize.operation(row), 202)
