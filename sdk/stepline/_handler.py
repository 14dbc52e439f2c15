"""The pure ASGI app the orchestrator calls: ``describe`` and ``invoke``, signed POSTs.

It does not depend on where it is mounted. Each POST is read (at most 16 MiB), its signature is
verified before anything else, then the ``kind`` in the body says what to do.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol

import pydantic

from stepline import _json, _signing, protocol
from stepline._errors import SignatureError
from stepline._transport import OrchestratorUnavailable
from stepline._version import __version__

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_CRASH_MESSAGE = 1000
"""A 500's message (the exception's type and message) is cut to this many characters."""

logger = logging.getLogger("stepline")


class App(Protocol):
    """What the handler answers for (:class:`stepline.Stepline`)."""

    signing_secrets: tuple[str, ...]

    def describe(self) -> protocol.DescribeResponse: ...

    def get(self, name: str) -> object | None: ...

    async def invoke(
        self, request: protocol.InvokeRequest, traceparent: str | None = None
    ) -> protocol.InvokeResponse: ...

    async def aclose(self) -> None: ...


class _Reject(Exception):
    """An error answer in the error shape of openapi.yaml."""

    def __init__(self, status: int, code: str, message: str, details: Any = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.details = status, code, message, details

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details is not None:
            error["details"] = self.details
        return {"error": error}


class Handler:
    """ASGI app answering the orchestrator's signed ``describe`` and ``invoke`` calls."""

    def __init__(self, stepline: App) -> None:
        self._replays = _signing.ReplayGuard()
        self.stepline = stepline

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1000})
            return
        try:
            status, body = await self._handle(scope, receive)
        except _Reject as reject:
            status, body = reject.status, reject.body()
        except Exception as exc:
            logger.exception("invocation_crashed")
            # What broke, for the run's history; the traceback stays in the app's log.
            message = f"the SDK handler failed: {type(exc).__name__}: {exc}"[:MAX_CRASH_MESSAGE]
            status, body = 500, _Reject(500, "internal", message).body()
        headers = [
            (b"content-type", b"application/json"),
            (protocol.PROTOCOL_HEADER.encode(), str(protocol.PROTOCOL_VERSION).encode()),
        ]
        if status == 405:
            headers.append((b"allow", b"GET, POST"))
        payload = b"" if scope.get("method") == "HEAD" else _json.dumps(body)
        await _respond(send, status, payload, headers)

    async def _handle(self, scope: Scope, receive: Receive) -> tuple[int, Any]:
        method = scope.get("method", "GET")
        if method in ("GET", "HEAD"):
            return 200, {"sdk": "stepline", "version": _version()}
        if method != "POST":
            raise _Reject(405, "method_not_allowed", f"{method} is not allowed; use POST")
        body = await _read_body(scope, receive)
        header = _header(scope, protocol.SIGNATURE_HEADER.encode())
        try:
            _signing.verify(body, header, self.stepline.signing_secrets)
        except SignatureError as exc:
            raise _Reject(401, "unauthorized", exc.message) from None
        try:
            payload = _json.loads(body)
        except ValueError:
            raise _Reject(400, "invalid_json", "the body is not valid JSON") from None
        kind = payload.get("kind") if isinstance(payload, dict) else None
        if kind == "describe":
            return 200, protocol.dump(self.stepline.describe())
        if kind != "invoke":
            raise _Reject(422, "validation_failed", f"unknown kind {kind!r}", {"fields": ["kind"]})
        if not self._replays.first_time(body):
            raise _Reject(
                409, "replayed", "this invocation was already received; a replay runs nothing"
            )
        try:
            request = protocol.InvokeRequest.model_validate(payload)
        except pydantic.ValidationError as exc:
            fields = sorted({".".join(str(p) for p in e["loc"]) for e in exc.errors()})
            raise _Reject(
                422, "validation_failed", "the invoke request is not valid", {"fields": fields}
            ) from None
        if self.stepline.get(request.workflow) is None:
            raise _Reject(
                404,
                "workflow_not_found",
                f"workflow {request.workflow!r} is not registered in this app",
            )
        try:
            response = await self.stepline.invoke(request, _header(scope, b"traceparent"))
        except OrchestratorUnavailable as exc:
            raise _Reject(503, "orchestrator_unavailable", str(exc)) from None
        return 200, protocol.dump(response)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.stepline.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return


def _version() -> str:
    return __version__


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


async def _read_body(scope: Scope, receive: Receive) -> bytes:
    length = _header(scope, b"content-length")
    if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise _Reject(413, "payload_too_large", "the body is over 16 MiB")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Reject(400, "invalid_request", "the client disconnected")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise _Reject(413, "payload_too_large", "the body is over 16 MiB")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _respond(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
