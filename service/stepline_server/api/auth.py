"""API keys and roles: ``Authorization: Bearer <key>`` resolved to the caller's key context.

The API other parts of the orchestrator (routes, the dashboard, the operator CLI's server
side) use::

    ctx = await auth.caller(request)        # KeyContext, or 401 unauthorized / 429 rate_limited
    ctx.environment_id                      # the scope of every query (a key sees one environment)
    ctx.project_id, ctx.project, ctx.environment, ctx.role, ctx.key_id
    auth.require_role(ctx, "admin")         # 403 forbidden unless the role allows it
    ctx = await auth.require_write(request) # caller() + 403 for a read key

Roles (``ROLE_RANK``): ``owner`` (everything in every environment of the project: keys of
any environment, new environments) > ``admin`` (everything in its environment, its keys
included) > ``write`` (everything but keys) > ``read`` (``GET`` only).
:func:`stepline_server.api.context.project` checks the method for every route: a request other
than ``GET``/``HEAD`` needs ``write``.

A key is looked up at most every ``_TTL`` seconds per orchestrator, so a key revoked on any
orchestrator is refused on every other one within a second. Failed authentications are limited
per client address and across all of them (:mod:`stepline_server.authlimits`): past a limit a
failure is ``429 rate_limited`` with ``Retry-After`` instead of ``401``; a valid key is never
refused or slowed by it.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from starlette.requests import Request

from stepline_server.api.errors import Forbidden, RateLimited, Unauthorized
from stepline_server.authlimits import AuthFailures
from stepline_server.engine import access
from stepline_server.store import keys
from stepline_server.store.db import Pool

_TTL = 0.5
_MAX_KEY = 512

ROLE_RANK = access.ROLE_RANK


@dataclass(frozen=True)
class KeyContext:
    """Who is calling: the key, its role and the environment (and project) it sees."""

    key_id: uuid.UUID
    name: str
    role: str
    environment_id: uuid.UUID
    environment: str
    project_id: uuid.UUID
    project: str


class KeyCache:
    """Known keys for ``_TTL`` seconds, so a burst of requests costs one lookup."""

    def __init__(self, pool: Pool, failures: AuthFailures) -> None:
        self._pool = pool
        self._known: dict[str, tuple[KeyContext, float]] = {}
        self.failures = failures

    def forget(self, key_id: uuid.UUID) -> None:
        """Drop a revoked key from this orchestrator's cache at once."""
        self._known = {k: v for k, v in self._known.items() if v[0].key_id != key_id}

    async def context(self, request: Request) -> KeyContext:
        """The key's context; a failure is counted, and past the limits answered 429."""
        try:
            return await self._lookup(request)
        except Unauthorized:
            peer = request.client.host if request.client else ""
            client = self.failures.client(peer, request.headers.get("x-forwarded-for"))
            verdict = self.failures.failed(client)
            await self.failures.hold(verdict)
            if verdict.retry_after is None:
                raise
            raise RateLimited(
                "too many failed authentications; a valid key is still accepted",
                {"retryAfter": verdict.retry_after},
                retry_after=verdict.retry_after,
            ) from None

    async def _lookup(self, request: Request) -> KeyContext:
        header = request.headers.get("authorization", "")
        scheme, _, key = header.partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            raise Unauthorized("send an API key as 'Authorization: Bearer <key>'")
        if len(key) > _MAX_KEY or not key.isascii() or not key.isprintable():
            raise Unauthorized("the API key is not valid")
        now = time.monotonic()
        hit = self._known.get(key)
        if hit and hit[1] > now:
            return hit[0]
        async with self._pool.acquire() as conn:
            row = await keys.find_key(conn, key)
        if row is None:
            self._known.pop(key, None)
            raise Unauthorized("the API key is not valid")
        ctx = KeyContext(
            key_id=row["id"],
            name=row["name"],
            role=row["role"],
            environment_id=row["environment_id"],
            environment=row["environment"],
            project_id=row["project_id"],
            project=row["project"],
        )
        if len(self._known) > 10_000:
            self._known.clear()
        self._known[key] = (ctx, now + _TTL)
        return ctx


async def caller(request: Request) -> KeyContext:
    """The caller's key context; 401 without a valid key, 429 when the address is throttled."""
    cache: KeyCache = request.app.state.keys
    return await cache.context(request)


def require_role(ctx: KeyContext, role: str) -> KeyContext:
    """``ctx`` when its role is ``role`` or above; else 403 forbidden."""
    if not access.allows(ctx.role, role):
        raise Forbidden(
            f"{_an(ctx.role)} key cannot do this; it needs {_an(role)} key",
            {"role": ctx.role, "needed": role},
        )
    return ctx


def _an(role: str) -> str:
    """The role with its article: "an admin", "a write"."""
    return f"{'an' if role[:1] in 'aeiou' else 'a'} {role}"


async def require_write(request: Request) -> KeyContext:
    """The caller's key context when it may change things (``write`` or ``admin``)."""
    return require_role(await caller(request), "write")


async def require_admin(request: Request) -> KeyContext:
    """The caller's key context when it is an ``admin`` key."""
    return require_role(await caller(request), "admin")
