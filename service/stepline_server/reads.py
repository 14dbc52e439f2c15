"""Reads the API and the dashboard make the same way: a run with its app, steps and URLs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from stepline_server import serialize
from stepline_server.engine import history
from stepline_server.store import apps, pause, runs, schedules
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


async def app_slug(conn: Conn, row: Record) -> str | None:
    """The slug of a run's app (read along with the run when the query joined it)."""
    slug = row.get("app_slug")
    if slug is not None:
        return slug  # type: ignore[no-any-return]
    app = await apps.get(conn, row["project_id"], str(row["app_id"]))
    return app["slug"] if app else None


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
    slug = await app_slug(conn, row)
    steps = await runs.steps(conn, row["id"]) if with_steps else None
    if row["schedule_id"] is not None and "schedule_sla_ms" not in row:
        # a row read without its schedule's SLA (as a write answers it)
        row = {**row, "schedule_sla_ms": await schedules.sla_of(conn, row["schedule_id"])}
    data = serialize.run(row, slug, steps, callback_url)
    if with_steps:
        counted = await runs.counters(conn, row["id"])
        paused = await pause.run_paused(conn, row["id"])
        _add_counts(data, counted, paused, steps or [], limits)
    return data


_NOTHING_YET = {"invocations": 0, "delivery_failures": 0, "steps_completed": 0}


def new_run_json(
    row: Record, *, paused: bool, limits: history.Limits | None = None
) -> dict[str, Any]:
    """A run just created (``row`` as its insert answered it, with its app's slug), in the
    shape :func:`run_json` gives a run read with its steps, without reading anything: it has
    no steps, invocations or deployment yet; ``paused``: its workflow or app is."""
    data = serialize.run({**row, "deployment_id": None}, row["app_slug"], [])
    _add_counts(data, _NOTHING_YET, paused, [], limits)
    return data


def _add_counts(
    data: dict[str, Any],
    counted: Mapping[str, Any],
    paused: bool,
    steps: list[Record],
    limits: history.Limits | None,
) -> None:
    """What a run read alone shows beside its fields: its counters, whether a pause holds it,
    and the size of its history (with a warning near ``limits``, when given)."""
    data["invocations"] = counted["invocations"]
    data["deliveryFailures"] = counted["delivery_failures"]
    data["stepsCompleted"] = counted["steps_completed"]
    data["paused"] = paused
    size = history.size_of(steps)
    data["history"] = {"steps": size.steps, "bytes": size.bytes}
    if limits is not None:
        data["history"] |= {
            "maxSteps": limits.steps,
            "maxBytes": limits.bytes,
            "warning": history.check(size, limits).warning,
        }
