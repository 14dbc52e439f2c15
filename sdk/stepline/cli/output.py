"""How the operator commands print: aligned tables and plain lines for people, JSON for scripts."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, TextIO

from stepline._durations import in_short


def as_json(data: Any, out: TextIO, *, indent: int | None = 2) -> None:
    """``data`` as JSON on a line of its own (indented unless ``indent`` is None)."""
    out.write(json.dumps(data, indent=indent, ensure_ascii=False, sort_keys=False) + "\n")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], out: TextIO) -> None:
    """Rows in columns aligned on their widest cell; ``-`` for an empty cell."""
    cells = [[cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    for row in [list(headers), *cells]:
        out.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")
    if not rows:
        out.write("(none)\n")


def cell(value: Any) -> str:
    """A value as one table cell: ``-`` for nothing, compact JSON for anything structured."""
    if value is None or value == "":
        return "-"
    if isinstance(value, str):
        return value.replace("\n", " ")
    if isinstance(value, dict | list | bool | int | float):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return str(value)


def when(value: str | None) -> str:
    """An RFC 3339 time as ``2024-05-01 12:00:03`` (UTC), to the second."""
    if not value:
        return "-"
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return value
    return parsed.strftime("%Y-%m-%d %H:%M:%S")


def took(start: str | None, end: str | None) -> str:
    """The time from ``start`` to ``end`` as ``12ms``, ``3.4s`` or ``2m 5s``; ``-`` if unknown."""
    if not start or not end:
        return "-"
    a = datetime.fromisoformat(start.replace("Z", "+00:00"))
    b = datetime.fromisoformat(end.replace("Z", "+00:00"))
    return duration((b - a).total_seconds())


def duration(seconds: float) -> str:
    """Seconds for a person, the same in every table: ``850ms``, ``3.4s``, ``45s``, ``2m 5s``,
    ``2h 5m``, ``3d 4h``."""
    return in_short(seconds)


def error_lines(error: dict[str, Any] | None, indent: str = "  ") -> list[str]:
    """A step's or run's error: its code and message, then its traceback, indented."""
    if not error:
        return []
    head = f"{indent}error {error.get('code') or 'failed'}: {error.get('message', '')}"
    if error.get("type"):
        head += f" [{error['type']}]"
    lines = [head]
    for line in str(error.get("traceback") or "").rstrip().splitlines():
        lines.append(f"{indent}  {line}")
    return lines


def step_detail(step: dict[str, Any]) -> str:
    """What a person wants to know beside a step's status: its wake time, callback or child."""
    if step.get("status") in ("sleeping", "retrying") and step.get("wakeAt"):
        return f"until {when(step['wakeAt'])}"
    if step.get("callbackUrl") and step.get("status") == "waiting":
        return f"callback {step['callbackId']}: POST {step['callbackUrl']}"
    if step.get("childRunId"):
        return f"child run {step['childRunId']}"
    if step.get("status") == "completed" and step.get("output") is not None:
        text = cell(step["output"])
        return text if len(text) <= 60 else text[:57] + "..."
    return ""


HELD_BY = {
    "pause": "paused (the workflow or its app is paused)",
    "concurrency": "held by its workflow's concurrency cap (it goes when a run of it ends)",
    "rateLimit": "held by its workflow's rate limit",
    "appUnreachable": "its app could not be reached (tried again with backoff)",
}
"""What a person reads for a run's ``heldBy``: why it does not move."""


def status_text(run: dict[str, Any]) -> str:
    """A run's status, and why it does not move when something holds it."""
    held = run.get("heldBy")
    if not held:
        return str(run["status"])
    return f"{run['status']}, {HELD_BY.get(held, held)}"


