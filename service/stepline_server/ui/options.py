"""A workflow's registered options as a person reads them (``retries: 3 attempts, …``), for the
workflows page: each option a short sentence, durations in words."""

from __future__ import annotations

import json
from typing import Any

from stepline.wire import in_words

# Options said together with another one, not on their own line.
_FOLDED = frozenset({"concurrencyKey"})


def _ms(value: Any) -> str:
    return in_words(float(value) / 1000) if isinstance(value, int | float) else str(value)


def _schema(value: Any) -> str:
    title = value.get("title") if isinstance(value, dict) else None
    return f"typed ({title})" if title else "typed"


def _retries(r: dict[str, Any]) -> str:
    attempts = r.get("attempts", 3)
    if attempts <= 1:
        return "1 attempt (no retry)"
    return (
        f"{attempts} attempts, waits {_ms(r.get('initialDelayMs', 1000))}, growing"
        f" {r.get('factor', 2.0):g}x to at most {_ms(r.get('maxDelayMs', 3_600_000))}"
    )


def _rate(r: dict[str, Any]) -> str:
    per = f" per {r['key']}" if r.get("key") else ""
    return f"{r.get('limit')} run(s) start per {_ms(r.get('periodMs'))}{per}"


def _debounce(d: dict[str, Any]) -> str:
    per = f" per {d['key']}" if d.get("key") else ""
    text = f"starts within {_ms(d.get('periodMs'))} of each other make one run{per}"
    if d.get("maxWaitMs") is not None:
        text += f", started at most {_ms(d['maxWaitMs'])} after the first"
    return text


def _batch(b: dict[str, Any]) -> str:
    per = f" per {b['key']}" if b.get("key") else ""
    return (
        f"events gathered into runs of at most {b.get('size')}{per},"
        f" started {_ms(b.get('waitMs'))} after the first at the latest"
    )


def _schedule(s: dict[str, Any]) -> str:
    text = f"{s.get('cron')} ({s.get('timezone', 'UTC')})"
    if s.get("slaMs"):
        text += f", SLA {_ms(s['slaMs'])}"
    return text


def readable(options: dict[str, Any]) -> list[tuple[str, str]]:
    """``(name, sentence)`` for each option set, in a fixed order, the rest after as JSON."""
    o = options or {}
    out: list[tuple[str, str]] = []
    if isinstance(o.get("retries"), dict):
        out.append(("retries", _retries(o["retries"])))
    if o.get("timeoutMs") is not None:
        out.append(("timeout", _ms(o["timeoutMs"])))
    if o.get("concurrency") is not None:
        per = f" per {o['concurrencyKey']}" if o.get("concurrencyKey") else ""
        out.append(("concurrency", f"at most {o['concurrency']} at once{per}"))
    if isinstance(o.get("rateLimit"), dict):
        out.append(("rate limit", _rate(o["rateLimit"])))
    if o.get("singletonKey"):
        out.append(("singleton", f"one run at a time per {o['singletonKey']}"))
    if o.get("onEvent"):
        out.append(("started by event", str(o["onEvent"])))
    if isinstance(o.get("debounce"), dict):
        out.append(("debounce", _debounce(o["debounce"])))
    if isinstance(o.get("batch"), dict):
        out.append(("batch", _batch(o["batch"])))
    if isinstance(o.get("schedule"), dict):
        out.append(("schedule", _schedule(o["schedule"])))
    if o.get("deliveryWindowMs") is not None:
        out.append(("delivery window", _ms(o["deliveryWindowMs"])))
    for key in ("inputSchema", "outputSchema"):
        if o.get(key) is not None:
            out.append((key.removesuffix("Schema"), _schema(o[key])))
    said = {
        "retries",
        "timeoutMs",
        "concurrency",
        "rateLimit",
        "singletonKey",
        "onEvent",
        "debounce",
        "batch",
        "schedule",
        "deliveryWindowMs",
        "inputSchema",
        "outputSchema",
        *_FOLDED,
    }
    for key in sorted(o.keys() - said):
        if o[key] is not None:
            out.append((key, json.dumps(o[key], ensure_ascii=False, separators=(", ", ": "))))
    return out
