"""Runs as the API reads and starts them: create, fetch with steps, search, history."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from stepline_server.engine import runs as rules
from stepline_server.engine.events import EventType
from stepline_server.store.db import Conn, Q, Record


@dataclass(frozen=True)
class NewRun:
    """A run to create."""

    id: uuid.UUID
    project_id: uuid.UUID
    workflow: str
    input: Any
    run_key: str | None = None
    parent_run_id: uuid.UUID | None = None
    parent_step: str | None = None
    schedule_id: str | None = None
    scheduled_at: datetime | None = None
    trigger: str = "api"
    event_id: uuid.UUID | None = None
    event_key: str | None = None  # the id the event's sender gave
    priority: int = 0
    gathering: bool = False  # it gathers a debounce's or batch's starts: not due until it fires


async def insert(conn: Conn, run: NewRun, *, notify: bool = True) -> Record | None:
    """Create the run (its app and options from its workflow), due now, with its
    ``run.started`` event; the row has its app's slug. None when the workflow is not
    registered, or the run's id or run key exists. ``notify``: wake every orchestrator's
    dispatcher (a NOTIFY, which PostgreSQL serialises at commit), not needed when the caller's
    own dispatcher takes it (:func:`stepline_server.store.leases.take_now`)."""
    return await conn.fetchrow(
        Q["insert_run"],
        run.id,
        run.project_id,
        run.workflow,
        run.input,
        run.run_key,
        run.parent_run_id,
        run.parent_step,
        run.schedule_id,
        run.scheduled_at,
        run.trigger,
        {"trigger": run.trigger},
        notify,
        run.event_id,
        run.priority,
        run.event_key,
        run.gathering,
    )


async def append_events(conn: Conn, run_id: uuid.UUID, events: list[dict[str, Any]]) -> None:
    """Append events to a run's history, after its last one."""
    if events:
        await conn.execute(Q["append_events"], run_id, events)


async def active_singleton(
    conn: Conn, project_id: uuid.UUID, workflow: str, input: Any, field: str
) -> Record | None:
    """The run of ``workflow`` not ended whose singleton key field ``field`` has ``input``'s
    value, if there is one."""
    return await conn.fetchrow(Q["active_singleton"], project_id, workflow, input, field)


async def by_key(conn: Conn, project_id: uuid.UUID, run_key: str) -> Record | None:
    return await conn.fetchrow(Q["get_run_by_key"], project_id, run_key)


async def get(conn: Conn, project_id: uuid.UUID, run_id: uuid.UUID) -> Record | None:
    return await conn.fetchrow(Q["get_run"], project_id, run_id)


async def steps(conn: Conn, run_id: uuid.UUID) -> list[Record]:
    """A run's steps in the order they were first recorded."""
    return list(await conn.fetch(Q["run_steps"], run_id))


@dataclass(frozen=True)
class RunFilter:
    """What ``GET /v1/runs`` searches by."""

    workflow: str | None = None
    status: str | None = None
    run_key: str | None = None
    run_key_prefix: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None


async def search(
    conn: Conn,
    project_id: uuid.UUID,
    f: RunFilter,
    before: tuple[datetime, uuid.UUID] | None,
    limit: int,
) -> list[Record]:
    """Runs newest first, after the keyset cursor ``before``."""
    at, ident = before if before else (None, None)
    return list(
        await conn.fetch(
            Q["search_runs"],
            project_id,
            f.workflow,
            f.status,
            f.run_key,
            f.created_after,
            f.created_before,
            at,
            ident,
            limit,
            f.run_key_prefix,
        )
    )


async def events(
    conn: Conn, project_id: uuid.UUID, run_id: uuid.UUID, after: int, limit: int
) -> list[Record]:
    """A run's history after ``seq`` ``after``."""
    return list(await conn.fetch(Q["list_events"], run_id, project_id, after, limit))


async def logs(
    conn: Conn, project_id: uuid.UUID, run_id: uuid.UUID, after: int, limit: int
) -> list[Record]:
    """A run's log lines after ``seq`` ``after``, in the order the app wrote them."""
    return list(await conn.fetch(Q["list_logs"], run_id, project_id, after, limit))


async def invocations(
    conn: Conn, project_id: uuid.UUID, run_id: uuid.UUID, after: int, limit: int
) -> list[Record]:
    """A run's invocations begun after history ``seq`` ``after``, each with how it ended."""
    return list(await conn.fetch(Q["run_invocations"], run_id, project_id, after, limit))


async def counters(conn: Conn, run_id: uuid.UUID) -> Record:
    """How often a run was invoked, its failed deliveries, and whether a pause holds it (one
    read, beside its row and its steps, for a run shown alone)."""
    return await conn.fetchrow(Q["run_counters"], run_id)


async def restart(
    conn: Conn,
    run_id: uuid.UUID,
    position: int | None,
    from_step: str | None,
    trigger: str | None = None,
    by: str | None = None,
) -> Record:
    """Run an ended run again, from its first failed or unfinished step (or the step at
    ``position``, when earlier); with ``trigger``, the run says it came from there now (its
    ``run.retried`` event keeps the trigger it had), and a ``run.started`` event follows it;
    ``by`` names who asked (``data.by`` of both, e.g. a bulk operation). In a transaction, with
    the run locked. Raises :class:`~stepline_server.engine.runs.RuleError` while another run not
    ended holds its singleton key (the run takes the key first: two retries, or a retry and a
    start, take turns on it)."""
    holder = await conn.fetchval(Q["take_run_singleton"], run_id)
    if holder is not None:
        raise rules.RuleError(rules.singleton_taken(holder))
    before = await conn.fetchval(Q["run_trigger"], run_id) if trigger is not None else None
    await conn.execute(Q["delete_steps_for_retry"], run_id, position)
    row = await conn.fetchrow(Q["restart_run"], run_id, trigger)
    data: dict[str, Any] = {"fromStep": from_step} if from_step else {}
    if trigger is not None and before != trigger:
        data["previousTrigger"] = before
    started: dict[str, Any] = {"trigger": row["trigger"]}
    if by is not None:
        data["by"] = started["by"] = by
    # The retry is said (run.retried: from where, who asked), then the run starts again.
    events = [
        {"type": EventType.RUN_RETRIED, "data": data},
        {"type": EventType.RUN_STARTED, "data": started},
    ]
    await append_events(conn, run_id, events)
    await conn.execute(Q["notify_wake"])
    return row


async def wake(
    conn: Conn,
    run_id: uuid.UUID,
    events: list[dict[str, Any]] | None = None,
    *,
    notify: bool = True,
) -> bool:
    """Make a run not ended due now (or right after its active invocation), with ``events``
    (what woke it) in its history: the wake transition (``run_wake``); with ``notify``, wake
    every orchestrator's dispatcher. False when the run had ended (nothing appended)."""
    woken = bool(await conn.fetchval(Q["wake"], run_id, events))
    if notify:
        await conn.execute(Q["notify_wake"])
    return woken
