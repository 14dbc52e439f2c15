"""JSON in and out: bodies read with a size limit, answers written with orjson."""

from __future__ import annotations

from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from stepline_server.api import errors
from stepline_server.application import payloads

MAX_BODY = payloads.MAX_BYTES

M = TypeVar("M", bound=BaseModel)


def json_response(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status, media_type="application/json")


async def read_json(request: Request, limit: int = MAX_BODY, *, allow_empty: bool = False) -> Any:
    """The request's JSON body; 413 past ``limit`` bytes, 400 when it is not JSON, 422 when it
    cannot be stored as sent (:func:`stepline_server.application.payloads.parse`, which the
    dashboard's forms use too: NUL characters, nesting past 64 levels, integers past 64 bits,
    NaN and Infinity)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise errors.PayloadTooLarge(f"the request body is larger than {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise errors.PayloadTooLarge(f"the request body is larger than {limit} bytes")
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        if allow_empty:
            return None
        raise errors.InvalidJson("the request body is empty; send a JSON object")
    return payloads.parse(raw, limit=limit)  # its refusals answer as the API's errors


async def refuse_body(request: Request) -> None:
    """For a route that takes no body: ``400 body_not_allowed`` when one was sent (anything
    but nothing, whitespace or ``{}``), before anything is done."""
    declared = request.headers.get("content-length")
    if declared == "0" or (declared is None and "transfer-encoding" not in request.headers):
        return
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > 64:
            break
    if raw.strip() in (b"", b"{}"):
        return
    raise errors.BodyNotAllowed(
        f"{request.method} {request.url.path} takes no body; send none (or {{}})"
    )


async def read_model(
    request: Request, model: type[M], limit: int = MAX_BODY, *, allow_empty: bool = False
) -> M:
    """The request's body validated as ``model``."""
    data = await read_json(request, limit, allow_empty=allow_empty)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise errors.ValidationFailed("the request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise errors.from_validation(exc) from None
