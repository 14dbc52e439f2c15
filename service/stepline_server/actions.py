"""Actions on runs that the API, the dashboard and bulk operations share: each does the store's
part, counts the runs it started in ``stepline_runs_started_total`` and wakes the dispatcher,
so that a run is counted whatever started it."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Any

from stepline_server.store import schedules, waits
from stepline_server.store.db import Conn, Record

if TYPE_CHECKING:
    from stepline_server.orchestrator import Orchestrator


async def retry_run(
    o: Orchestrator,
    conn: Conn,
    project_id: uuid.UUID,
    run_id: uuid.UUID,
    from_step: str | None,
    *,
    by: str = "retry",
) -> Record | None:
    """Run an ended run again (a completed one from ``from_step``); None when there is no such
    run; ``RuleError`` when its state does not allow it. ``by``: the metric's trigger label
    (``retry``, or ``bulk`` for a bulk operation)."""
    row = await waits.retry(conn, project_id, run_id, from_step)
    if row is not None:
        o.metrics.run_started(row["workflow"], by)
        o.dispatcher.wake()
    return row


async def send_event(
    o: Orchestrator,
    conn: Conn,
    project_id: uuid.UUID,
    name: str,
    data: Any,
    key: str | None = None,
    *,
    event_id: uuid.UUID | None = None,
) -> tuple[str, waits.Sent]:
    """Send an event (see :func:`stepline_server.store.waits.send_event`), counting the runs
    it started; answers the event's id (its sender's, else its own) and what it did."""
    public_id, sent = await waits.send_event(
        conn, project_id, name, data, key, notify=o.dispatcher.tell_others(), event_id=event_id
    )
    if not sent.repeated:
        for workflow in sent.started_workflows:
            o.metrics.run_started(workflow, "event")
        for workflow in sent.absorbed:
            o.metrics.debounce_absorbed(workflow)
        for fired in sent.fired:
            o.metrics.gathering_fired(fired.workflow, fired.kind, fired.starts)
    if sent.matched or sent.started:
        o.dispatcher.wake()
    return public_id, sent


async def trigger_schedule(
    o: Orchestrator, conn: Conn, project_id: uuid.UUID, schedule_id: str, now: datetime
) -> Record | None:
    """Start a run of the schedule now (trigger ``manual``); None when there is none."""
    run = await schedules.trigger(conn, project_id, schedule_id, now)
    if run is not None:
        o.metrics.run_started(run["workflow"], "manual")
        o.dispatcher.wake()
    return run
