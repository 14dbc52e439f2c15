"""JSON encoding for the SDK: orjson when it is installed, the standard library otherwise."""

from __future__ import annotations

import json
from typing import Any

try:
    import orjson
except ImportError:  # pragma: no cover - depends on the environment
    orjson = None  # type: ignore[assignment]

MAX_PAYLOAD_BYTES = 1024 * 1024
"""Inputs, outputs and step results are JSON of at most 1 MiB (API.md)."""


def dumps(value: Any) -> bytes:
    """Encode ``value`` as compact UTF-8 JSON; ``TypeError``/``ValueError`` if it is not JSON."""
    if orjson is not None:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def loads(data: bytes | str) -> Any:
    """Decode JSON; raise ``ValueError`` when it is not valid JSON."""
    if orjson is not None:
        return orjson.loads(data)
    return json.loads(data)


def round_trip(value: Any) -> tuple[Any, int]:
    """Pass ``value`` through JSON so every replay sees the same thing; return it and its size."""
    data = dumps(value)
    return loads(data), len(data)
