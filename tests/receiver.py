"""A webhook receiver for alert tests: a small Starlette app on loopback that keeps every
request it gets and answers them as told (a list of statuses, then 200), or not at all."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.support import serve


@dataclass
class Received:
    body: bytes
    headers: dict[str, str]

    @property
    def json(self) -> Any:
        return orjson.loads(self.body)


@dataclass
class Receiver:
    """Answers the statuses of ``answers`` in turn, then 200; with ``hang``, answers nothing
    until ``release`` is set."""

    answers: list[int] = field(default_factory=list)
    hang: bool = False
    received: list[Received] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    url: str = ""

    async def _hook(self, request: Request) -> Response:
        self.received.append(Received(await request.body(), dict(request.headers)))
        if self.hang:
            await self.release.wait()
        status = self.answers.pop(0) if self.answers else 200
        return Response(b"{}", status, media_type="application/json")

    @contextlib.asynccontextmanager
    async def running(self, port: int | None = None) -> AsyncIterator[Receiver]:
        app = Starlette(routes=[Route("/hook", self._hook, methods=["POST"])])
        try:
            async with serve(app, port) as base:
                self.url = base + "/hook"
                try:
                    yield self
                finally:
                    self.release.set()  # a hanging answer ends, so the server can stop
        finally:
            self.release.set()

    async def until(self, count: int, seconds: float = 30.0) -> list[Received]:
        """The requests once there are at least ``count`` (AssertionError after ``seconds``)."""
        for _ in range(int(seconds / 0.05)):
            if len(self.received) >= count:
                return self.received
            await asyncio.sleep(0.05)
        raise AssertionError(f"expected {count} requests, got {len(self.received)}")
