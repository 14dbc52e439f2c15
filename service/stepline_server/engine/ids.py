"""Ids of runs, events and callbacks: time-ordered, so the rows of new runs land at the right
edge of every index keyed by a run id (``runs``, ``steps``, ``run_events``, ``callbacks``)
instead of on random pages of indexes that hold millions of entries.

- :func:`new_id`: a UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, then random bits.
- :func:`derived_id`: an id that must come out the same every time it is computed (a child
  run of a step, a callback, the run an event starts): the first 48 bits are the time of the
  source id (or instant) it is derived from, the rest a SHA-256 of the name (UUIDv8). Sources
  that are not time-ordered (ids made before this scheme) keep their old UUIDv5 derivation, so
  a replay of an older run derives the ids it derived before.
- :func:`run_key_id`: the id of the run a ``runKey`` names, ``uuid5`` of the environment and
  the key: one key, one id, so the primary key on ``runs.id`` alone keeps one run per key in
  an environment (what Citus needs: its unique indexes must include the distribution column,
  the run id; ``docs/scaling.md``). Not time-ordered: a keyed run's rows land where their id
  hashes, as an event's with a sender's id do.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from datetime import datetime

__all__ = ["derived_id", "is_time_ordered", "new_id", "run_key_id", "time_prefix"]

_TIME_ORDERED = frozenset({7, 8})
_RUN_KEY_NS = uuid.UUID("9c3e2f6a-5d41-4b8e-a7c0-3f2d8e6b1a57")


def new_id(now_ms: int | None = None) -> uuid.UUID:
    """A new UUIDv7 stamped with ``now_ms`` (Unix milliseconds; the clock when omitted)."""
    ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    return _with_prefix(ms, 7, os.urandom(10))


def run_key_id(environment_id: uuid.UUID, run_key: str) -> uuid.UUID:
    """The id of environment ``environment_id``'s run named by ``run_key`` (a UUIDv5): the
    same on every call, another in another environment."""
    return uuid.uuid5(_RUN_KEY_NS, f"run-key:{environment_id}:{run_key}")


def time_prefix(source: uuid.UUID | datetime) -> int:
    """The Unix milliseconds an id (or instant) orders by."""
    if isinstance(source, datetime):
        return int(source.timestamp() * 1000)
    return source.int >> 80


def is_time_ordered(value: uuid.UUID) -> bool:
    """True for ids of this scheme (UUIDv7 and its derived UUIDv8)."""
    return value.version in _TIME_ORDERED and value.variant == uuid.RFC_4122


def derived_id(source: uuid.UUID | datetime, name: str, legacy: uuid.UUID) -> uuid.UUID:
    """The id derived from ``source`` for ``name``: the same on every call.

    An instant or a time-ordered source gives a UUIDv8 sharing its time prefix; any other
    source gives ``uuid5(legacy, name)``, the derivation ids had before this scheme."""
    if isinstance(source, uuid.UUID) and not is_time_ordered(source):
        return uuid.uuid5(legacy, name)
    digest = hashlib.sha256(f"{legacy}:{name}".encode()).digest()
    return _with_prefix(time_prefix(source), 8, digest[:10])


def _with_prefix(ms: int, version: int, rest: bytes) -> uuid.UUID:
    """48 bits of ``ms``, the version, 12 bits of ``rest``, the RFC 4122 variant, 62 more."""
    tail = int.from_bytes(rest, "big")  # 80 bits
    rand_a = (tail >> 68) & 0xFFF
    rand_b = tail & ((1 << 62) - 1)
    value = ((ms & ((1 << 48) - 1)) << 80) | (version << 76) | (rand_a << 64) | (0b10 << 62)
    return uuid.UUID(int=value | rand_b)
