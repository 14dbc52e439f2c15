"""Committing an invocation's step progress: one run's plan or several runs' in one statement,
with the children and event waits it starts and, when the invocation ended, its outcome."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from stepline_server.engine import event_locks
from stepline_server.engine import logs as run_logs
from stepline_server.engine import state as state_rules
from stepline_server.engine.events import EventType
from stepline_server.engine.steps import Plan
from stepline_server.engine.transitions import Outcome
from stepline_server.store import children, citus_loop, runs, state
from stepline_server.store.db import Conn, Q, Record, on_citus
from stepline_server.store.outcomes import record_outcomes


async def apply_plan(conn: Conn, item: Progress) -> Committed | None:
    """Commit one invocation's step changes for the lease holder, with the children and event
    waits they start and, when the item ends the invocation, its outcome, in one transaction;
    None when the token is stale."""
    async with conn.transaction():
        row = await _apply(conn, item)
        if row is None:
            return None
        recorded = await record_outcomes(conn, [item] if item.outcome else [])
        return Committed(row, item.run_id in recorded)


@dataclass(frozen=True)
class Progress:
    """One invocation's step changes, to commit alongside other runs' (a group commit)."""

    run_id: uuid.UUID
    token: str
    invocation_id: uuid.UUID
    plan: Plan
    extra_events: tuple[dict[str, Any], ...] = ()
    seq: int = 0  # the SDK's number for this call; 0 for the invocation's answer
    digest: str | None = None  # of the call's body: the same seq with another body is refused
    outcome: Outcome | None = None  # set when the invocation ended: record it too


@dataclass(frozen=True)
class Committed:
    """What a commit answers for one run: its progress row, and whether the item's outcome
    was recorded (False when it had none, or the lease was lost before it)."""

    row: Record
    recorded: bool = False


async def commit(conn: Conn, items: list[Progress]) -> dict[uuid.UUID, Committed]:
    """Commit several runs' progress and the outcomes of the invocations that ended: one
    statement when none ended, else one transaction. A run missing from the answer had a stale
    token. Plans that need a transaction of their own go to :func:`apply_plan`."""
    if not any(item.outcome for item in items):
        return {run_id: Committed(row) for run_id, row in (await apply_batch(conn, items)).items()}
    async with conn.transaction():
        rows = await apply_batch(conn, items)
        applied = [item for item in items if item.run_id in rows]
        recorded = await record_outcomes(conn, [item for item in applied if item.outcome])
        return {
            item.run_id: Committed(rows[item.run_id], item.run_id in recorded) for item in applied
        }


async def apply_batch(conn: Conn, items: list[Progress]) -> dict[uuid.UUID, Record]:
    """Commit several runs' progress in one statement, with their log lines (as far as each
    run's log has room: see :mod:`stepline_server.engine.logs`); a run missing from the answer
    had a stale token (nothing of it was written). Each run may appear once."""
    requests, changes, callbacks, lines = [], [], [], []
    for item in items:
        run = str(item.run_id)
        requests.append(
            {
                "run_id": run,
                "token": item.token,
                "invocation_id": str(item.invocation_id),
                "events": [*item.plan.events, *item.extra_events],
                "seq": item.seq,
                "digest": item.digest,
                "logs_dropped": item.plan.logs_dropped,
            }
        )
        changes += [c.row() | {"run_id": run, "ord": n} for n, c in enumerate(item.plan.changes, 1)]
        callbacks += [
            {"run_id": run, "id": cid, "step_name": name, "timeout_ms": timeout}
            for cid, name, timeout in item.plan.callbacks
        ]
        lines += [line | {"run_id": run} for line in item.plan.logs]
    args = (requests, changes, callbacks, lines, run_logs.MAX_LINES, run_logs.MAX_BYTES)
    if on_citus(conn):
        rows = await citus_loop.progress(conn, *args)
    else:
        rows = await conn.fetch(Q["progress"], *args)
    return {row["id"]: row for row in rows}


async def _apply(conn: Conn, item: Progress) -> Record | None:
    plan, run_id = item.plan, item.run_id
    since = None
    if plan.states:
        # New keys past the run's limit are refused (their steps recorded failed): counted
        # under the run's lock, which the progress statement then holds on.
        existing = await state.keys_locked(conn, run_id)
        plan.refuse_states(state_rules.over_limit([k for k, _ in plan.states], existing))
    if plan.event_waits:
        run = await conn.fetchrow(Q["progress_at"], run_id)
        if run is None:
            return None
        since = run["progress_at"]
        # A wait and an event that could match it are recorded one at a time (see
        # send_event), name by name in name order so that two plans never wait in a ring.
        waits = [(wait.event_name or "", wait.match) for wait in plan.event_waits]
        for locks in event_locks.wait_locks(str(run["project_id"]), waits):
            await lock_event_name(conn, run["project_id"], locks)
    row = (await apply_batch(conn, [item])).get(run_id)
    if row is None:
        return None
    project_id = row["project_id"]
    for child in plan.children:
        await children.start_child(
            conn, project_id, run_id, child.id, child.step_name, child.workflow, child.input
        )
    if plan.event_waits and since is not None:
        await _take_recent_events(conn, project_id, run_id, plan, since)
    if plan.states and row["applied"]:
        await state.record(conn, run_id, plan.states)
    return row


async def lock_event_name(conn: Conn, project_id: uuid.UUID, locks: event_locks.NameLocks) -> None:
    """Hold the locks ``locks`` of an event name of the project until the transaction ends:
    sending an event and recording a wait that could match it take one in common, so each
    sees what the other committed (:mod:`~stepline_server.engine.event_locks`)."""
    await conn.execute(
        Q["lock_event_name"],
        project_id,
        locks.name,
        locks.exclusive,
        list(locks.fields),
        locks.fields_exclusive,
    )


async def _take_recent_events(
    conn: Conn, project_id: uuid.UUID, run_id: uuid.UUID, plan: Plan, since: Any
) -> None:
    """Event waits see matching events that arrived since the invocation last committed."""
    taken: list[dict[str, Any]] = []
    for wait in plan.event_waits:
        took = await conn.fetchrow(
            Q["take_recent_event"],
            run_id,
            project_id,
            wait.name,
            since,
            wait.event_name,
            wait.match,
        )
        if took is not None:
            name = took["name"]
            data = {"event": wait.event_name, "eventId": took["event_id"]}
            taken += [
                {"type": EventType.EVENT_RECEIVED, "step_name": name, "data": data},
                {"type": EventType.STEP_COMPLETED, "step_name": name, "data": {"kind": "event"}},
            ]
    if taken:
        await runs.wake(conn, run_id, taken, notify=False)
