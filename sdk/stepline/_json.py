"""JSON for the SDK: one encoding, the standard library's, whatever else is installed.

Compact UTF-8, non-ASCII kept as is, integers of any size kept exact, ``NaN`` and ``Infinity``
refused, dict keys as :mod:`json` allows them (``str``, ``int``, ``float``, ``bool``, ``None``;
non-strings become strings). Beyond JSON's own types, ``datetime``, ``date`` and ``time`` become
ISO 8601 strings, a ``UUID`` its string and a pydantic model its ``model_dump(mode="json")``;
anything else raises ``TypeError`` naming its type.
orjson is not used even when installed: it encodes some values differently (datetimes, large
integers), so a result would depend on the environment.
"""

from __future__ import annotations

import json
import math
import uuid
from datetime import date, datetime, time
from typing import Any

from pydantic import BaseModel

MAX_PAYLOAD_BYTES = 1024 * 1024
"""Inputs, outputs and step results are JSON of at most 1 MiB (openapi.yaml)."""


def _default(value: Any) -> Any:
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    raise TypeError(
        f"type {type(value).__qualname__} is not JSON serialisable (use dicts, lists, strings, "
        "numbers, booleans, None, datetimes, UUIDs or pydantic models)"
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
    """Pass ``value`` through JSON so every replay sees the same thing; return it and its size.

    ``ValueError`` when it is not JSON, or is JSON the orchestrator cannot store
    (:func:`payload_problem`)."""
    data = dumps(value)
    decoded = loads(data)
    problem = payload_problem(decoded)
    if problem:
        raise ValueError(problem)
    return decoded, len(data)


MAX_DEPTH = 64
"""Inputs, outputs, step results, callback and event bodies nest at most this deep."""

MIN_INT, MAX_INT = -(2**63), 2**64 - 1
"""Integers are kept exact within 64 bits; beyond, JSON tools disagree, so they are refused."""


def payload_problem(value: Any) -> str | None:
    """Why ``value`` (decoded JSON) cannot be stored and sent back unchanged, or None (see
    :func:`payload_problem_at`)."""
    found = payload_problem_at(value)
    return found[1] if found else None


def payload_problem_at(value: Any) -> tuple[str, str] | None:
    """Where in ``value`` (decoded JSON; a dotted path, ``""`` for the value itself) and why it
    cannot be stored and sent back unchanged, or None.

    PostgreSQL refuses NUL characters in text and ``jsonb``, and lone surrogates are not
    UTF-8; JSON has no NaN or Infinity (``1e400`` parses as one); encoders refuse deep
    nesting (the invocation body nests a value a few levels deeper
    than it came) and integers past 64 bits. Walked without recursion, so any depth is safe.
    """
    stack: list[tuple[Any, int, str]] = [(value, 0, "")]
    while stack:
        item, depth, path = stack.pop()
        if isinstance(item, str):
            problem = _text_problem(item)
            if problem:
                return path, problem
        elif isinstance(item, float):
            if not math.isfinite(item):
                return path, "numbers must be finite (no NaN or Infinity)"
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if not MIN_INT <= item <= MAX_INT:
                return path, "integers must fit in 64 bits"
        elif isinstance(item, dict | list):
            if depth >= MAX_DEPTH:
                return path, f"JSON must not nest more than {MAX_DEPTH} levels deep"
            if isinstance(item, dict):
                for key in item:
                    if isinstance(key, str) and (problem := _text_problem(key)):
                        return path, problem
                children = [
                    (child, f"{path}.{key}" if path else str(key)) for key, child in item.items()
                ]
            else:
                children = [
                    (child, f"{path}.{n}" if path else str(n)) for n, child in enumerate(item)
                ]
            stack.extend((child, depth + 1, where) for child, where in children)
    return None


def _text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "text must not contain NUL (\\u0000) characters"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "text must be valid Unicode (no lone surrogates)"
    return None
