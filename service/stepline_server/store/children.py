"""Child runs: starting one for a parent's invoke step, handing its outcome to the parent, and
cancelling a run with its children."""

from __future__ import annotations

import uuid
from typing import Any

from asyncpg import UniqueViolationError

from stepline_server.engine import runs as rules
from stepline_server.engine.events import EventType
from stepline_server.store import runs
from stepline_server.store.db import Conn, Q, Record


async def start_child(
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
            [
                {
                    "type": EventType.RUN_STARTED,
                    "data": {"trigger": "parent", "parentRunId": str(run_id)},
                }
            ],
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
                await runs.restart(conn, cid, None, None)
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
        "type": EventType.STEP_FAILED,
        "step_name": step_name,
        "data": {"kind": "invoke", "error": error},
    }
    await runs.append_events(conn, run_id, [event])


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
    event = EventType.STEP_COMPLETED if status == "completed" else EventType.STEP_FAILED
    # The child's end wakes its parent: the wake transition of the parent's run.
    await runs.wake(conn, parent, [{"type": event, "step_name": name, "data": data}])


async def cancel_tree(conn: Conn, run_id: uuid.UUID, by: str | None = None) -> None:
    """Ask a running run to cancel: its waits are cancelled, its children too, and it wakes;
    ``by`` names who asked in its ``run.cancelling`` event (``data.by``)."""
    if not await conn.fetchval(Q["request_cancel"], run_id):
        return
    cancelled = await conn.fetch(Q["cancel_waits"], run_id)
    callbacks = [r["callback_id"] for r in cancelled if r["callback_id"] is not None]
    if callbacks:
        await conn.execute(Q["cancel_callbacks"], callbacks)
    cancelling: dict[str, Any] = {"type": EventType.RUN_CANCELLING}
    if by is not None:
        cancelling["data"] = {"by": by}
    events: list[dict[str, Any]] = [cancelling] + [
        {"type": EventType.STEP_CANCELLED, "step_name": r["name"], "data": {"kind": r["kind"]}}
        for r in cancelled
    ]
    await runs.wake(conn, run_id, events, notify=False)
    for r in cancelled:
        if r["child_run_id"] is not None:
            await cancel_tree(conn, r["child_run_id"])
    await conn.execute(Q["notify_wake"])
