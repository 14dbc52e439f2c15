"""What a route needs from the running orchestrator, reached through the request."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from starlette.requests import Request

from stepline_server.api.errors import NotFound
from stepline_server.engine import access

if TYPE_CHECKING:
    from stepline_server.orchestrator import Orchestrator


def orch(request: Request) -> Orchestrator:
    return request.app.state.orchestrator  # type: ignore[no-any-return]


async def project(request: Request) -> uuid.UUID:
    """The scope of the caller's queries (its key's environment), once its role allows the
    request's method: ``GET`` for any key, anything else for ``write`` and ``admin`` keys
    (``403 forbidden`` otherwise, before the body is read)."""
    from stepline_server.api import auth

    ctx = auth.require_role(await auth.caller(request), access.needed_for(request.method))
    return ctx.environment_id


def path_uuid(request: Request, name: str, what: str) -> uuid.UUID:
    """A UUID path parameter; anything else is simply not found."""
    try:
        return uuid.UUID(request.path_params[name])
    except ValueError:
        raise NotFound(f"no {what} with id {request.path_params[name]!r}") from None
