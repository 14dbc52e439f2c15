"""A run's steps as bars on one time axis, and its invocations from its history."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any


def _t(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


@dataclass(frozen=True)
class Bar:
    """Where a step sits on the run's axis, in percent of the run's span."""

    left: float
    width: float


def bars(run: dict[str, Any]) -> dict[str, Bar]:
    """Each step's bar, by step name: from its start to its end (or now, or its wake time)."""
    start = _t(run.get("startedAt")) or _t(run["createdAt"])
    assert start is not None
    now = datetime.now(UTC)
    end = _t(run.get("endedAt")) or now
    steps = run.get("steps") or []
    for s in steps:
        for key in ("endedAt", "wakeAt"):
            t = _t(s.get(key))
            if t is not None and t > end:
                end = t
    span = max((end - start).total_seconds(), 0.001)
    out = {}
    for s in steps:
        a = _t(s.get("startedAt")) or start
        b = _t(s.get("endedAt")) or (_t(s.get("wakeAt")) if s.get("wakeAt") else None) or now
        left = max(0.0, min(100.0, (a - start).total_seconds() / span * 100))
        width = max(0.6, min(100.0 - left, (b - a).total_seconds() / span * 100))
        out[s["name"]] = Bar(round(left, 2), round(width, 2))
    return out


def invocations(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per invocation: its start, end, HTTP status, deployment, duration, outcome."""
    rows: dict[str, dict[str, Any]] = {}
    for e in events:
        inv = e.get("invocationId")
        if not inv or not e["type"].startswith("invocation."):
            continue
        row = rows.setdefault(
            inv,
            {
                "id": inv,
                "startedAt": None,
                "endedAt": None,
                "httpStatus": None,
                "durationMs": None,
                "outcome": None,
            },
        )
        if e["type"] == "invocation.started":
            row["startedAt"] = e["at"]
        else:
            row["endedAt"] = e["at"]
            row["httpStatus"] = e.get("httpStatus")
            row["durationMs"] = e.get("durationMs")
            data = e.get("data") or {}
            row["outcome"] = data.get("outcome") or data.get("status") or data.get("error")
        if e.get("deploymentId"):
            row["deploymentId"] = e["deploymentId"]
    return list(rows.values())


def unreachable(run: dict[str, Any], events: list[dict[str, Any]]) -> str | None:
    """A sentence for the run's banner when its app cannot be reached: the run still going while
    its last invocation could not be delivered, or failed because the delivery window ran out."""
    error = run.get("error") or {}
    if run["status"] == "failed" and error.get("code") == "app_unreachable":
        return f"Its app could not be reached, so the run failed: {error.get('message')}"
    if run["status"] not in ("running", "cancelling"):
        return None
    last = next((e for e in reversed(events) if e["type"] == "invocation.ended"), None)
    data = (last or {}).get("data") or {}
    if data.get("outcome") != "delivery_failed":
        return None
    why = data.get("error") or "no answer"
    status = f" (HTTP {last['httpStatus']})" if last and last.get("httpStatus") else ""
    failures = run.get("deliveryFailures") or 0
    return (
        f"Its app is unreachable: {why}{status}. {failures} delivery attempt(s) failed; it is"
        " tried again with backoff until the delivery window runs out."
    )
