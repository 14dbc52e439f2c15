"""Published state rules: which ``ctx.set_state`` updates the orchestrator refuses, and why.

A state update is a step of kind ``state`` completed with its value (``output``) and its key.
The SDK checks the same rules before sending (``stepline.protocol``); the orchestrator checks
them again for any other client, and refuses the step (recorded ``failed`` with one of the
codes below) rather than the whole call, so one bad key never loses the run's other updates.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from stepline.protocol import (
    MAX_STATE_BYTES,
    MAX_STATE_KEYS,
    MAX_STATE_STORED_BYTES,
    StepUpdate,
    envelope_kind,
    state_key_problem,
)

KEY_INVALID = "state_key_invalid"
"""The key is not 1 to 128 characters of ``A-Z a-z 0-9 . _ : -``."""
TOO_LARGE = "state_too_large"
"""The value's JSON is over 64 KiB (an encoded value's envelope over 96 KiB)."""
TOO_MANY_KEYS = "state_keys_exceeded"
"""The run already published the most keys a run may have (:data:`MAX_STATE_KEYS`)."""


def refusal(update: StepUpdate) -> dict[str, Any] | None:
    """The error a state update is refused with, or None when it may be recorded."""
    problem = state_key_problem(update.key)
    if problem is not None:
        return error(KEY_INVALID, problem)
    size = len(orjson.dumps(update.output))
    limit = MAX_STATE_STORED_BYTES if envelope_kind(update.output) else MAX_STATE_BYTES
    if size > limit:
        return error(
            TOO_LARGE,
            f"the value of state {update.key!r} is {size} bytes of JSON, over the "
            f"{limit // 1024} KiB limit",
        )
    return None


def over_limit(keys: Iterable[str], existing: set[str], limit: int = MAX_STATE_KEYS) -> set[str]:
    """The keys (in the order they are set) a run that has ``existing`` keys may not add:
    those past ``limit`` distinct keys in all."""
    known = set(existing)
    refused: set[str] = set()
    for key in keys:
        if key in known or key in refused:
            continue
        if len(known) >= limit:
            refused.add(key)
        else:
            known.add(key)
    return refused


def too_many_keys(key: str, limit: int = MAX_STATE_KEYS) -> dict[str, Any]:
    """The error of a set refused because the run has ``limit`` keys already."""
    return error(
        TOO_MANY_KEYS,
        f"state {key!r} was not recorded: a run publishes at most {limit} keys",
    )


def error(code: str, message: str) -> dict[str, Any]:
    """A recorded error object for a refused state step."""
    return {"type": "StateError", "code": code, "message": message}
