"""Cursor pagination: opaque cursors, ``limit`` (default 50, at most 500)."""

from __future__ import annotations

import base64
from typing import Any

import orjson
from starlette.requests import Request

from stepline_server.api.errors import ValidationFailed

DEFAULT_LIMIT = 50
MAX_LIMIT = 500


def limit_of(request: Request) -> int:
    raw = request.query_params.get("limit")
    if raw is None:
        return DEFAULT_LIMIT
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        raise ValidationFailed(
            f"limit must be a whole number from 1 to {MAX_LIMIT}", {"fields": {"limit": raw}}
        )
    return int(raw)


def encode(values: list[Any]) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(values)).decode().rstrip("=")


def decode(request: Request, size: int) -> list[Any] | None:
    raw = request.query_params.get("cursor")
    if not raw:
        return None
    try:
        values = orjson.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
    except (ValueError, orjson.JSONDecodeError):
        values = None
    if not isinstance(values, list) or len(values) != size:
        raise ValidationFailed(
            "the cursor is not one this API gave out", {"fields": {"cursor": raw}}
        )
    return values
