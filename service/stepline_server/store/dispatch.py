"""The run loop's writes: claim due runs, begin and finish invocations, commit step progress."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from asyncpg import UniqueViolationError

from stepline.protocol import INLINE_RESULT_BYTES
from stepline_server.engine import logs as run_logs
from stepline_server.engine import rates
from stepline_server.engine import runs as rules
from stepline_server.engine.steps import Plan
from stepline_server.store import history, runs, schedules
from stepline_server.store.db import Conn, Q, Record


async def claim(
    conn: Conn,
    owner: str,
    lease_seconds: float,
    limit: int,
    lead: float = 0.0,
    *,
    takeovers: bool = True,
    holding: Sequence[uuid.UUID] = (),
) -> list[Record]:
    """Lease up to ``limit`` runs due within ``lead`` seconds to ``owner`` for
    ``lease_seconds`` (:class:`Lease` says what ``takeovers`` and ``holding`` mean), higher
    priority first; see :func:`claim_leased`."""
    return await claim_leased(conn, Lease(owner, lease_seconds, holding, takeovers), limit, lead)


async def claim_leased(conn: Conn, lease: Lease, limit: int, lead: float = 0.0) -> list[Record]:
    """Lease up to ``limit`` runs due within ``lead`` seconds under ``lease``, higher priority
    first; each row's ``due_in`` says in how many seconds it is due. Runs of a workflow with a
    concurrency cap are claimed one workflow at a time under its lock (:func:`claim_capped`),
    and runs of a workflow with a rate limit that have not started yet one rate key value at a
    time under its lock (:func:`claim_rate_limited`). Every claim leases through the one lease
    transition (``lease_runs``): the runs ``lease.holding`` names are never taken again, and
    without ``lease.takeovers`` runs whose lease expired are left to their holders."""
    claimed = list(
        await conn.fetch(
            Q["claim_due"], limit, lease.owner, lease.seconds, lead, lease.takeovers,
            list(lease.holding),
        )
    )  # fmt: skip
    room = limit - len(claimed)
    if room > 0:
        groups = await conn.fetch(Q["due_gated_groups"])
        claimed += await claim_gated(conn, groups, lease, room)
    return claimed


async def claim_gated(conn: Conn, groups: list[Record], lease: Lease, limit: int) -> list[Record]:
    """Lease up to ``limit`` runs of the gated ``groups`` (rows of ``due_gated_groups``): a
    capped group under its cap's lock, a rate-limited one under its limit's."""
    claimed: list[Record] = []
    for group in groups:
        room = limit - len(claimed)
        if room <= 0:
            break
        pid, workflow, key = group["project_id"], group["workflow"], group["key"]
        if group["kind"] == "capped":
            capped = Capped(pid, workflow, key, group["cap"])
            claimed += await claim_capped(conn, capped, lease, room)
        else:
            period = timedelta(milliseconds=group["period_ms"])
            limited = RateLimited(pid, workflow, key, rates.RateLimit(group["cap"], period))
            claimed += await claim_rate_limited(conn, limited, lease, room)
    return claimed


@dataclass(frozen=True)
class Lease:
    """What a claim leases under: its holder, how long a lease lasts, the runs the holder is
    invoking now (never leased again while it does) and whether lapsed leases may be taken
    over (not just after the database was away)."""

    owner: str
    seconds: float
    holding: Sequence[uuid.UUID] = ()
    takeovers: bool = True


@dataclass(frozen=True)
class RateLimited:
    """The runs one rate limit counts: a workflow's, or those of one value of its rate limit
    key (None: the field is missing, or the limit has no key)."""

    project_id: uuid.UUID
    workflow: str
    key: str | None
    rate: rates.RateLimit


async def claim_rate_limited(
    conn: Conn, limited: RateLimited, lease: Lease, limit: int
) -> list[Record]:
    """Lease up to ``limit`` of a rate-limited workflow's due runs that have not started yet (of
    one key value), higher priority first, as far as its window has room; the others come due
    when the window lets them start (:func:`stepline_server.engine.rates.start_times`), so no
    dispatcher looks at them before. The window is read and the leases taken under the limit's
    lock, so two orchestrators never both see the same room."""
    group = (limited.project_id, limited.workflow, limited.key)
    async with conn.transaction():
        await conn.execute(Q["lock_rate"], *group)
        period_ms = limited.rate.period.total_seconds() * 1000
        window = await conn.fetchrow(Q["rate_window"], *group, period_ms)
        assert window is not None
        now = window["now"]
        times = rates.start_times(limited.rate, window["starts"], now, window["waiting"])
        take = min(limit, rates.room(times, now))
        how = (lease.owner, lease.seconds, list(lease.holding), lease.takeovers)
        claimed = (
            list(await conn.fetch(Q["claim_rate_limited"], *group, take, *how)) if take > 0 else []
        )
        later = times[len(claimed) :]
        if any(t > now for t in later):
            await conn.execute(Q["defer_rate_limited"], *group, later)
        return claimed


@dataclass(frozen=True)
class Capped:
    """The runs one concurrency cap counts: a workflow's, or those of one value of its
    concurrency key (None: the field is missing, or the workflow has no key)."""

    project_id: uuid.UUID
    workflow: str
    key: str | None
    cap: int


async def claim_capped(conn: Conn, capped: Capped, lease: Lease, limit: int) -> list[Record]:
    """Lease up to ``limit`` of a capped workflow's due or held runs (of one key value), oldest
    first, as far as its cap has room; hold its other due runs when the cap is full. The count
    and the leases are taken under the cap's lock, so two orchestrators never both see the same
    room."""
    async with conn.transaction():
        await conn.execute(Q["lock_workflow"], capped.project_id, capped.workflow, capped.key)
        args = (capped.workflow, capped.cap, lease.owner, lease.seconds, limit, capped.key)
        return list(
            await conn.fetch(
                Q["claim_capped"], capped.project_id, *args, lease.takeovers,
                list(lease.holding),
            )
        )  # fmt: skip


async def release_held(conn: Conn, capped: Capped | None = None) -> int:
    """Let held runs go as far as their caps have room (only ``capped``'s, when given), each
    cap under its lock; wake the dispatchers."""
    todo = (
        [capped]
        if capped
        else [
            Capped(r["project_id"], r["workflow"], r["concurrency_key"], r["cap"])
            for r in await conn.fetch(Q["held_workflows"])
        ]
    )
    released = 0
    for c in todo:
        async with conn.transaction():
            await conn.execute(Q["lock_workflow"], c.project_id, c.workflow, c.key)
            released += len(
                await conn.fetch(Q["release_held"], c.project_id, c.workflow, c.cap, c.key)
            )
    if released:
        await conn.execute(Q["notify_wake"])
    return released


async def next_due_in(conn: Conn, *, takeovers: bool = True) -> float | None:
    """Seconds until the next run comes due (negative when overdue), None when none will;
    without ``takeovers``, expired leases are not counted as due."""
    value = await conn.fetchval(Q["next_due_in"], takeovers)
    return float(value) if value is not None else None


async def backlog(conn: Conn) -> tuple[int, float]:
    """Runs due now and not yet invoked, and how many seconds the oldest has been due."""
    row = await conn.fetchrow(Q["due_backlog"])
    assert row is not None
    return int(row["n"]), float(row["oldest_s"])


async def heartbeat(
    conn: Conn, leases: list[tuple[uuid.UUID, str]], lease_seconds: float
) -> dict[uuid.UUID, bool]:
    """Extend the leases of invocations still in flight; answers each run whose lease held,
    with whether its cancellation was requested."""
    if not leases:
        return {}
    held = [{"id": str(run_id), "token": token} for run_id, token in leases]
    rows = await conn.fetch(Q["heartbeat"], held, lease_seconds)
    return {row["id"]: row["cancel_requested"] for row in rows}


async def begin_invocations(
    conn: Conn, starts: list[Begin], lead: float = 0.0, inline_max: int = INLINE_RESULT_BYTES
) -> dict[uuid.UUID, Begun]:
    """Begin the invocations of runs just claimed, each only while its claim still holds the
    run: settle the timers and timeouts due within ``lead`` seconds (as of their due times) and
    record the invocation starting. Answers what to send each run begun (a run missing from the
    answer was not begun: its lease is gone): its steps, all of them or only what changed since
    the history its last invocation was sent (see :class:`Begun`). A result over ``inline_max``
    bytes is not read: its row has ``output`` None beside ``output_bytes``."""
    if not starts:
        return {}
    begun = [
        {
            "run_id": str(b.run_id),
            "token": b.token,
            "invocation_id": str(b.invocation_id),
            "attempt": b.attempt,
            "deltas": b.deltas,
        }
        for b in starts
    ]
    answer: dict[uuid.UUID, Begun] = {}
    for row in await conn.fetch(Q["begin_invocations"], begun, lead, inline_max):
        run = answer.get(row["run_id"])
        if run is None:
            run = answer[row["run_id"]] = Begun(
                steps=[],
                wait_s=row["wait_s"],
                history_base=row["history_base"],
                history_steps=row["history_steps"],
                history_bytes=row["history_bytes"],
            )
        if row["name"] is not None:
            run.steps.append(row)
    return answer


@dataclass
class Begun:
    """What an invocation begun sends the app. ``steps``: rows in recorded order, every step
    when ``history_base`` is None, else only those that changed since the history invocation
    ``history_base`` was sent (the app keeps that one and lays these over it). ``wait_s``: how
    many seconds the app must not be called yet (until the last timer settled is due). The
    whole history holds ``history_steps`` steps and ``history_bytes`` bytes of results."""

    steps: list[Record]
    wait_s: float
    history_base: uuid.UUID | None
    history_steps: int
    history_bytes: int


@dataclass(frozen=True)
class Begin:
    """An invocation to begin: the run, the lease token its claim holds, and its numbers."""

    run_id: uuid.UUID
    token: str
    invocation_id: uuid.UUID
    attempt: int
    deltas: bool = True  # False: whoever gets it may not read history deltas (whole history)


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
    requests, changes, events, callbacks, lines = [], [], [], [], []
    for item in items:
        run = str(item.run_id)
        run_events = [*item.plan.events, *item.extra_events]
        requests.append(
            {
                "run_id": run,
                "token": item.token,
                "invocation_id": str(item.invocation_id),
                "n_events": len(run_events),
                "seq": item.seq,
                "digest": item.digest,
                "logs_dropped": item.plan.logs_dropped,
            }
        )
        changes += [c.row() | {"run_id": run, "ord": n} for n, c in enumerate(item.plan.changes, 1)]
        events += [e | {"run_id": run, "ord": n} for n, e in enumerate(run_events, 1)]
        callbacks += [
            {"run_id": run, "id": cid, "step_name": name, "timeout_ms": timeout}
            for cid, name, timeout in item.plan.callbacks
        ]
        lines += [line | {"run_id": run} for line in item.plan.logs]
    rows = await conn.fetch(
        Q["progress"],
        requests,
        changes,
        events,
        callbacks,
        lines,
        run_logs.MAX_LINES,
        run_logs.MAX_BYTES,
    )
    return {row["id"]: row for row in rows}


async def _apply(conn: Conn, item: Progress) -> Record | None:
    plan, run_id = item.plan, item.run_id
    since = None
    if plan.event_waits:
        run = await conn.fetchrow(Q["progress_at"], run_id)
        if run is None:
            return None
        since = run["progress_at"]
        # Waits and events of one name are recorded one at a time (see send_event), in name
        # order so that two plans never wait for each other's locks.
        for name in sorted({wait.event_name or "" for wait in plan.event_waits}):
            await lock_event_name(conn, run["project_id"], name)
    row = (await apply_batch(conn, [item])).get(run_id)
    if row is None:
        return None
    project_id = row["project_id"]
    for child in plan.children:
        await _start_child(
            conn, project_id, run_id, child.id, child.step_name, child.workflow, child.input
        )
    if plan.event_waits and since is not None:
        await _take_recent_events(conn, project_id, run_id, plan, since)
    return row


async def lock_event_name(conn: Conn, project_id: uuid.UUID, name: str) -> None:
    """Hold the lock of event ``name`` of the project until the transaction ends: sending an
    event and recording a wait for it take it, so each sees what the other committed."""
    await conn.execute(Q["lock_event_name"], project_id, name)


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
                {"type": "event.received", "step_name": name, "data": data},
                {"type": "step.completed", "step_name": name, "data": {"kind": "event"}},
            ]
    if taken:
        await runs.append_events(conn, run_id, taken)
        await conn.execute(Q["wake"], run_id)


async def _start_child(
    conn: Conn,
    project_id: uuid.UUID,
    run_id: uuid.UUID,
    child_id: str,
    step_name: str,
    workflow: str,
    input: Any,
) -> None:
    cid = uuid.UUID(child_id)
    created = await conn.fetchval(
        Q["insert_child_run"], cid, project_id, workflow, input, run_id, step_name
    )
    if created is not None:
        await runs.append_events(
            conn,
            cid,
            [{"type": "run.started", "data": {"trigger": "parent", "parentRunId": str(run_id)}}],
        )
        await conn.execute(Q["notify_wake"])
        return
    existing = await conn.fetchrow(Q["lock_run"], project_id, cid)
    if existing is None:
        message = f"workflow {workflow!r} is not registered; sync the app that hosts it"
        await _fail_invoke_step(conn, run_id, step_name, "workflow_not_found", message)
    elif existing["status"] in rules.RETRYABLE:
        # A retry runs the parent's step again: the child that did not complete runs again too,
        # unless another run holds its singleton key: then the parent's step fails, saying so.
        try:
            async with conn.transaction():
                await restart(conn, cid, None, None)
        except (rules.RuleError, UniqueViolationError) as exc:
            await _fail_invoke_step(conn, run_id, step_name, "singleton_active", str(exc))
    elif existing["status"] in rules.ENDED:
        # The child already completed (a retry from an earlier step): it started exactly once.
        await resolve_child(conn, existing)


async def _fail_invoke_step(
    conn: Conn, run_id: uuid.UUID, step_name: str, code: str, message: str
) -> None:
    """The parent's invoke step fails: its child cannot run (the history says why)."""
    error = {"type": "ChildWorkflowFailed", "code": code, "message": message}
    await conn.execute(Q["fail_step"], run_id, step_name, error)
    event = {
        "type": "step.failed",
        "step_name": step_name,
        "data": {"kind": "invoke", "error": error},
    }
    await runs.append_events(conn, run_id, [event])


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
    ended holds its singleton key (a unique index backs this: two retries at once cannot both
    pass)."""
    holder = await conn.fetchval(Q["singleton_holder"], run_id)
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
    events = [{"type": "run.retried", "data": data}, {"type": "run.started", "data": started}]
    await runs.append_events(conn, run_id, events)
    await conn.execute(Q["notify_wake"])
    return row


async def resolve_child(conn: Conn, child: Record) -> None:
    """Hand an ended child's outcome to the parent's invoke step and wake the parent."""
    parent = child["parent_run_id"]
    if parent is None or child["parent_step"] is None:
        return
    status, output, error = rules.child_outcome(
        str(child["id"]), child["status"], child.get("output"), child.get("error")
    )
    name = await conn.fetchval(
        Q["resolve_child_step"], parent, child["parent_step"], status, output, error
    )
    if name is None:
        return
    data: dict[str, Any] = {"kind": "invoke", "childRunId": str(child["id"])}
    if error:
        data["error"] = error
    event = "step.completed" if status == "completed" else "step.failed"
    await runs.append_events(conn, parent, [{"type": event, "step_name": name, "data": data}])
    await wake(conn, parent)


async def wake(conn: Conn, run_id: uuid.UUID) -> None:
    """Make a run due now (or right after its active invocation) and wake the dispatchers."""
    await conn.execute(Q["wake"], run_id)
    await conn.execute(Q["notify_wake"])


@dataclass(frozen=True)
class Outcome:
    """How an invocation ended, as the run loop records it."""

    status: str  # completed, failed, cancelled, suspended, stale, delivery_failed, continued
    output: Any = None  # continued: the next generation's input
    error: dict[str, Any] | None = None
    http_status: int | None = None
    duration_ms: int | None = None
    deployment_id: str | None = None
    retry_delay_ms: int | None = None  # delivery_failed: invoke again after this delay
    reason: str | None = None  # why the invocation failed, for the history
    request: str | None = None  # what was sent: "POST <url> (<n> bytes)", "poll by <worker>"
    # The answer came from an SDK that reads history deltas (it declared protocol 3 or newer):
    # the run's next invocation may carry only what changed since this one.
    reads_deltas: bool = False


def ended_event(outcome: Outcome) -> dict[str, Any]:
    """The ``invocation.ended`` event an outcome appends, with its status and duration."""
    data: dict[str, Any] = {"outcome": outcome.status}
    if outcome.reason:
        data["error"] = outcome.reason
    if outcome.request:
        data["request"] = outcome.request
    return {
        "type": "invocation.ended",
        "deployment_id": outcome.deployment_id,
        "http_status": outcome.http_status,
        "duration_ms": outcome.duration_ms,
        "data": data,
    }


async def record_outcomes(conn: Conn, items: list[Progress]) -> set[uuid.UUID]:
    """After the invocations' last updates, in their transaction: end each run, suspend it, or
    schedule the invocation's retry, as its outcome says; the runs recorded. A run missing had
    lost its lease (the next invocation replays what was committed, so nothing is lost)."""
    recorded: set[uuid.UUID] = set()
    ends: list[End] = []
    suspended: list[Progress] = []
    for item in items:
        outcome = item.outcome
        assert outcome is not None
        if outcome.status in ("completed", "failed", "cancelled"):
            status = rules.RunStatus(outcome.status)
            ends.append(End(item.run_id, item.token, status, outcome.output, outcome.error))
        elif outcome.status == "suspended":
            suspended.append(item)
        elif outcome.status == "continued":
            if await history.next_generation(conn, item.run_id, item.token, outcome.output):
                recorded.add(item.run_id)
        elif outcome.status == "delivery_failed":
            delay = outcome.retry_delay_ms or 0
            if await conn.fetchval(Q["invoke_failed"], item.run_id, item.token, delay):
                recorded.add(item.run_id)
    if suspended:
        leases = [
            {
                "id": str(i.run_id),
                "token": i.token,
                "acked": i.outcome is not None and i.outcome.reads_deltas,
            }
            for i in suspended
        ]
        rows = await conn.fetch(Q["suspend_runs"], leases)
        recorded |= {row["id"] for row in rows}
    if ends:
        recorded |= await end_runs(conn, ends)
    return recorded


@dataclass(frozen=True)
class End:
    """A run to end: by the invocation holding ``token``, or by anyone when it is None."""

    run_id: uuid.UUID
    token: str | None
    status: rules.RunStatus
    output: Any = None
    error: dict[str, Any] | None = None
    by: str | None = None  # who asked, in the end event's data (e.g. a bulk operation)


def _end_data(e: End) -> dict[str, Any] | None:
    data: dict[str, Any] = {}
    if e.error:
        data["error"] = e.error
    if e.by:
        data["by"] = e.by
    return data or None


async def end_runs(conn: Conn, ends: list[End]) -> set[uuid.UUID]:
    """End runs in one statement: close their open steps, cancel their children, tell their
    parents; the runs ended. In a transaction."""
    rows = await conn.fetch(
        Q["end_runs"],
        [
            {
                "id": str(e.run_id),
                "token": e.token,
                "status": e.status.value,
                "output": e.output,
                "error": e.error,
                "event": rules.END_EVENT[e.status],
                "data": _end_data(e),
            }
            for e in ends
        ],
    )
    for row in rows:
        run_id = row["id"]
        if row["has_children"]:
            for child in await conn.fetch(Q["children_of"], run_id):
                await cancel_tree(conn, child["id"])
        if row["parent_run_id"] is not None:
            child = await conn.fetchrow(Q["get_run"], row["project_id"], run_id)
            assert child is not None
            await resolve_child(conn, child)
        if row["schedule_id"] is not None:
            await schedules.on_run_ended(conn, row)
    return {row["id"] for row in rows}


async def end_run(
    conn: Conn,
    run_id: uuid.UUID,
    token: str | None,
    status: rules.RunStatus,
    output: Any,
    error: dict[str, Any] | None,
    by: str | None = None,
) -> bool:
    """End one run, as :func:`end_runs` does. In a transaction."""
    return run_id in await end_runs(conn, [End(run_id, token, status, output, error, by)])


async def cancel_tree(conn: Conn, run_id: uuid.UUID, by: str | None = None) -> None:
    """Ask a running run to cancel: its waits are cancelled, its children too, and it wakes;
    ``by`` names who asked in its ``run.cancelling`` event (``data.by``)."""
    if await conn.fetchval(Q["request_cancel"], run_id) is None:
        return
    cancelled = await conn.fetch(Q["cancel_waits"], run_id)
    callbacks = [r["callback_id"] for r in cancelled if r["callback_id"] is not None]
    if callbacks:
        await conn.execute(Q["cancel_callbacks"], callbacks)
    cancelling: dict[str, Any] = {"type": "run.cancelling"}
    if by is not None:
        cancelling["data"] = {"by": by}
    events: list[dict[str, Any]] = [cancelling] + [
        {"type": "step.cancelled", "step_name": r["name"], "data": {"kind": r["kind"]}}
        for r in cancelled
    ]
    await runs.append_events(conn, run_id, events)
    for r in cancelled:
        if r["child_run_id"] is not None:
            await cancel_tree(conn, r["child_run_id"])
    await wake(conn, run_id)
