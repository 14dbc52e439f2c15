"""What a route needs from the running orchestrator, reached through the request."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from starlette.requests import Request

from stepline.wire import parse_duration
from stepline_server.api import auth
from stepline_server.api.errors import NotFound, ValidationFailed
from stepline_server.engine import access

if TYPE_CHECKING:
    from stepline_server.orchestrator import Orchestrator


def orch(request: Request) -> Orchestrator:
    return request.app.state.orchestrator  # type: ignore[no-any-return]


async def project(request: Request) -> uuid.UUID:
    """The scope of the caller's queries (its key's environment), once its role allows the
    request's method: ``GET`` for any key, anything else for ``write`` and ``admin`` keys
    (``403 forbidden`` otherwise, before the body is read)."""
    ctx = auth.require_role(await auth.caller(request), access.needed_for(request.method))
    return ctx.environment_id


MAX_WAIT = 60.0  # the longest a long poll (``?wait=``) holds a request


def wait_seconds(request: Request) -> float:
    """The request's ``?wait=`` duration in seconds, at most :data:`MAX_WAIT` (0 without it);
    422 when it is no duration."""
    if "wait" not in request.query_params:
        return 0.0
    try:
        return min(MAX_WAIT, parse_duration(request.query_params["wait"]))
    except ValueError as exc:
        raise ValidationFailed(str(exc), {"fields": {"wait": str(exc)}}) from None


def path_uuid(request: Request, name: str, what: str) -> uuid.UUID:
    """A UUID path parameter; anything else is simply not found."""
    try:
        return uuid.UUID(request.path_params[name])
    except ValueError:
        raise NotFound(f"no {what} with id {request.path_params[name]!r}") from None
