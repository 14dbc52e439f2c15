"""Reads the API and the dashboard make the same way: a run with its app, steps and URLs."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from stepline_server.application import serialize
from stepline_server.engine import gathering, history, holds
from stepline_server.store import apps, gatherings, runs, schedules
from stepline_server.store.db import Conn, Record

if TYPE_CHECKING:
    from stepline_server.orchestrator import Orchestrator


def callback_url(o: Orchestrator) -> serialize.CallbackUrl:
    """Signed callback URLs built on the orchestrator's public base URL."""
    base = o.settings.base_url
    return lambda callback_id: o.signer.url(base, callback_id)


def history_limits(o: Orchestrator) -> history.Limits:
    """The history limit the orchestrator applies to every run."""
    return history.Limits(o.settings.history_max_steps, o.settings.history_max_bytes)


async def with_app(conn: Conn, row: Record) -> Record:
    """A run's row with its app's slug and name (read along with the run when the query
    joined them)."""
    if row.get("app_slug") is not None and row.get("app_name") is not None:
        return row
    app = await apps.get(conn, row["project_id"], str(row["app_id"]))
    return {
        **row,
        "app_slug": app["slug"] if app else None,
        "app_name": app["name"] if app else None,
    }


def held_by(row: Record, paused: bool) -> str | None:
    """What holds the run (:func:`stepline_server.engine.holds.held_by`), from its row."""
    state = holds.RunState(
        ended=row.get("ended_at") is not None,
        paused=paused,
        leased=row.get("lease_token") is not None,
        held=bool(row.get("held")),
        undelivered=row.get("undelivered_since") is not None,
        rate_limited="rateLimit" in (row.get("options") or {}),
        started=row.get("started_at") is not None,
        ready_at=row.get("ready_at"),
        gathers=spec.kind if (spec := gathering.spec_of(row.get("options"))) else None,
    )
    found = holds.held_by(state, datetime.now(UTC))
    return found.value if found is not None else None


async def run_json(
    conn: Conn,
    row: Record,
    *,
    with_steps: bool = True,
    callback_url: serialize.CallbackUrl | None = None,
    limits: history.Limits | None = None,
) -> dict[str, Any]:
    """A run as the API shows it, with its app's slug and (by default) its steps, each waiting
    callback with its URL when ``callback_url`` is given, and the size of its history (with a
    warning near ``limits``, when given)."""
    row = await with_app(conn, row)
    steps = await runs.steps(conn, row["id"]) if with_steps else None
    if row["schedule_id"] is not None and "schedule_sla_ms" not in row:
        # a row read without its schedule's SLA (as a write answers it)
        row = {**row, "schedule_sla_ms": await schedules.sla_of(conn, row["schedule_id"])}
    data = serialize.run(row, row["app_slug"], steps, callback_url)
    if with_steps:
        counted = await runs.counters(conn, row["id"])
        _add_counts(data, row, counted, counted["paused"], steps or [], limits)
        if data["heldBy"] in GATHERING_HOLDS:
            data["gathering"] = await _gathering(conn, row["id"])
    return data


GATHERING_HOLDS = {holds.HeldBy.DEBOUNCE.value, holds.HeldBy.BATCH.value}


async def _gathering(conn: Conn, run_id: Any) -> dict[str, Any] | None:
    """What a run gathering starts shows of it: ``{kind, starts, firesAt}`` (None: it has just
    fired)."""
    row = await gatherings.of_run(conn, run_id)
    if row is None:
        return None
    return {
        "kind": row["kind"],
        "starts": row["starts"],
        "firstAt": serialize.ts(row["first_at"]),
        "firesAt": serialize.ts(row["fire_at"]),
    }


_NOTHING_YET = {"invocations": 0, "delivery_failures": 0}


def new_run_json(
    row: Record, *, paused: bool, limits: history.Limits | None = None
) -> dict[str, Any]:
    """A run just created (``row`` as its insert answered it, with its app's slug), in the
    shape :func:`run_json` gives a run read with its steps, without reading anything: it has
    no steps, invocations or deployment yet; ``paused``: its workflow or app is."""
    data = serialize.run({**row, "deployment_id": None}, row["app_slug"], [])
    _add_counts(data, row, _NOTHING_YET, paused, [], limits)
    return data


def _add_counts(
    data: dict[str, Any],
    row: Record,
    counted: Mapping[str, Any],
    paused: bool,
    steps: list[Record],
    limits: history.Limits | None,
) -> None:
    """What a run read alone shows beside its fields: its counters, whether a pause (or what
    else) holds it, and the size of its history (with a warning near ``limits``, when given)."""
    data["invocations"] = counted["invocations"]
    data["deliveryFailures"] = counted["delivery_failures"]
    data["stepsCompleted"] = sum(1 for s in steps if s["status"] == "completed")
    data["paused"] = paused
    data["heldBy"] = held_by(row, paused)
    size = history.size_of(steps)
    data["history"] = {"steps": size.steps, "bytes": size.bytes}
    if limits is not None:
        data["history"] |= {
            "maxSteps": limits.steps,
            "maxBytes": limits.bytes,
            "warning": history.check(size, limits).warning,
        }