def run_lines(run: dict[str, Any], last_failure: dict[str, Any] | None = None) -> list[str]:
    """A run for a person: its fields, input and output, its invocations and delivery failures
    (``last_failure``: the last invocation that could not be delivered), its steps, its error
    with traceback."""
    lines = [
        f"run       {run['id']}",
        f"workflow  {run['workflow']}  (app {run.get('appName') or run.get('app') or '-'})",
        f"status    {status_text(run)}",
    ]
    for label, key in (("runKey", "runKey"), ("parent", "parentRunId"), ("schedule", "scheduleId")):
        if run.get(key):
            lines.append(f"{label:<9} {run[key]}")
    if run.get("trigger"):
        lines.append(f"trigger   {run['trigger']}")
    if (run.get("generation") or 1) > 1:
        lines.append(f"generation {run['generation']} (the steps are this generation's)")
    if run.get("deploymentId"):
        lines.append(f"deployment {run['deploymentId']}")
    if run.get("scheduledAt"):
        lines.append(f"scheduled {when(run['scheduledAt'])}  {timing(run)}".rstrip())
    lines.append(
        f"created   {when(run.get('createdAt'))}  ended {when(run.get('endedAt'))}"
        f"  took {took(run.get('createdAt'), run.get('endedAt'))}"
    )
    if run.get("invocations") is not None:
        failures = run.get("deliveryFailures") or 0
        note = f", {failures} could not be delivered" if failures else ""
        lines.append(f"invocations {run['invocations']}{note}")
        if last_failure is not None:
            status = last_failure.get("httpStatus")
            why = last_failure.get("response") or (f"HTTP {status}" if status else "no answer")
            lines.append(f"  last delivery failure {when(last_failure.get('startedAt'))}: {why}")
    lines.append(f"input     {cell(run.get('input'))}")
    if run.get("output") is not None:
        lines.append(f"output    {cell(run['output'])}")
    lines.extend(error_lines(run.get("error"), indent=""))
    if (run.get("history") or {}).get("warning"):
        lines.append(f"history   {run['history']['warning']}")
    if run.get("logLines") or run.get("logsDropped"):
        dropped = f", {run['logsDropped']} dropped past the cap" if run.get("logsDropped") else ""
        lines.append(f"logs      {run.get('logLines', 0)} lines{dropped} (stepline runs logs ID)")
    steps = run.get("steps")
    if steps is not None:
        lines.append("")
        lines.append(f"steps ({len(steps)}):")
        for s in steps:
            lines.append(
                f"  {s['name']:<20} {s['kind']:<8} {s['status']:<10} #{s['attempt']:<3}"
                f" {when(s.get('startedAt'))}  {took(s.get('startedAt'), s.get('endedAt')):>7}"
                f"  {step_detail(s)}".rstrip()
            )
            lines.extend(error_lines(s.get("error"), indent="    "))
    return lines


def timing(run: dict[str, Any]) -> str:
    """A scheduled run's start lag and end-to-end time, and how it kept to its SLA."""
    parts = []
    if run.get("startLagMs") is not None:
        parts.append(f"start lag {duration(run['startLagMs'] / 1000)}")
    if run.get("e2eMs") is not None:
        parts.append(f"end to end {duration(run['e2eMs'] / 1000)}")
    if run.get("slaMs") is not None:
        verdict = {True: "BREACHED", False: "met", None: "-"}[run.get("slaBreached")]
        parts.append(f"SLA {duration(run['slaMs'] / 1000)} {verdict}")
    return ", ".join(parts)


def log_line(line: dict[str, Any]) -> str:
    """One run log line: time, level, step, message and its fields."""
    parts = [when(line.get("at")), f"{line['level'].upper():<7}", line.get("stepName") or "-"]
    parts.append(str(line.get("message", "")).replace("\n", "\n    "))
    if line.get("fields"):
        parts.append(cell(line["fields"]))
    return "  ".join(parts)


def event_line(event: dict[str, Any]) -> str:
    """One history event on one line: seq, time, type, step, and what it carries."""
    parts = [f"{event['seq']:>4}", when(event.get("at")), f"{event['type']:<20}"]
    parts.append(event.get("stepName") or "-")
    extra = []
    if "httpStatus" in event:
        extra.append(f"http {event['httpStatus']}")
    if "durationMs" in event:
        extra.append(duration(event["durationMs"] / 1000))
    if "deploymentId" in event:
        extra.append(f"deployment {event['deploymentId']}")
    if event.get("data") is not None:
        extra.append(cell(event["data"]))
    return "  ".join(parts + extra)
