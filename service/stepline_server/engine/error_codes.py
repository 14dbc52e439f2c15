"""The codes of recorded errors: every error object a step, run or invocation keeps is
``{code, message, type, traceback}`` with ``code`` a string, whatever the app sent."""

from __future__ import annotations

from typing import Any

STEP_FAILED = "step_failed"
"""A step's error whose app gave no code (an SDK older than codes, or another client)."""

WORKFLOW_FAILED = "workflow_failed"
"""A run's error whose app gave no code."""


def with_code(error: Any, default: str) -> Any:
    """``error`` with ``code`` (``default`` where it has none, or not a string) and ``type``
    and ``message`` present; anything that is not an error object is answered as it is."""
    if not isinstance(error, dict):
        return error
    code = error.get("code")
    if isinstance(code, str) and code and "type" in error and "message" in error:
        return error
    fixed = dict(error)
    if not isinstance(code, str) or not code:
        fixed["code"] = default
    fixed.setdefault("type", "Error")
    fixed.setdefault("message", "")
    return fixed
