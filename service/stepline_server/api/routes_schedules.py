"""Routes for cron schedules: create, read, list, change, pause, resume, trigger, delete."""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, Field, field_validator
from starlette.requests import Request
from starlette.responses import Response

from stepline.wire import to_ms
from stepline_server.api import pagination
from stepline_server.api.context import orch, project
from stepline_server.api.errors import InvalidState, NotFound, ValidationFailed
from stepline_server.api.responses import json_response, read_model, refuse_body
from stepline_server.application import actions, reads, serialize
from stepline_server.engine import schedules as rules
from stepline_server.store import apps, schedules
from stepline_server.store.db import Conn, Record

_ID = re.compile(r"^wfs_[A-Za-z0-9]+$")


_MAX_INT32 = 2**31 - 1  # disable_after is an integer column
_MAX_SLA_MS = 366 * 86_400_000


def _sla_ms(value: Any) -> int | None:
    """An SLA given as a duration (seconds, or a string like ``"5m"``) in ms: over 0, at most a
    year."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError("sla must be a duration: a number of seconds or a string like '5m'")
    try:
        ms = to_ms(value)
    except OverflowError:
        ms = _MAX_SLA_MS + 1
    if not 0 < ms <= _MAX_SLA_MS:
        raise ValueError("sla must be more than 0 and at most 366 days")
    return ms


class ScheduleCreate(BaseModel):
    workflow: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    cron: str
    timezone: str
    input: Any = None
    overlap: rules.OverlapPolicy = rules.OverlapPolicy.ALLOW
    misfire: rules.MisfirePolicy = rules.MisfirePolicy.FIRE_ONCE
    disable_after: int = Field(
        default=rules.DEFAULT_DISABLE_AFTER, ge=0, le=_MAX_INT32, alias="disableAfter"
    )
    sla: int | None = None  # ms, from a duration

    _sla = field_validator("sla", mode="before")(_sla_ms)


class ScheduleUpdate(BaseModel):
    cron: str | None = None
    timezone: str | None = None
    input: Any = None
    overlap: rules.OverlapPolicy | None = None
    misfire: rules.MisfirePolicy | None = None
    disable_after: int | None = Field(default=None, ge=0, le=_MAX_INT32, alias="disableAfter")
    sla: int | None = None  # ms, from a duration; null removes it

    _sla = field_validator("sla", mode="before")(_sla_ms)


_CAMEL = {"disable_after": "disableAfter"}


def _invalid(exc: rules.ScheduleError) -> ValidationFailed:
    return ValidationFailed(exc.message, {"fields": {exc.field: exc.message}})


def _validated(cron: str, timezone: str) -> str:
    """The normalised cron; a 422 naming ``cron`` or ``timezone`` when either does not parse."""
    try:
        normalised = rules.parse_cron(cron)
        rules.parse_timezone(timezone)
    except rules.ScheduleError as exc:
        raise _invalid(exc) from None
    return normalised


def _schedule_id(request: Request) -> str:
    sid: str = request.path_params["scheduleId"]
    if not _ID.match(sid):
        raise NotFound(f"no schedule with id {sid!r}")
    return sid


def _found(row: Record | None, sid: str) -> Record:
    if row is None:
        raise NotFound(f"no schedule with id {sid!r}")
    return row


async def create_schedule(request: Request) -> Response:
    pid = await project(request)
    body = await read_model(request, ScheduleCreate)
    cron = _validated(body.cron, body.timezone)
    d = schedules.ScheduleDef(
        workflow=body.workflow,
        cron=cron,
        timezone=body.timezone,
        input=body.input,
        overlap=body.overlap,
        misfire=body.misfire,
        disable_after=body.disable_after,
        sla_ms=body.sla,
    )
    o = orch(request)
    async with o.pool.acquire() as conn:
        if await apps.workflow(conn, pid, body.workflow) is None:
            raise NotFound(f"no workflow named {body.workflow!r}; sync the app that hosts it")
        row = await schedules.create(conn, pid, d, datetime.now(UTC))
    assert row is not None
    actions.schedules_changed(o)
    return json_response(serialize.schedule(row), 201)


async def list_schedules(request: Request) -> Response:
    pid = await project(request)
    limit = pagination.limit_of(request)
    cursor = pagination.decode(request, pagination.as_time, pagination.as_text)
    after = (cursor[0], cursor[1]) if cursor else None
    async with orch(request).read_pool.acquire() as conn:
        rows = await schedules.page(conn, pid, after, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    nxt = pagination.encode([rows[-1]["created_at"].isoformat(), rows[-1]["id"]]) if more else None
    return json_response({"schedules": [serialize.schedule(r) for r in rows], "nextCursor": nxt})


async def get_schedule(request: Request) -> Response:
    pid = await project(request)
    sid = _schedule_id(request)
    async with orch(request).pool.acquire() as conn:
        row = _found(await schedules.get(conn, pid, sid), sid)
    return json_response(serialize.schedule(row))


async def update_schedule(request: Request) -> Response:
    pid = await project(request)
    sid = _schedule_id(request)
    body = await read_model(request, ScheduleUpdate)
    given = body.model_fields_set
    if not given:
        raise ValidationFailed(
            "give at least one field to change: cron, timezone, input, overlap, misfire,"
            " disableAfter, sla"
        )
    changes: dict[str, Any] = {name: getattr(body, name) for name in given}
    if "sla" in changes:
        changes["sla_ms"] = changes.pop("sla")
    for name, value in changes.items():
        if value is None and name not in ("input", "sla_ms"):
            field = _CAMEL.get(name, name)
            raise ValidationFailed(f"{field} must not be null", {"fields": {field: "null"}})
    try:
        if "cron" in changes:
            changes["cron"] = rules.parse_cron(changes["cron"])
        if "timezone" in changes:
            rules.parse_timezone(changes["timezone"])
    except rules.ScheduleError as exc:
        raise _invalid(exc) from None
    o = orch(request)
    async with o.pool.acquire() as conn:
        row = _found(await schedules.update(conn, pid, sid, changes, datetime.now(UTC)), sid)
    actions.schedules_changed(o)
    return json_response(serialize.schedule(row))


async def delete_schedule(request: Request) -> Response:
    pid = await project(request)
    sid = _schedule_id(request)
    await refuse_body(request)
    async with orch(request).pool.acquire() as conn:
        if not await schedules.delete(conn, pid, sid):
            raise NotFound(f"no schedule with id {sid!r}")
    return Response(status_code=204)


async def pause_schedule(request: Request) -> Response:
    return json_response(serialize.schedule(await _transition(request, schedules.pause)))


async def resume_schedule(request: Request) -> Response:
    row = await _transition(request, schedules.resume)
    actions.schedules_changed(orch(request))
    return json_response(serialize.schedule(row))


async def _transition(
    request: Request,
    change: Callable[[Conn, uuid.UUID, str, datetime], Awaitable[Record | None]],
) -> Record:
    """Pause or resume the schedule of the path; 409 when its status does not allow it."""
    pid = await project(request)
    sid = _schedule_id(request)
    await refuse_body(request)
    async with orch(request).pool.acquire() as conn:
        try:
            row = await change(conn, pid, sid, datetime.now(UTC))
        except schedules.InvalidTransition as exc:
            raise InvalidState(str(exc)) from None
    return _found(row, sid)


async def trigger_schedule(request: Request) -> Response:
    pid = await project(request)
    sid = _schedule_id(request)
    await refuse_body(request)
    o = orch(request)
    async with o.pool.acquire() as conn:
        try:
            run = await actions.trigger_schedule(o, conn, pid, sid, datetime.now(UTC))
        except schedules.WorkflowGone as exc:
            raise NotFound(f"{exc}; sync the app that hosts it") from None
        run = _found(run, sid)
        return json_response(
            await reads.run_json(conn, run, callback_url=reads.callback_url(o)), 201
        )
