"""A run's steps as bars on one time axis, each try of a retried step, and its invocations,
from its history."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any


def _t(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


@dataclass(frozen=True)
class Bar:
    """Where a step sits on the run's axis, in percent of the run's span."""

    left: float
    width: float


def _axis(run: dict[str, Any]) -> tuple[datetime, float, datetime]:
    """The run's axis: its start, its span in seconds (to its end, or now, or the latest wake
    time of its steps) and now."""
    start = _t(run.get("startedAt")) or _t(run["createdAt"])
    assert start is not None
    now = datetime.now(UTC)
    end = _t(run.get("endedAt")) or now
    for s in run.get("steps") or []:
        for key in ("endedAt", "wakeAt"):
            t = _t(s.get(key))
            if t is not None and t > end:
                end = t
    return start, max((end - start).total_seconds(), 0.001), now


def _bar(a: datetime, b: datetime, start: datetime, span: float) -> Bar:
    left = max(0.0, min(100.0, (a - start).total_seconds() / span * 100))
    width = max(0.6, min(100.0 - left, (b - a).total_seconds() / span * 100))
    return Bar(round(left, 2), round(width, 2))


def bars(run: dict[str, Any]) -> dict[str, Bar]:
    """Each step's bar, by step name: from its start to its end (or now, or its wake time)."""
    start, span, now = _axis(run)
    out = {}
    for s in run.get("steps") or []:
        a = _t(s.get("startedAt")) or start
        b = _t(s.get("endedAt")) or (_t(s.get("wakeAt")) if s.get("wakeAt") else None) or now
        out[s["name"]] = _bar(a, b, start, span)
    return out


@dataclass(frozen=True)
class Try:
    """One try of a step, read from the run's history. ``outcome`` is ``retried``,
    ``completed`` or ``failed``, or None while it has none (still running, or never told)."""

    attempt: int
    started_at: str
    ended_at: str | None = None
    outcome: str | None = None
    error: dict[str, Any] | None = None
    retry_in_ms: int | None = None


_OUTCOMES = {"step.retrying": "retried", "step.completed": "completed", "step.failed": "failed"}


def tries(events: list[dict[str, Any]]) -> dict[str, list[Try]]:
    """Each run step's tries in this generation, by step name, from its ``step.started``
    events and the outcome that followed each. A try started again under the same number (its
    outcome was never recorded) counts once; a step started over from try 1 (the run was
    retried) keeps only its new tries."""
    out: dict[str, list[Try]] = {}
    for e in events:
        if e["type"] == "run.continuedAsNew":
            out = {}
        data, name = e.get("data") or {}, e.get("stepName")
        if not name or data.get("kind") != "run":
            continue
        known = out.setdefault(name, [])
        last = known[-1] if known else None
        attempt = int(data.get("attempt") or 1)
        if e["type"] == "step.started":
            began = Try(attempt, e["at"])
            if last is not None and last.outcome is None and last.attempt == attempt:
                known[-1] = began
            elif last is not None and attempt <= last.attempt:
                out[name] = [began]
            else:
                known.append(began)
        elif e["type"] in _OUTCOMES and last is not None and last.outcome is None:
            known[-1] = replace(
                last,
                ended_at=e["at"],
                outcome=_OUTCOMES[e["type"]],
                error=data.get("error"),
                retry_in_ms=data.get("delayMs") if e["type"] == "step.retrying" else None,
            )
    return out


def try_bars(run: dict[str, Any], found: dict[str, list[Try]]) -> dict[str, list[tuple[Try, Bar]]]:
    """The bar of each try, on the run's axis, for the steps tried more than once."""
    start, span, now = _axis(run)
    out = {}
    for name, each in found.items():
        if len(each) > 1:
            out[name] = [
                (t, _bar(_t(t.started_at) or start, _t(t.ended_at) or now, start, span))
                for t in each
            ]
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
