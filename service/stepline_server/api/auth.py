"""API keys: ``Authorization: Bearer <key>`` resolved to a project, cached briefly."""

from __future__ import annotations

import time
import uuid

from starlette.requests import Request

from stepline_server.api.errors import Unauthorized
from stepline_server.store import keys
from stepline_server.store.db import Pool

_TTL = 30.0


class KeyCache:
    """Known keys for ``_TTL`` seconds, so a request costs no lookup most of the time."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._known: dict[str, tuple[uuid.UUID, float]] = {}

    async def project(self, request: Request) -> uuid.UUID:
        header = request.headers.get("authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise Unauthorized("send an API key as 'Authorization: Bearer <key>'")
        key = key.strip()
        hit = self._known.get(key)
        now = time.monotonic()
        if hit and hit[1] > now:
            return hit[0]
        async with self._pool.acquire() as conn:
            project = await keys.project_of_key(conn, key)
        if project is None:
            raise Unauthorized("the API key is not valid")
        if len(self._known) > 10_000:
            self._known.clear()
        self._known[key] = (project, now + _TTL)
        return project
