"""The alerts page (admin keys): each alert with its recent deliveries; send a test
notification, delete one. Alerts are made with the API or ``stepline alerts create``."""

from __future__ import annotations

import uuid

from starlette.responses import Response

from stepline_server import alerts_json
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


async def alerts_page(r: Req) -> Response:
    if (refused := _refused(r)) is not None:
        return refused
    shown = []
    async with r.orch.pool.acquire() as conn:
        for row in await alerts.page(conn, r.pid, None, 100):
            recent = await alerts.deliveries(conn, row["id"], None, RECENT)
            shown.append(
                {**alerts_json.alert(row), "deliveries": [alerts_json.delivery(d) for d in recent]}
            )
    return r.page("alerts.html", title="Alerts", alerts=shown)


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
    r.orch.alerts.wake()
    return r.back(PAGE, f"Test notification {row['id']} sent; reload to see how it went.")


async def delete_alert(r: Req) -> Response:
    if (refused := _refused(r)) is not None:
        return refused
    alert_id = _alert_id(r)
    async with r.orch.pool.acquire() as conn:
        done = alert_id is not None and await alerts.delete(conn, r.pid, alert_id)
    return r.back(PAGE, "Alert deleted." if done else "There is no such alert.")
