"""Debounces and batches: several starts gathered into one run, and when that run fires.

A workflow declared with a debounce gathers its starts (``POST /v1/runs``, events) of one key
value into one run, held (``heldBy: debounce``) until it fires; one declared with a batch
gathers the events that start it into one run whose input is the list of their data. The
rules here are plain: what key a start gathers under, when a gathering fires, whether a batch
is full, and which workflow descriptions the orchestrator refuses at sync.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

Kind = Literal["debounce", "batch"]

DEBOUNCE: Kind = "debounce"
BATCH: Kind = "batch"

WHOLE_WORKFLOW = "*"  # the key of a gathering without a key field: one for the workflow
MAX_KEY_CHARS = 512  # a key value longer than this gathers under its hash (an index's limit)


@dataclass(frozen=True)
class Spec:
    """A workflow's gathering, from its synced options: ``kind``, how long it waits after the
    last start (debounce ``periodMs``) or the first (batch ``waitMs``), the cap from the first
    start (debounce ``maxWaitMs``; None: none), the batch ``size`` (None for a debounce) and
    the ``key`` field."""

    kind: Kind
    wait_ms: int
    max_wait_ms: int | None
    size: int | None
    key: str | None


def spec_of(options: dict[str, Any] | None) -> Spec | None:
    """The workflow's gathering as its synced options declare it; None when it has none."""
    options = options or {}
    debounce = options.get("debounce")
    if isinstance(debounce, dict):
        return Spec(
            DEBOUNCE,
            int(debounce["periodMs"]),
            None if debounce.get("maxWaitMs") is None else int(debounce["maxWaitMs"]),
            None,
            debounce.get("key"),
        )
    batch = options.get("batch")
    if isinstance(batch, dict):
        return Spec(BATCH, int(batch["waitMs"]), None, int(batch["size"]), batch.get("key"))
    return None


def key_of(spec: Spec, data: Any) -> str:
    """The key a start (its input, or an event's data) gathers under: ``*`` without a key
    field, else the field's value as canonical JSON (``null`` when the data is not an object
    or lacks the field: such starts gather together; a long value by its SHA-256)."""
    if spec.key is None:
        return WHOLE_WORKFLOW
    value = data.get(spec.key) if isinstance(data, dict) else None
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    if len(text) > MAX_KEY_CHARS:
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    return text


def fire_at(spec: Spec, first_at: datetime, last_at: datetime) -> datetime:
    """When a gathering whose first start was at ``first_at`` and last at ``last_at`` fires:
    a debounce ``period`` after the last start, but never past ``max_wait`` after the first; a
    batch ``wait`` after the first event."""
    if spec.kind == BATCH:
        return first_at + timedelta(milliseconds=spec.wait_ms)
    due = last_at + timedelta(milliseconds=spec.wait_ms)
    if spec.max_wait_ms is not None:
        due = min(due, first_at + timedelta(milliseconds=spec.max_wait_ms))
    return due


def is_due(fires_at: datetime, now: datetime) -> bool:
    """Whether a gathering is to fire now: its time has come."""
    return fires_at <= now


def is_full(spec: Spec, count: int) -> bool:
    """Whether a batch holding ``count`` events fires at once (a debounce never fills)."""
    return spec.size is not None and count >= spec.size


def start_problems(spec: Spec, run_key: str | None) -> dict[str, str]:
    """What a ``POST /v1/runs`` of a debounced workflow asks that a debounce cannot give: a
    ``runKey`` would name one start, while the run answers many."""
    if spec.kind == DEBOUNCE and run_key is not None:
        return {
            "runKey": "a debounced workflow's starts are gathered into one run: start it"
            " without runKey"
        }
    return {}


def _ms(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _key_problem(value: Any) -> str | None:
    if value is None or (isinstance(value, str) and 0 < len(value) <= 256):
        return None
    return "must be the name of a top-level field (1 to 256 characters) or null"


def option_problems(options: dict[str, Any]) -> dict[str, str]:
    """What is wrong with a workflow's debounce or batch as an app described it (its options
    as sync registers them): each bad field with why. An empty answer: none, or both fine."""
    problems: dict[str, str] = {}
    debounce, batch = options.get("debounce"), options.get("batch")
    if debounce is not None and batch is not None:
        problems["debounce"] = "a workflow takes debounce or batch, not both"
    if (debounce is not None or batch is not None) and options.get("singletonKey") is not None:
        problems["singletonKey"] = "cannot be combined with debounce or batch"
    if debounce is not None:
        period = _ms(debounce.get("periodMs"))
        if period is None or period < 1:
            problems["debounce.periodMs"] = "must be a whole number of milliseconds, at least 1"
        max_wait = debounce.get("maxWaitMs")
        if max_wait is not None:
            if _ms(max_wait) is None or max_wait < 1:
                problems["debounce.maxWaitMs"] = "must be a whole number of milliseconds or null"
            elif period is not None and max_wait < period:
                problems["debounce.maxWaitMs"] = "must be at least periodMs"
        if (why := _key_problem(debounce.get("key"))) is not None:
            problems["debounce.key"] = why
    if batch is not None:
        size = _ms(batch.get("size"))
        if size is None or size < 1:
            problems["batch.size"] = "must be a whole number, at least 1"
        wait = _ms(batch.get("waitMs"))
        if wait is None or wait < 1:
            problems["batch.waitMs"] = "must be a whole number of milliseconds, at least 1"
        if (why := _key_problem(batch.get("key"))) is not None:
            problems["batch.key"] = why
        if not options.get("onEvent"):
            problems["batch"] = "gathers the events that start the workflow: declare onEvent"
    return problems
