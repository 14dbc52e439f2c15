"""Debounces and batches in the database: a start joins the open gathering of its key (or
opens one, creating its run through :func:`stepline_server.store.runs.insert`, held with no
due time), and a gathering whose time has come is fired: its run made due, so the dispatcher
invokes it as any other run (caps, rate limits and pauses apply there)."""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from stepline_server.engine import gathering
from stepline_server.store import db, runs
from stepline_server.store.db import Conn, Q, Record, query


@dataclass(frozen=True)
class Gathered:
    """What a start did: the run it is gathered into, that run's row when this start created
    it (None: it joined a run already gathering), how many starts the run has gathered, and
    the run fired with this start (a batch that filled: ``starts`` is its size)."""

    run_id: uuid.UUID
    created: Record | None
    starts: int
    fired: bool = False


@dataclass(frozen=True)
class Fired:
    """A gathering fired: its run, of ``workflow``, made due after gathering ``starts``."""

    run_id: uuid.UUID
    workflow: str
    kind: str
    starts: int


async def gather(
    conn: Conn,
    spec: gathering.Spec,
    new: runs.NewRun,
    *,
    event_id: str | None = None,
) -> Gathered | None:
    """Gather the start ``new`` (its input, or for a batch the event's data as ``new.input``)
    into the open gathering of its key, or open one with ``new`` as its run (a batch's input
    is then the list of that one data). ``event_id``: the event's id as its sender sees it (a
    batch lists them). Must run in the caller's transaction; starts of one key are serialised
    across orchestrators. None when the run could not be created (its workflow is gone)."""
    key = gathering.key_of(spec, new.input)
    now: datetime = await conn.fetchval(
        Q["lock_gathering_key"], new.project_id, new.workflow, spec.kind, key
    )
    events = [event_id] if event_id is not None else []
    open_ = await _open(conn, new.project_id, new.workflow, spec.kind, key)
    if open_ is not None:
        joined = await _join(conn, spec, open_, new.input, now, events)
        if joined is not None:
            return joined
        await conn.execute(Q["drop_gathering"], open_["run_id"])  # its run gathers no more
    first = [new.input] if spec.kind == gathering.BATCH else new.input
    created = await runs.insert(
        conn, dataclasses.replace(new, input=first, gathering=True), notify=False
    )
    if created is None:
        return None
    await conn.execute(
        Q["insert_gathering"],
        new.project_id,
        new.workflow,
        spec.kind,
        key,
        created["id"],
        events,
        gathering.fire_at(spec, now, now),
    )
    fired = gathering.is_full(spec, 1) and await fire(conn, created["id"]) is not None
    return Gathered(created["id"], created, 1, fired)


async def _open(
    conn: Conn, project_id: uuid.UUID, workflow: str, kind: str, key: str
) -> Record | None:
    """The open gathering of ``key``, locked until the transaction ends (open_gathering); on
    Citus its run is found first, then the gathering is locked on that run's shard."""
    group = (project_id, workflow, kind, key)
    if not db.on_citus(conn):
        return await conn.fetchrow(Q["open_gathering"], *group)
    for run_id in [r["run_id"] for r in await conn.fetch(Q["on_citus_open_gathering"], *group)]:
        found = await conn.fetchrow(Q["on_citus_lock_gathering"], *group, run_id)
        if found is not None:
            return found
    return None


async def _join(
    conn: Conn,
    spec: gathering.Spec,
    open_: Record,
    data: Any,
    now: datetime,
    events: list[str],
) -> Gathered | None:
    """Join the open gathering ``open_``; None when its run gathers no more."""
    run_id = open_["run_id"]
    if not open_["gathers"]:
        return None
    statement = "debounce_input" if spec.kind == gathering.DEBOUNCE else "batch_input"
    if not await conn.fetchval(Q[statement], run_id, data):
        return None
    due = gathering.fire_at(spec, open_["first_at"], now)
    row = await conn.fetchrow(Q["join_gathering"], run_id, due, events)
    starts = int(row["starts"])
    fired = gathering.is_full(spec, starts) and await fire(conn, run_id) is not None
    return Gathered(run_id, None, starts, fired)


async def fire(conn: Conn, run_id: uuid.UUID) -> Fired | None:
    """Fire the gathering of ``run_id`` now: its run made due (``run.debounced`` or
    ``run.batched`` in its history); None when the run no longer gathers."""
    row = await conn.fetchrow(query(conn, "fire_gatherings"), run_id, 1)
    return None if row is None else _fired(row)


async def fire_due(conn: Conn, limit: int = 100) -> list[Fired]:
    """Fire up to ``limit`` gatherings whose time has come (each claimed, so two orchestrators
    never fire one twice)."""
    return [_fired(row) for row in await conn.fetch(query(conn, "fire_gatherings"), None, limit)]


def _fired(row: Record) -> Fired:
    return Fired(row["id"], row["workflow"], row["kind"], int(row["starts"]))


async def of_run(conn: Conn, run_id: uuid.UUID) -> Record | None:
    """The open gathering of ``run_id``, if it is gathering."""
    return await conn.fetchrow(Q["gathering_of_run"], run_id)
