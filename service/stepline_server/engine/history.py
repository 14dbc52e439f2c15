"""How long a run's history may grow: the limit on its steps and result bytes, and the warning
given near it. A run past the limit fails with ``history_limit_exceeded``; a workflow that loops
for ever keeps its history short with ``ctx.continue_as_new``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

WARN_FRACTION = 0.8
"""Past this share of either limit, the run warns (its detail and the orchestrator's log)."""


@dataclass(frozen=True)
class Limits:
    """The most steps, and bytes of step results (their JSON), one generation of a run holds."""

    steps: int = 10_000
    bytes: int = 64 * 1024 * 1024


@dataclass(frozen=True)
class Size:
    """How big a run's current history is."""

    steps: int
    bytes: int


def size_of(steps: Iterable[Mapping[str, Any]]) -> Size:
    """The size of a history given its step rows (each with ``output_bytes``, or None)."""
    count = total = 0
    for row in steps:
        count += 1
        total += row.get("output_bytes") or 0
    return Size(count, total)


@dataclass(frozen=True)
class Verdict:
    """What a history's size means: ``error`` (the run fails) past a limit, ``warning`` near."""

    error: dict[str, Any] | None = None
    warning: str | None = None


def check(size: Size, limits: Limits) -> Verdict:
    """Whether a run with a history of ``size`` may be invoked again."""
    if size.steps > limits.steps or size.bytes > limits.bytes:
        return Verdict(
            error={
                "type": "HistoryLimitExceeded",
                "code": "history_limit_exceeded",
                "message": (
                    f"the run's history holds {size.steps} steps and {size.bytes} bytes of "
                    f"results, over the limit of {limits.steps} steps or {limits.bytes} bytes; "
                    "use ctx.continue_as_new to start a long-running loop over with a fresh "
                    "history"
                ),
            }
        )
    if size.steps > limits.steps * WARN_FRACTION or size.bytes > limits.bytes * WARN_FRACTION:
        return Verdict(
            warning=(
                f"the run's history holds {size.steps} of {limits.steps} steps and "
                f"{size.bytes} of {limits.bytes} bytes: past the limit it fails with "
                "history_limit_exceeded; use ctx.continue_as_new"
            )
        )
    return Verdict()
