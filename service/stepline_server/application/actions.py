"""Actions on runs that the API, the dashboard and bulk operations share: each does the store's
part, counts the runs it started in ``stepline_runs_started_total`` and wakes the dispatcher,
so that a run is counted whatever started it and due work is looked for at once. The API and
the dashboard reach the dispatcher and the progress batcher only through here and
:mod:`stepline_server.application.at_once`."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Any

from stepline_server.store import pause, schedules, waits
from stepline_server.store import progress as step_progress
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


async def cancel_run(
    o: Orchestrator, conn: Conn, project_id: uuid.UUID, run_id: uuid.UUID
) -> Record | None:
    """Ask run ``run_id`` to stop (at once when no invocation holds it); None when there is no
    such run; ``RuleError`` when it has ended."""
    row = await waits.cancel(conn, project_id, run_id)
    if row is not None:
        o.dispatcher.wake()
    return row


async def set_workflow_paused(
    o: Orchestrator, conn: Conn, project_id: uuid.UUID, name: str, *, paused: bool
) -> Record | None:
    """Pause workflow ``name`` (none of its runs is invoked), or resume it (its waiting runs
    go on); None when there is no such workflow."""
    change = pause.pause_workflow if paused else pause.resume_workflow
    row = await change(conn, project_id, name)
    if row is not None and not paused:
        o.dispatcher.wake()
    return row


async def set_app_paused(
    o: Orchestrator, conn: Conn, project_id: uuid.UUID, app_id: uuid.UUID, *, paused: bool
) -> Record | None:
    """Pause or resume the app ``app_id`` (all its workflows); None when there is none."""
    change = pause.pause_app if paused else pause.resume_app
    row = await change(conn, project_id, app_id)
    if row is not None and not paused:
        o.dispatcher.wake()
    return row


def made_due(o: Orchestrator) -> None:
    """After an admin change that may have made runs due (a deployment deleted with its runs
    moved, say): the dispatcher looks for due work now."""
    o.dispatcher.wake()


def schedules_changed(o: Orchestrator) -> None:
    """After a schedule was created, changed or resumed: the scheduler looks at the next fire
    time now rather than at the one it was sleeping towards."""
    o.scheduler.wake()


def operation_queued(o: Orchestrator) -> None:
    """After a bulk operation was created: the operations loop starts on it now."""
    o.operations.wake()


def alert_queued(o: Orchestrator) -> None:
    """After an alert notification was queued (a test send): the alerts loop delivers it now."""
    o.alerts.wake()


async def apply_progress(
    o: Orchestrator, item: step_progress.Progress
) -> step_progress.Committed | None:
    """Commit an invocation's progress call through the batcher (many calls share one
    transaction); None when the invocation no longer owns its run."""
    return await o.batcher.apply(item)
