"""Path and query parameters checked once, for every route of the API and the dashboard,
before a route reads them.

PostgreSQL refuses text holding a NUL character, so none may reach a query: a path parameter
holding one, or one that cannot be an id of its kind (``runId`` not a UUID, ``scheduleId``
not ``wfs_…``), names nothing and is ``404 not_found``; a query parameter holding a NUL (or
any other control character but tab) is ``422 validation_failed`` naming it. :func:`guard`
wraps every route of a route list, so a route added later is checked like the others; what a
refusal looks like (JSON in the API, a page in the dashboard) is the caller's choice.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

MAX_PARAMETER = 1024
"""The longest path or query parameter value accepted (a signed callback URL's signature,
an app's name and a run key are far shorter)."""

_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_APP_REF = re.compile(r"[A-Za-z0-9._-]{1,128}")
_SCHEDULE_ID = re.compile(r"wfs_[A-Za-z0-9]{1,64}")


def _uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


# What each path parameter can be, by its name in the route templates; any other is free text.
_PATH_SHAPES: dict[str, tuple[str, Callable[[str], bool]]] = {
    "runId": ("run", _uuid),
    "callbackId": ("callback", _uuid),
    "keyId": ("key", _uuid),
    "scheduleId": ("schedule", lambda v: _SCHEDULE_ID.fullmatch(v) is not None),
    "app": ("app", lambda v: _APP_REF.fullmatch(v) is not None),
}


@dataclass(frozen=True)
class Refusal:
    """Why a request's parameters were refused: the status, the API error code, a sentence
    and the details (``fields`` naming the parameter)."""

    status: int
    code: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be a parameter (PostgreSQL cannot store it, or it is too long)."""
    if "\x00" in value:
        return "must not contain NUL characters"
    if _CONTROL.search(value):
        return "must not contain control characters"
    if len(value) > MAX_PARAMETER:
        return f"must be at most {MAX_PARAMETER} characters"
    return None


def path_refusal(params: dict[str, Any]) -> Refusal | None:
    """A 404 when a path parameter holds what no id can (see the module's docstring)."""
    for name, value in params.items():
        if not isinstance(value, str):
            continue
        what, fits = _PATH_SHAPES.get(name, ("resource", lambda v: True))
        if text_problem(value) is not None or not fits(value):
            shown = value[:64].encode("unicode_escape").decode("ascii")
            return Refusal(404, "not_found", f"no {what} {shown!r}", {"parameter": name})
    return None


def query_refusal(query_string: bytes) -> Refusal | None:
    """A 422 naming the first query parameter whose name or value cannot be used."""
    text = query_string.decode("latin-1")
    for name, value in parse_qsl(text, keep_blank_values=True):
        problem = text_problem(name) or text_problem(value)
        if problem:
            # Named as the other checks of a query parameter name it (``fields.cursor``).
            where = name[:64].encode("unicode_escape").decode("ascii")
            message = f"invalid query parameter {where!r}: {problem}"
            return Refusal(422, "validation_failed", message, {"fields": {where: problem}})
    return None


def refusal_of(scope: Scope) -> Refusal | None:
    """What is wrong with a routed request's parameters, or None."""
    return path_refusal(scope.get("path_params") or {}) or query_refusal(
        scope.get("query_string", b"")
    )


Refuse = Callable[[Scope, Refusal], Awaitable[ASGIApp]]
"""Builds the answer to a refused request (an ASGI app, e.g. a Starlette response)."""


class _Checked:
    """A route's ASGI app, reached only by requests whose parameters pass."""

    def __init__(self, app: ASGIApp, refuse: Refuse) -> None:
        self.app = app
        self.refuse = refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refused = refusal_of(scope)
            if refused is not None:
                answer = await self.refuse(scope, refused)
                await answer(scope, receive, send)
                return
        await self.app(scope, receive, send)


def guard(routes: Iterable[BaseRoute], refuse: Refuse) -> None:
    """Check the parameters of every request to ``routes`` (in place) before it is handled."""
    for route in routes:
        if isinstance(route, Route | Mount) and not isinstance(route.app, _Checked):
            route.app = _Checked(route.app, refuse)
