"""The dashboard's routes under ``/ui``, its static files, and the headers every answer has."""

from __future__ import annotations

from pathlib import Path

from starlette.applications import Starlette
from starlette.datastructures import MutableHeaders, State
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from stepline_server import params
from stepline_server.ui import pages_admin as admin
from stepline_server.ui import pages_alerts as alerts
from stepline_server.ui import pages_bulk as bulk
from stepline_server.ui import pages_deployments as deployments
from stepline_server.ui import pages_runs as runs
from stepline_server.ui import render
from stepline_server.ui.web import Shared, endpoint

STATIC = Path(__file__).parent / "static"

# Scripts and styles from this origin only, nothing inline, no frames, forms to itself.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)


class SecurityHeaders:
    """Adds the Content-Security-Policy and its companions to every dashboard answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                h = MutableHeaders(scope=message)
                h["content-security-policy"] = CSP
                h["x-content-type-options"] = "nosniff"
                h["x-frame-options"] = "DENY"
                h["referrer-policy"] = "same-origin"
                h.setdefault("cache-control", "no-store")
            await send(message)

        await self.app(scope, receive, with_headers)


def dashboard(state: State) -> ASGIApp:
    """The dashboard app, reading the orchestrator from the main app's ``state``."""
    s = Shared(state)
    w = {"write": True}
    routes: list[BaseRoute] = [
        Route("/", endpoint(s, runs.home)),
        Route("/login", endpoint(s, runs.login_form, public=True)),
        Route("/login", endpoint(s, runs.login, public=True), methods=["POST"]),
        Route("/logout", endpoint(s, runs.logout, public=True), methods=["POST"]),
        Route("/runs", endpoint(s, runs.runs_page)),
        Route("/runs/rows", endpoint(s, runs.runs_rows)),
        Route("/runs/bulk", endpoint(s, bulk.confirm, **w), methods=["POST"]),
        Route("/runs/bulk/start", endpoint(s, bulk.start, **w), methods=["POST"]),
        Route("/operations", endpoint(s, bulk.operations_page)),
        Route("/operations/{operationId}", endpoint(s, bulk.operation_page)),
        Route("/operations/{operationId}/live", endpoint(s, bulk.operation_live)),
        Route(
            "/operations/{operationId}/cancel",
            endpoint(s, bulk.cancel_operation, **w),
            methods=["POST"],
        ),
        Route("/runs/{runId}", endpoint(s, runs.run_page)),
        Route("/runs/{runId}/live", endpoint(s, runs.run_live)),
        Route("/runs/{runId}/cancel", endpoint(s, runs.cancel, **w), methods=["POST"]),
        Route("/runs/{runId}/retry", endpoint(s, runs.retry, **w), methods=["POST"]),
        Route(
            "/callbacks/{callbackId}",
            endpoint(s, runs.complete_callback, **w),
            methods=["POST"],
        ),
        Route("/workflows", endpoint(s, admin.workflows_page)),
        Route("/apps", endpoint(s, admin.apps_page)),
        Route("/apps/{app}/sync", endpoint(s, admin.sync_app, **w), methods=["POST"]),
        Route("/apps/{app}", endpoint(s, deployments.app_page)),
        Route(
            "/apps/{app}/deployments/{deployment}/move",
            endpoint(s, deployments.move_runs, **w),
            methods=["POST"],
        ),
        Route(
            "/apps/{app}/deployments/{deployment}/delete",
            endpoint(s, deployments.delete, **w),
            methods=["POST"],
        ),
        *(
            Route(f"/{what}/{{{key}}}/{action}", endpoint(s, change, **w), methods=["POST"])
            for what, key, change in (
                ("apps", "app", admin.change_app),
                ("workflows", "name", admin.change_workflow),
            )
            for action in ("pause", "resume")
        ),
        Route("/schedules", endpoint(s, admin.schedules_page)),
        Route(
            "/schedules/{scheduleId}/{action}",
            endpoint(s, admin.change_schedule, **w),
            methods=["POST"],
        ),
        Route("/events", endpoint(s, admin.events_page)),
        Route("/events", endpoint(s, admin.send_event, **w), methods=["POST"]),
        Route("/keys", endpoint(s, admin.keys_page)),
        Route("/keys", endpoint(s, admin.create_key, **w), methods=["POST"]),
        Route("/keys/{keyId}/revoke", endpoint(s, admin.revoke_key, **w), methods=["POST"]),
        Route("/alerts", endpoint(s, alerts.alerts_page)),
        Route("/alerts", endpoint(s, alerts.create_alert, **w), methods=["POST"]),
        Route("/alerts/{alertId}/test", endpoint(s, alerts.test_alert, **w), methods=["POST"]),
        Route("/alerts/{alertId}/delete", endpoint(s, alerts.delete_alert, **w), methods=["POST"]),
        Mount("/static", app=StaticFiles(directory=STATIC)),
    ]
    params.guard(routes, _refused)
    handlers = {404: _no_page, 405: _no_page}
    return SecurityHeaders(Starlette(routes=routes, exception_handlers=handlers))


async def _refused(scope: Scope, refusal: params.Refusal) -> ASGIApp:
    """A dashboard request whose path or query parameters cannot be used: an error page."""
    title = "Not found" if refusal.status == 404 else "Refused"
    message = refusal.message[:1].upper() + refusal.message[1:] + "."
    return render.page("error.html", refusal.status, title=title, message=message)


async def _no_page(request: Request, exc: Exception) -> Response:
    """A dashboard path with no page (or not for this method): an error page, like others."""
    if isinstance(exc, HTTPException) and exc.status_code == 405:
        return render.page("error.html", 405, title="Refused", message="Not allowed here.")
    return render.page("error.html", 404, title="Not found", message="There is no such page.")


async def _to_dashboard(request: object) -> Response:
    return RedirectResponse("/ui/", 307)


def routes(state: State) -> list[BaseRoute]:
    """``/ui`` and ``/`` (which leads there), for the orchestrator's app."""
    return [Mount("/ui", app=dashboard(state)), Route("/", _to_dashboard, methods=["GET"])]
