"""A request body that trickles in too slowly is refused (``408 request_timeout``), so a slow
client cannot hold a connection and a request handler open for ever."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from stepline_server.api.errors import RequestTimeout

if TYPE_CHECKING:
    from collections.abc import Callable

    from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyTimeout:
    """ASGI wrapper: each part of an HTTP request's body must arrive within ``seconds`` of the
    previous one (or of the request's start); otherwise reading it raises
    :class:`~stepline_server.api.errors.RequestTimeout`, answered in the error shape."""

    def __init__(
        self, app: ASGIApp, seconds: float, on_shutdown: Callable[[], None] | None = None
    ) -> None:
        self.app = app
        self.seconds = seconds
        # Called when the server begins to shut down (see cli/servers.py): long polls end then.
        self.on_shutdown = on_shutdown

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.seconds <= 0:
            await self.app(scope, receive, send)
            return
        done = False

        async def timed() -> Message:
            nonlocal done
            if done:  # the body was read: later receives wait for the client to go away
                return await receive()
            try:
                async with asyncio.timeout(self.seconds):
                    message = await receive()
            except TimeoutError:
                raise RequestTimeout(
                    f"the request body did not arrive within {self.seconds:g} s"
                ) from None
            if message["type"] != "http.request" or not message.get("more_body"):
                done = True
            return message

        await self.app(scope, timed, send)
