"""Recording how invocations ended: each run ends, suspends, starts its next generation or is
invoked again later, as its outcome's transition says (``engine.transitions``)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from stepline_server.engine import runs as rules
from stepline_server.engine import transitions
from stepline_server.store import children, citus_loop, history, schedules
from stepline_server.store.db import Conn, Q, on_citus


class Ended(Protocol):
    """An invocation that ended (``store.progress.Progress`` is one): its run, the lease token
    it held, and how it ended."""

    @property
    def run_id(self) -> uuid.UUID: ...
    @property
    def token(self) -> str: ...
    @property
    def outcome(self) -> transitions.Outcome | None: ...


async def record_outcomes(conn: Conn, items: list[Ended]) -> set[uuid.UUID]:
    """After the invocations' last updates, in their transaction: move each run by the
    transition its outcome maps to (``engine.transitions``): end it, suspend it, start its next
    generation or invoke it again later; the runs recorded. A run missing had lost its lease
    (the next invocation replays what was committed, so nothing is lost)."""
    recorded: set[uuid.UUID] = set()
    ends: list[End] = []
    suspended: list[Ended] = []
    for item in items:
        outcome = item.outcome
        assert outcome is not None
        match transitions.transition_of(outcome.status):
            case transitions.Transition.END:
                status = transitions.run_status_of(outcome.status)
                ends.append(End(item.run_id, item.token, status, outcome.output, outcome.error))
            case transitions.Transition.SUSPEND:
                suspended.append(item)
            case transitions.Transition.NEXT_GENERATION:
                if await history.next_generation(conn, item.run_id, item.token, outcome.output):
                    recorded.add(item.run_id)
            case transitions.Transition.RETRY_DELIVERY:
                delay = outcome.retry_delay_ms or 0
                if await conn.fetchval(Q["invoke_failed"], item.run_id, item.token, delay):
                    recorded.add(item.run_id)
            case transitions.Transition.NONE:
                pass
    if suspended:
        leases = [
            {
                "id": str(i.run_id),
                "token": i.token,
                "acked": i.outcome is not None and i.outcome.reads_deltas,
            }
            for i in suspended
        ]
        if on_citus(conn):
            recorded |= await citus_loop.suspend_runs(conn, leases)
        else:
            recorded |= {row["id"] for row in await conn.fetch(Q["suspend_runs"], leases)}
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
    batch = [
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
    ]
    if on_citus(conn):
        rows = await citus_loop.end_runs(conn, batch)
    else:
        rows = await conn.fetch(Q["end_runs"], batch)
    for row in rows:
        run_id = row["id"]
        if row["has_children"]:
            for child in await conn.fetch(Q["children_of"], run_id):
                await children.cancel_tree(conn, child["id"])
        if row["parent_run_id"] is not None:
            child = await conn.fetchrow(Q["get_run"], row["project_id"], run_id)
            assert child is not None
            await children.resolve_child(conn, child)
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
