"""How the operator commands print: moved to the SDK (``stepline.cli.output``) so that an app's
install has the REST-only commands; this name stays for the orchestrator's own code."""

from __future__ import annotations

from stepline.cli.output import (
    as_json,
    cell,
    duration,
    error_lines,
    event_line,
    log_line,
    run_lines,
    step_detail,
    table,
    timing,
    took,
    when,
)

__all__ = [
    "as_json",
    "cell",
    "duration",
    "error_lines",
    "event_line",
    "log_line",
    "run_lines",
    "step_detail",
    "table",
    "timing",
    "took",
    "when",
]
