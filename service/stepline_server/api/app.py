"""The REST API's routes (every public one) and its error handlers; the one ASGI app that
serves them with the dashboard is built by :mod:`stepline_server.asgi`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Scope

from stepline_server import params
from stepline_server.api import routes_alerts as alerts
from stepline_server.api import routes_apps as apps
from stepline_server.api import routes_deployments as deployments
from stepline_server.api import routes_health as health
from stepline_server.api import routes_operations as operations
from stepline_server.api import routes_pause as pause
from stepline_server.api import routes_protocol as protocol
from stepline_server.api import routes_pull as pull
from stepline_server.api import routes_results as results
from stepline_server.api import routes_runs as runs
from stepline_server.api import routes_schedules as schedules
from stepline_server.api import routes_state as run_state
from stepline_server.api import routes_tenancy as tenancy
from stepline_server.api import routes_waits as waits
from stepline_server.api.errors import (
    ApiError,
    error_response,
    handle_api_error,
    handle_bad_payload,
    handle_http_exception,
    handle_unavailable,
    handle_unexpected,
)
from stepline_server.application import payloads
from stepline_server.store import db

# Starlette tries routes in order: the SDK's progress call, made once per step, comes first
# (ProgressFastPath answers it before Starlette in the app stepline_server.asgi builds).
ROUTES: list[BaseRoute] = [
    Route("/v1/invocations/{invocationId}/progress", protocol.progress, methods=["POST"]),
    Route(
        "/v1/invocations/{invocationId}/results/{position}", results.step_result, methods=["GET"]
    ),
    Route("/v1/invocations/{invocationId}/steps", results.invocation_steps, methods=["GET"]),
    Route("/v1/invocations/{invocationId}/heartbeat", pull.heartbeat, methods=["POST"]),
    Route("/v1/invocations/{invocationId}/answer", pull.answer, methods=["POST"]),
    Route("/healthz", health.healthz, methods=["GET"]),
    Route("/readyz", health.readyz, methods=["GET"]),
    Route("/metrics", health.metrics, methods=["GET"]),
    Route("/v1/apps", apps.create_app, methods=["POST"]),
    Route("/v1/apps", apps.list_apps, methods=["GET"]),
    Route("/v1/apps/{app}", apps.get_app, methods=["GET"]),
    Route("/v1/apps/{app}", apps.update_app, methods=["PATCH"]),
    Route("/v1/apps/{app}", apps.delete_app, methods=["DELETE"]),
    Route("/v1/apps/{app}/sync", apps.sync_app, methods=["POST"]),
    Route("/v1/apps/{app}/rotate-secret", apps.rotate_secret, methods=["POST"]),
    Route("/v1/apps/{app}/deployments", deployments.list_deployments, methods=["GET"]),
    Route("/v1/apps/{app}/deployments", deployments.create_deployment, methods=["POST"]),
    Route("/v1/apps/{app}/deployments/{deployment}", deployments.get_deployment, methods=["GET"]),
    Route(
        "/v1/apps/{app}/deployments/{deployment}",
        deployments.delete_deployment,
        methods=["DELETE"],
    ),
    Route("/v1/apps/{app}/poll", pull.poll, methods=["POST"]),
    Route("/v1/apps/{app}/pause", pause.pause_app, methods=["POST"]),
    Route("/v1/apps/{app}/resume", pause.resume_app, methods=["POST"]),
    Route("/v1/workflows", apps.list_workflows, methods=["GET"]),
    Route("/v1/workflows/{name}/pause", pause.pause_workflow, methods=["POST"]),
    Route("/v1/workflows/{name}/resume", pause.resume_workflow, methods=["POST"]),
    Route("/v1/runs", runs.start_run, methods=["POST"]),
    Route("/v1/runs", runs.list_runs, methods=["GET"]),
    Route("/v1/runs/bulk", operations.bulk_runs, methods=["POST"]),
    Route("/v1/runs/{runId}", runs.get_run, methods=["GET"]),
    Route("/v1/runs/{runId}/cancel", runs.cancel_run, methods=["POST"]),
    Route("/v1/runs/{runId}/move", deployments.move_run, methods=["POST"]),
    Route("/v1/runs/{runId}/retry", runs.retry_run, methods=["POST"]),
    Route("/v1/runs/{runId}/events", runs.list_events, methods=["GET"]),
    Route("/v1/runs/{runId}/invocations", runs.list_invocations, methods=["GET"]),
    Route("/v1/runs/{runId}/logs", runs.list_logs, methods=["GET"]),
    Route("/v1/runs/{runId}/replay", runs.get_replay, methods=["GET"]),
    Route("/v1/runs/{runId}/state", run_state.get_state, methods=["GET"]),
    Route("/v1/runs/{runId}/state/{key}", run_state.get_state_key, methods=["GET"]),
    Route("/v1/operations", operations.list_operations, methods=["GET"]),
    Route("/v1/operations/{operationId}", operations.get_operation, methods=["GET"]),
    Route("/v1/operations/{operationId}/cancel", operations.cancel_operation, methods=["POST"]),
    Route("/v1/callbacks/{callbackId}", waits.get_callback, methods=["GET"]),
    Route("/v1/callbacks/{callbackId}", waits.complete_callback, methods=["POST"]),
    Route(
        "/v1/callbacks/{callbackId}/{signature}", waits.complete_signed_callback, methods=["POST"]
    ),
    Route("/v1/events", waits.send_event, methods=["POST"]),
    Route("/v1/events", waits.list_events, methods=["GET"]),
    Route("/v1/schedules", schedules.create_schedule, methods=["POST"]),
    Route("/v1/schedules", schedules.list_schedules, methods=["GET"]),
    Route("/v1/schedules/{scheduleId}", schedules.get_schedule, methods=["GET"]),
    Route("/v1/schedules/{scheduleId}", schedules.update_schedule, methods=["PATCH"]),
    Route("/v1/schedules/{scheduleId}", schedules.delete_schedule, methods=["DELETE"]),
    Route("/v1/schedules/{scheduleId}/pause", schedules.pause_schedule, methods=["POST"]),
    Route("/v1/schedules/{scheduleId}/resume", schedules.resume_schedule, methods=["POST"]),
    Route("/v1/schedules/{scheduleId}/trigger", schedules.trigger_schedule, methods=["POST"]),
    Route("/v1/alerts", alerts.create_alert, methods=["POST"]),
    Route("/v1/alerts", alerts.list_alerts, methods=["GET"]),
    Route("/v1/alerts/{alertId}", alerts.get_alert, methods=["GET"]),
    Route("/v1/alerts/{alertId}", alerts.update_alert, methods=["PATCH"]),
    Route("/v1/alerts/{alertId}", alerts.delete_alert, methods=["DELETE"]),
    Route("/v1/alerts/{alertId}/test", alerts.test_alert, methods=["POST"]),
    Route("/v1/alerts/{alertId}/deliveries", alerts.list_deliveries, methods=["GET"]),
    Route("/v1/projects", tenancy.list_projects, methods=["GET"]),
    Route("/v1/environments", tenancy.list_environments, methods=["GET"]),
    Route("/v1/environments", tenancy.create_environment, methods=["POST"]),
    Route("/v1/keys", tenancy.list_keys, methods=["GET"]),
    Route("/v1/keys", tenancy.create_key, methods=["POST"]),
    Route("/v1/keys/{keyId}", tenancy.revoke_key, methods=["DELETE"]),
]


async def _refused(scope: Scope, refusal: params.Refusal) -> ASGIApp:
    """A request whose path or query parameters cannot be used, in the API's error shape."""
    error = ApiError(refusal.message, refusal.details)
    error.code, error.status = refusal.code, refusal.status
    return error_response(error)


params.guard(ROUTES, _refused)


def route_table() -> list[tuple[str, set[str]]]:
    """Every public route as (path template, methods), for the OpenAPI parity test."""
    table = []
    for route in ROUTES:
        assert isinstance(route, Route)
        methods = set(route.methods or ()) - {"HEAD", "OPTIONS"}
        table.append((route.path, methods))
    return table


EXCEPTION_HANDLERS: dict[Any, Callable[[Request, Exception], Any]] = {
    ApiError: handle_api_error,
    payloads.BadPayload: handle_bad_payload,
    HTTPException: handle_http_exception,
    # Handled by type, before the catch-all: Starlette answers the catch-all's
    # response and then raises again, and the server drops the connection.
    **{kind: handle_unavailable for kind in db.UNAVAILABLE},
    Exception: handle_unexpected,
}
"""How the API answers an error, by its type (the dashboard answers its own under ``/ui``)."""
