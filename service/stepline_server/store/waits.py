"""What moves a run from outside: callbacks, events, cancel and retry requests."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from asyncpg import UniqueViolationError

from stepline_server.engine import event_locks, gathering, ids
from stepline_server.engine import runs as rules
from stepline_server.store import children, db, gatherings, leases, outcomes, progress, runs
from stepline_server.store.db import Conn, Q, Record


async def get_callback(
    conn: Conn, callback_id: uuid.UUID, project_id: uuid.UUID | None
) -> Record | None:
    """A callback (of ``project_id`` when given)."""
    return await conn.fetchrow(Q["get_callback"], callback_id, project_id)


@dataclass(frozen=True)
class Completed:
    """What completing a callback did: the callback (None when it does not exist), whether this
    call completed it, the run when the call leased it (see :func:`complete_callback`), and
    whether the callback was completed before with this same body (a retried delivery)."""

    callback: Record | None
    completed: bool
    taken: leases.Taken | None = None
    repeated: bool = False


async def complete_callback(
    conn: Conn,
    callback_id: uuid.UUID,
    project_id: uuid.UUID | None,
    body: Any,
    *,
    notify: bool = True,
    lease: leases.Lease | None = None,
) -> Completed:
    """Complete a pending callback with ``body``; its run wakes. ``notify``: wake every
    orchestrator's dispatcher, as :func:`stepline_server.store.runs.insert` says. With
    ``lease``, the run is leased at once through the lease transition, in the same transaction
    (:func:`stepline_server.store.leases.take_now`: nothing gates it and no invocation holds
    it), and :attr:`Completed.taken` has it. A callback completed before with the same body
    (as JSON: key order and spacing aside) is :attr:`Completed.repeated`, and nothing changes."""
    async with conn.transaction():
        if db.on_citus(conn):
            run_id = await conn.fetchval(Q["callback_run"], callback_id)
            row = await conn.fetchrow(
                Q["on_citus_complete_callback"], callback_id, body, project_id, notify, run_id
            )
        else:
            row = await conn.fetchrow(Q["complete_callback"], callback_id, body, project_id, notify)
        if row is None:
            row = await get_callback(conn, callback_id, project_id)
            repeated = row is not None and bool(
                await conn.fetchval(Q["callback_completed_with"], callback_id, body)
            )
            return Completed(row, False, repeated=repeated)
        taken = None
        if lease is not None and row["run_woken"]:
            taken = await leases.take_now(conn, row["run_id"], lease)
        return Completed(row, True, taken)


_NS = uuid.UUID("2b7f6f0e-77d4-4f4c-8d3b-6f1f7c2a9e15")


def event_row_id(project_id: uuid.UUID, key: str | None) -> uuid.UUID:
    """The stored id of an event: derived from the sender's id (so a second send of it is the
    same row), else new."""
    return uuid.uuid5(_NS, f"event:{project_id}:{key}") if key is not None else ids.new_id()


def event_run_id(event_id: uuid.UUID, workflow: str) -> uuid.UUID:
    """The id of the run an event starts of a workflow: derived, so it starts exactly once."""
    return ids.derived_id(event_id, f"event-run:{event_id}:{workflow}", _NS)


@dataclass(frozen=True)
class Sent:
    """What sending an event did: the runs it resumed and those it started, and whether it was
    a second send of an id (then nothing was done again: the first answer is repeated)."""

    matched: list[uuid.UUID]
    started: list[uuid.UUID]
    repeated: bool = False
    started_workflows: list[str] = field(default_factory=list)  # runs created, by workflow
    absorbed: list[str] = field(default_factory=list)  # debounced runs it joined, by workflow
    fired: list[gatherings.Fired] = field(default_factory=list)  # batches it filled


async def send_event(
    conn: Conn,
    project_id: uuid.UUID,
    name: str,
    data: Any,
    key: str | None = None,
    *,
    notify: bool = True,
    event_id: uuid.UUID | None = None,
) -> tuple[str, Sent]:
    """Record the event (of the sender's id ``key``, when given), resume every run waiting for
    event ``name`` whose match fields all equal ``data``'s, and start a run of every workflow
    declared ``on_event`` of it (its id derived from the event, so it starts once); answer the
    event's id (the sender's, else the stored event's) and what was done. A second send of one
    ``key`` does nothing again and answers the first send's outcome. Serialised with the
    recording of waits that could match it
    (:func:`~stepline_server.store.progress.lock_event_name`), so an event and a wait
    committed at once never miss each other; sends never wait for each other. ``event_id``: the id
    :func:`event_row_id` gave, when a try of this send whose commit was lost came first (the
    same id finds what it kept)."""
    event_id = event_id or event_row_id(project_id, key)
    public_id = key if key is not None else str(event_id)
    async with conn.transaction():
        locks = event_locks.send_locks(str(project_id), name, data)
        await progress.lock_event_name(conn, project_id, locks)
        if await conn.fetchval(Q["insert_event"], event_id, project_id, name, data, key) is None:
            answer = await conn.fetchval(Q["event_answer"], event_id) or {}
            return public_id, Sent(
                [uuid.UUID(r) for r in answer.get("matched", [])],
                [uuid.UUID(r) for r in answer.get("started", [])],
                repeated=True,
            )
        rows = await conn.fetch(
            db.query(conn, "match_event"), event_id, project_id, name, data, key
        )
        matched = [row["id"] for row in rows]
        if any(row["pull"] for row in rows):
            await conn.execute(Q["notify_wake"])
        started: list[uuid.UUID] = []
        workflows: list[str] = []
        absorbed: list[str] = []
        fired: list[gatherings.Fired] = []
        for wf in await conn.fetch(Q["event_workflows"], project_id, name):
            new = runs.NewRun(
                event_run_id(event_id, wf["name"]), project_id, wf["name"], data,
                trigger="event", event_id=event_id, event_key=key,
            )  # fmt: skip
            spec = gathering.spec_of(wf["options"])
            if spec is None:
                if await runs.insert(conn, new, notify=notify) is not None:
                    started.append(new.id)
                    workflows.append(wf["name"])
                continue
            got = await gatherings.gather(conn, spec, new, event_id=public_id)
            if got is None:
                continue
            started.append(got.run_id)  # the run it joined or opened
            if got.created is not None:
                workflows.append(wf["name"])
            elif spec.kind == gathering.DEBOUNCE:
                absorbed.append(wf["name"])
            if got.fired:
                fired.append(gatherings.Fired(got.run_id, wf["name"], spec.kind, got.starts))
        answer = {"matched": [str(r) for r in matched], "started": [str(r) for r in started]}
        await conn.execute(Q["set_event_answer"], event_id, answer)
    sent = Sent(matched, started, started_workflows=workflows, absorbed=absorbed, fired=fired)
    return public_id, sent


async def cancel(
    conn: Conn, project_id: uuid.UUID, run_id: uuid.UUID, *, by: str | None = None
) -> Record | None:
    """Request cancellation (a run never invoked ends cancelled at once); None when the run
    does not exist; RuleError when it has ended. ``by`` names who asked in the event the
    cancel causes (``data.by``: a bulk operation)."""
    async with conn.transaction():
        run = await conn.fetchrow(Q["lock_run"], project_id, run_id)
        if run is None:
            return None
        if rules.check_cancel(run["status"]):
            if rules.cancels_at_once(run["started_at"], run["lease_token"]):
                status = rules.RunStatus.CANCELLED
                await outcomes.end_run(conn, run_id, None, status, None, None, by)
            else:
                await children.cancel_tree(conn, run_id, by)
        return await runs.get(conn, project_id, run_id)


async def retry(
    conn: Conn,
    project_id: uuid.UUID,
    run_id: uuid.UUID,
    from_step: str | None,
    *,
    by: str | None = None,
    trigger: str = "retry",
) -> Record | None:
    """Run an ended run again, keeping the steps recorded before its first failed or unfinished
    one (and before ``from_step``, if given: a completed run may be reset so); its trigger
    becomes ``trigger`` (``bulk`` for a bulk operation's). The API, the dashboard and bulk
    operations all retry through here.
    ``by`` names who asked in its ``run.retried`` and ``run.started`` events (``data.by``: a
    bulk operation).
    RuleError when its state does not allow it, or another run holds its singleton key."""
    try:
        return await _retry(conn, project_id, run_id, from_step, by, trigger)
    except UniqueViolationError:  # another retry took the singleton key at the same moment
        holder = await conn.fetchval(Q["singleton_holder"], run_id)
        raise rules.RuleError(rules.singleton_taken(holder)) from None


async def _retry(
    conn: Conn,
    project_id: uuid.UUID,
    run_id: uuid.UUID,
    from_step: str | None,
    by: str | None,
    trigger: str,
) -> Record | None:
    async with conn.transaction():
        run = await conn.fetchrow(Q["lock_run"], project_id, run_id)
        if run is None:
            return None
        rules.check_retry(run["status"], from_step)
        position = None
        if from_step is not None:
            position = await conn.fetchval(Q["step_position"], run_id, from_step)
            if position is None:
                raise rules.RuleError(
                    f"the run has no recorded step named {from_step!r}", "validation_failed"
                )
        return await runs.restart(conn, run_id, position, from_step, trigger=trigger, by=by)


async def delete_old_events(conn: Conn, older_than_seconds: float, limit: int = 5000) -> int:
    """Delete up to ``limit`` events received more than ``older_than_seconds`` ago; how many."""
    status = await conn.execute(db.query(conn, "delete_old_events"), older_than_seconds, limit)
    return int(status.split()[-1])


async def delete_old_runs(conn: Conn, older_than_seconds: float, limit: int = 500) -> int:
    """Delete up to ``limit`` runs that ended more than ``older_than_seconds`` ago, and the
    singleton keys they held last; how many runs."""
    if db.on_citus(conn):
        # Their children lose their parent here: on Citus no foreign key does it.
        async with conn.transaction():
            gone = [r["id"] for r in await conn.fetch(Q["on_citus_delete_old_runs"],
                                                      older_than_seconds, limit)]  # fmt: skip
            if gone:
                await conn.execute(Q["on_citus_forget_parents"], gone)
                await conn.execute(Q["forget_singletons"], gone)
        return len(gone)
    return int(await conn.fetchval(Q["delete_old_runs"], older_than_seconds, limit))


async def delete_old_ticks(conn: Conn, older_than_seconds: float, limit: int = 5000) -> int:
    """Delete up to ``limit`` schedule ticks recorded more than ``older_than_seconds`` ago."""
    status = await conn.execute(db.query(conn, "delete_old_ticks"), older_than_seconds, limit)
    return int(status.split()[-1])


async def delete_old_history(conn: Conn, older_than_seconds: float, limit: int = 5000) -> int:
    """Delete up to ``limit`` history events older than ``older_than_seconds`` of runs still
    going after that long."""
    status = await conn.execute(db.query(conn, "delete_old_history"), older_than_seconds, limit)
    return int(status.split()[-1])
