"""Cursor pagination: opaque cursors, ``limit`` (default 50, at most 500).

A cursor is the base64 of a JSON list of the values the page ended on. It comes back from the
caller, so :func:`decode` checks it against the kinds of values the list gave out (a time, a
UUID, a text, a sequence number) and refuses anything else, however crafted, as a
``422 validation_failed`` naming ``cursor``: nothing in it reaches the database unchecked.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import orjson
from starlette.requests import Request

from stepline_server.api.errors import ValidationFailed

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
_MAX_TEXT = 1024
_MAX_SEQ = 2**63 - 1  # bigint

Kind = Callable[[Any], Any]
"""Turns one decoded value of a cursor into what the list's query takes; ValueError if not."""


def limit_of(request: Request) -> int:
    raw = request.query_params.get("limit")
    if raw is None:
        return DEFAULT_LIMIT
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        raise ValidationFailed(
            f"limit must be a whole number from 1 to {MAX_LIMIT}", {"fields": {"limit": raw}}
        )
    return int(raw)


def time_of(request: Request, name: str) -> datetime | None:
    """The query parameter ``name`` as a time filter (RFC 3339, with a time zone), if given."""
    raw = request.query_params.get(name)
    if raw is None:
        return None
    try:
        value = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise ValidationFailed(
            f"{name} must be an RFC 3339 time", {"fields": {name: raw}}
        ) from None
    if value.tzinfo is None:
        raise ValidationFailed(f"{name} needs a time zone (e.g. Z)", {"fields": {name: raw}})
    return value


def as_text(value: Any) -> str:
    """A text PostgreSQL can store (no NUL) of a sensible length."""
    if not isinstance(value, str) or len(value) > _MAX_TEXT or "\x00" in value:
        raise ValueError("not a text")
    return value


def as_time(value: Any) -> datetime:
    """An ISO 8601 time with a time zone, in UTC."""
    try:
        parsed = datetime.fromisoformat(as_text(value))
        if parsed.tzinfo is None:
            raise ValueError("no time zone")
        return parsed.astimezone(UTC)
    except OverflowError:  # out of range once in UTC, e.g. 0001-01-01T00:00+01:00
        raise ValueError("time out of range") from None


def as_uuid(value: Any) -> uuid.UUID:
    """A UUID in its usual text form."""
    return uuid.UUID(as_text(value))


def as_seq(value: Any) -> int:
    """A sequence number: a whole number that fits a bigint."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_SEQ:
        raise ValueError("not a sequence number")
    return value


def _scalar(value: Any) -> Any:
    """A text or a sequence number, for lists that do not name their kinds."""
    return (
        as_seq(value) if isinstance(value, int) and not isinstance(value, bool) else as_text(value)
    )


def keyset_before(request: Request) -> tuple[datetime, uuid.UUID] | None:
    """The ``cursor`` of a newest-first list: the (time, id) the previous page ended on."""
    cursor = decode(request, as_time, as_uuid)
    return (cursor[0], cursor[1]) if cursor else None


def keyset_page(
    rows: list[Mapping[str, Any]], limit: int, time_column: str
) -> tuple[list[Mapping[str, Any]], str | None]:
    """A page of ``limit`` of ``rows`` (read one more, to know whether another page follows)
    and the cursor of the next page: the last row's ``time_column`` and id."""
    if len(rows) <= limit:
        return rows, None
    rows = rows[:limit]
    return rows, encode([rows[-1][time_column].isoformat(), str(rows[-1]["id"])])


def encode(values: list[Any]) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(values)).decode().rstrip("=")


def decode(request: Request, *kinds: Kind | int) -> list[Any] | None:
    """The ``cursor`` query parameter as values of ``kinds``, or None when there is none.

    ``decode(request, as_time, as_uuid)`` answers ``[datetime, UUID]``; ``decode(request, 2)``
    answers two values, each a text or a sequence number.
    """
    raw = request.query_params.get("cursor")
    if not raw:
        return None
    if len(kinds) == 1 and isinstance(kinds[0], int):
        wanted: list[Kind] = [_scalar] * kinds[0]
    else:
        wanted = [k for k in kinds if not isinstance(k, int)]
    try:
        values = orjson.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
        if not isinstance(values, list) or len(values) != len(wanted):
            raise ValueError("wrong shape")
        return [kind(value) for kind, value in zip(wanted, values, strict=True)]
    except (ValueError, TypeError, binascii.Error, orjson.JSONDecodeError):
        raise ValidationFailed(
            "the cursor is not one this API gave out",
            {"fields": {"cursor": raw}},
        ) from None
