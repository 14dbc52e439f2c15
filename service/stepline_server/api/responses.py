"""JSON in and out: bodies read with a size limit, answers written with orjson."""

from __future__ import annotations

import json
import re
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from stepline import _json

MAX_BODY = 1024 * 1024
# A run of 20 digits may be an integer past 64 bits: such a body is parsed again exactly.
_LONG_NUMBER = re.compile(rb"\d{20}")

M = TypeVar("M", bound=BaseModel)


def json_response(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status, media_type="application/json")


async def read_json(request: Request, limit: int = MAX_BODY, *, allow_empty: bool = False) -> Any:
    """The request's JSON body; 413 past ``limit`` bytes, 400 when it is not JSON, 422 when it
    cannot be stored as sent (:func:`stepline._json.payload_problem`: NUL characters, nesting
    past 64 levels, integers past 64 bits)."""
    from stepline_server.api import errors

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
    try:
        data = orjson.loads(raw)
        if _LONG_NUMBER.search(raw):  # orjson turns integers past 64 bits into floats
            data = json.loads(raw)
    except (orjson.JSONDecodeError, ValueError) as exc:
        raise errors.InvalidJson(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        data = [[]] * (_json.MAX_DEPTH + 1)  # refused just below
    found = _json.payload_problem_at(data)
    if found:
        where, problem = found
        raise errors.ValidationFailed(
            f"the request body cannot be stored: {problem}", {"fields": {where or "body": problem}}
        )
    return data


async def read_model(
    request: Request, model: type[M], limit: int = MAX_BODY, *, allow_empty: bool = False
) -> M:
    """The request's body validated as ``model``."""
    from stepline_server.api import errors

    data = await read_json(request, limit, allow_empty=allow_empty)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise errors.ValidationFailed("the request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise errors.from_validation(exc) from None
