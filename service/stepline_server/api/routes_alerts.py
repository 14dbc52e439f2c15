"""Routes for alerts (role admin): create, list, read, change, delete, send a test, and the
deliveries of an alert's notifications."""

from __future__ import annotations

import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from stepline_server.api import auth, pagination
from stepline_server.api.context import orch, path_uuid
from stepline_server.api.errors import NotFound, ValidationFailed
from stepline_server.api.responses import json_response, read_model
from stepline_server.application import actions, alert_input, alerts_json
from stepline_server.application.alert_input import AlertCreate, AlertUpdate
from stepline_server.store import alerts
from stepline_server.store.db import Record

_FIELDS = "name, on, workflow, destination"


async def _env(request: Request) -> uuid.UUID:
    return (await auth.require_admin(request)).environment_id


async def _alert(request: Request, pid: uuid.UUID) -> Record:
    alert_id = path_uuid(request, "alertId", "alert")
    async with orch(request).pool.acquire() as conn:
        row = await alerts.get(conn, pid, alert_id)
    if row is None:
        raise NotFound(f"no alert with id {alert_id}")
    return row


async def create_alert(request: Request) -> Response:
    pid = await _env(request)
    body = await read_model(request, AlertCreate)
    row = await alert_input.create(orch(request), pid, body)
    return json_response(alerts_json.alert(row, secret=True), 201)


async def list_alerts(request: Request) -> Response:
    pid = await _env(request)
    limit = pagination.limit_of(request)
    cursor = pagination.decode(request, pagination.as_time, pagination.as_uuid)
    after = (cursor[0], cursor[1]) if cursor else None
    async with orch(request).read_pool.acquire() as conn:
        rows = await alerts.page(conn, pid, after, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    nxt = _cursor(rows[-1]) if more else None
    return json_response({"alerts": [alerts_json.alert(r) for r in rows], "nextCursor": nxt})


def _cursor(row: Record) -> str:
    return pagination.encode([row["created_at"].isoformat(), str(row["id"])])


async def get_alert(request: Request) -> Response:
    pid = await _env(request)
    return json_response(alerts_json.alert(await _alert(request, pid)))


async def update_alert(request: Request) -> Response:
    pid = await _env(request)
    current = await _alert(request, pid)
    body = await read_model(request, AlertUpdate)
    given = body.model_fields_set
    if not given:
        raise ValidationFailed(f"give at least one field to change: {_FIELDS}")
    for name in ("name", "on", "destination"):
        if name in given and getattr(body, name) is None:
            raise ValidationFailed(f"{name} must not be null", {"fields": {name: "null"}})
    changes: dict[str, Any] = {}
    new_secret = False
    if body.destination is not None:
        # 422 naming destination.url when the egress rules refuse where it points.
        await alert_input.check_destination(orch(request), body.destination.url)
        changes["destination_type"] = body.destination.type
        changes["url"] = body.destination.url
        # A Slack alert turned into a webhook gets a secret it shows now (it never showed one).
        if body.destination.type == "webhook" and current["destination_type"] != "webhook":
            changes["secret"] = alerts.new_secret()
            new_secret = True
    async with orch(request).pool.acquire() as conn:
        row = await alerts.update(
            conn,
            pid,
            current["id"],
            name=body.name,
            types=alert_input.unique(list(body.on)) if body.on is not None else None,
            set_workflow="workflow" in given,
            workflow=body.workflow,
            **changes,
        )
    if row is None:
        raise NotFound(f"no alert with id {current['id']}")
    return json_response(alerts_json.alert(row, secret=new_secret))


async def delete_alert(request: Request) -> Response:
    pid = await _env(request)
    alert_id = path_uuid(request, "alertId", "alert")
    async with orch(request).pool.acquire() as conn:
        if not await alerts.delete(conn, pid, alert_id):
            raise NotFound(f"no alert with id {alert_id}")
    return Response(status_code=204)


async def test_alert(request: Request) -> Response:
    """Send one ``alert.test`` notification now; answers its delivery, pending (``202``)."""
    pid = await _env(request)
    alert_id = path_uuid(request, "alertId", "alert")
    o = orch(request)
    async with o.pool.acquire() as conn:
        row = await alerts.record_test(conn, pid, alert_id)
    if row is None:
        raise NotFound(f"no alert with id {alert_id}")
    actions.alert_queued(o)
    return json_response(alerts_json.delivery(row), 202)


async def list_deliveries(request: Request) -> Response:
    pid = await _env(request)
    row = await _alert(request, pid)
    limit = pagination.limit_of(request)
    cursor = pagination.decode(request, pagination.as_time, pagination.as_uuid)
    after = (cursor[0], cursor[1]) if cursor else None
    async with orch(request).read_pool.acquire() as conn:
        rows = await alerts.deliveries(conn, row["id"], after, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    nxt = _cursor(rows[-1]) if more else None
    return json_response({"deliveries": [alerts_json.delivery(r) for r in rows], "nextCursor": nxt})
