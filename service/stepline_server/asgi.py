"""The orchestrator's one ASGI app: the REST API (:mod:`stepline_server.api`), the dashboard
under ``/ui`` (:mod:`stepline_server.ui`) and the SDK's progress fast path, with the lifespan
that starts and stops the orchestrator. Everything that serves the orchestrator builds it
here."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.datastructures import State

from stepline_server import authlimits
from stepline_server.api import app as api
from stepline_server.api.auth import KeyCache
from stepline_server.api.body_timeout import BodyTimeout
from stepline_server.api.routes_protocol import ProgressFastPath
from stepline_server.authlimits import AuthFailures
from stepline_server.orchestrator import Orchestrator
from stepline_server.ui import app as ui


def build_app(orchestrator: Orchestrator) -> BodyTimeout:
    """The orchestrator's ASGI app; its lifespan starts and stops ``orchestrator``."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await orchestrator.start()
        app.state.orchestrator = orchestrator
        s = orchestrator.settings
        # Shared: API keys and the dashboard's sign-in count failures in the same budget.
        app.state.auth_failures = AuthFailures(
            s.auth_failure_limit,
            s.auth_failure_budget,
            s.auth_failure_delay_seconds,
            authlimits.parse_proxies(s.trusted_proxies),
        )
        app.state.keys = KeyCache(orchestrator.pool, app.state.auth_failures)
        try:
            yield
        finally:
            await orchestrator.stop()

    state = State()
    app = Starlette(
        routes=api.ROUTES + ui.routes(state),
        lifespan=lifespan,
        exception_handlers=api.EXCEPTION_HANDLERS,
    )
    # A path with a trailing slash is not found rather than redirected: an empty signature
    # (``/v1/callbacks/{id}/``) must not be sent on to the API-key route.
    app.router.redirect_slashes = False
    app.state = state
    return BodyTimeout(
        ProgressFastPath(app, app.state),
        orchestrator.settings.body_timeout_seconds,
        on_shutdown=orchestrator.closing,
    )
