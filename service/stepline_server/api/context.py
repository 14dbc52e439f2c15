"""What a route needs from the running orchestrator, reached through the request."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from starlette.requests import Request

from stepline_server.api.errors import NotFound

if TYPE_CHECKING:
    from stepline_server.api.auth import KeyCache
    from stepline_server.orchestrator import Orchestrator


def orch(request: Request) -> Orchestrator:
    return request.app.state.orchestrator  # type: ignore[no-any-return]


async def project(request: Request) -> uuid.UUID:
    """The caller's project, from its API key."""
    keys: KeyCache = request.app.state.keys
    return await keys.project(request)


def path_uuid(request: Request, name: str, what: str) -> uuid.UUID:
    """A UUID path parameter; anything else is simply not found."""
    try:
        return uuid.UUID(request.path_params[name])
    except ValueError:
        raise NotFound(f"no {what} with id {request.path_params[name]!r}") from None
