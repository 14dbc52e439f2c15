"""JSON for the SDK: one encoding, the standard library's, whatever else is installed.

Compact UTF-8, non-ASCII kept as is, integers of any size kept exact, ``NaN`` and ``Infinity``
refused, dict keys as :mod:`json` allows them (``str``, ``int``, ``float``, ``bool``, ``None``;
non-strings become strings). Beyond JSON's own types, ``datetime``, ``date`` and ``time`` become
ISO 8601 strings and a ``UUID`` its string; anything else raises ``TypeError`` naming its type.
orjson is not used even when installed: it encodes some values differently (datetimes, large
integers), so a result would depend on the environment.
"""

from __future__ import annotations

import json
import uuid
from datetime import date, datetime, time
from typing import Any

MAX_PAYLOAD_BYTES = 1024 * 1024
"""Inputs, outputs and step results are JSON of at most 1 MiB (openapi.yaml)."""


def _default(value: Any) -> Any:
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(
        f"type {type(value).__qualname__} is not JSON serialisable (use dicts, lists, strings, "
        "numbers, booleans, None, datetimes or UUIDs)"
    )


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


_ENCODER = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=_default
)
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


def dumps(value: Any) -> bytes:
    """Encode ``value`` as compact UTF-8 JSON; ``TypeError``/``ValueError`` if it is not JSON."""
    return _ENCODER.encode(value).encode()


def loads(data: bytes | str) -> Any:
    """Decode JSON; raise ``ValueError`` when it is not valid JSON (``NaN`` included)."""
    text = data.decode() if isinstance(data, bytes | bytearray) else data
    return _DECODER.decode(text)


def round_trip(value: Any) -> tuple[Any, int]:
    """Pass ``value`` through JSON so every replay sees the same thing; return it and its size."""
    data = dumps(value)
    return loads(data), len(data)
