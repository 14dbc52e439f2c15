"""The alerts page (admin keys): each alert with its recent deliveries; make one (with the
REST route's rules and refusals, :mod:`stepline_server.application.alert_input`), send a test
notification, delete one."""

from __future__ import annotations

import uuid
from typing import Any

from starlette.responses import Response

from stepline_server.application import actions, alert_input, alerts_json, payloads
from stepline_server.engine.alerts import SUBSCRIBABLE, DestinationType
from stepline_server.store import alerts
from stepline_server.ui import permissions
from stepline_server.ui.web import Req

RECENT = 10
"""Deliveries shown per alert."""
PAGE = "/ui/alerts"


def _refused(r: Req) -> Response | None:
    assert r.viewer is not None
    if permissions.is_admin(r.viewer):
        return None
    return r.page("error.html", 403, title="Refused", message="Alerts are for admin keys.")


async def alerts_page(r: Req, status: int = 200, **made: Any) -> Response:
    """The alerts; ``made`` says what the form just did: ``made`` (the alert, its secret shown
    this once), or ``problem`` (why it was refused) and ``entered`` (the form, to send again)."""
    if (refused := _refused(r)) is not None:
        return refused
    shown = []
    async with r.orch.pool.acquire() as conn:
        for row in await alerts.page(conn, r.pid, None, 100):
            recent = await alerts.deliveries(conn, row["id"], None, RECENT)
            shown.append(
                {**alerts_json.alert(row), "deliveries": [alerts_json.delivery(d) for d in recent]}
            )
    return r.page(
        "alerts.html",
        status,
        title="Alerts",
        alerts=shown,
        types=SUBSCRIBABLE,
        destinations=[d.value for d in DestinationType],
        entered=made.pop("entered", {}),
        **made,
    )


def _entered(r: Req) -> dict[str, Any]:
    """The form's fields shaped as the REST body (an empty workflow: every workflow)."""
    return {
        "name": r.form.get("name", ""),
        "on": r.form_values("on"),
        "workflow": r.form.get("workflow") or None,
        "destination": {
            "type": r.form.get("destination.type", ""),
            "url": r.form.get("destination.url", ""),
        },
    }


async def create_alert(r: Req) -> Response:
    """``POST /ui/alerts``: make an alert as ``POST /v1/alerts`` does; a refusal shows the
    route's message and each field's reason, and nothing is made."""
    if (refused := _refused(r)) is not None:
        return refused
    entered = _entered(r)
    try:
        row = await alert_input.create(r.orch, r.pid, alert_input.parse_create(entered))
    except payloads.BadPayload as exc:
        problem = {"message": exc.message, "fields": exc.details.get("fields", {})}
        return await alerts_page(r, 422, problem=problem, entered=entered)
    return await alerts_page(r, 201, made=alerts_json.alert(row, secret=True))


def _alert_id(r: Req) -> uuid.UUID | None:
    try:
        return uuid.UUID(r.request.path_params["alertId"])
    except ValueError:
        return None


async def test_alert(r: Req) -> Response:
    if (refused := _refused(r)) is not None:
        return refused
    alert_id = _alert_id(r)
    async with r.orch.pool.acquire() as conn:
        row = None if alert_id is None else await alerts.record_test(conn, r.pid, alert_id)
    if row is None:
        return r.back(PAGE, "There is no such alert.")
    actions.alert_queued(r.orch)
    return r.back(PAGE, f"Test notification {row['id']} sent; reload to see how it went.")


async def delete_alert(r: Req) -> Response:
    if (refused := _refused(r)) is not None:
        return refused
    alert_id = _alert_id(r)
    async with r.orch.pool.acquire() as conn:
        done = alert_id is not None and await alerts.delete(conn, r.pid, alert_id)
    return r.back(PAGE, "Alert deleted." if done else "There is no such alert.")
