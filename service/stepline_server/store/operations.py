"""Bulk operations in the store: matching runs, an operation and its fixed set of runs, the
batches its loop claims (``FOR UPDATE SKIP LOCKED``) and the outcomes they record."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from stepline_server.engine.bulk import Selection
from stepline_server.store.db import Conn, Q, Record


def _filter_args(s: Selection, app_id: uuid.UUID | None) -> tuple[Any, ...]:
    return (
        list(s.statuses),
        s.workflow,
        app_id,
        s.deployment_id,
        s.created_after,
        s.created_before,
        s.run_key,
        s.run_key_prefix,
        s.trigger,
        s.from_step,
        [uuid.UUID(i) for i in s.run_ids] if s.run_ids is not None else None,
    )


def _on(s: Selection) -> uuid.UUID | None:
    """The deployment the selection's runs are on, when it names one."""
    return uuid.UUID(s.on_deployment) if s.on_deployment is not None else None


async def match(
    conn: Conn, project_id: uuid.UUID, s: Selection, app_id: uuid.UUID | None, sample: int
) -> tuple[int, list[str]]:
    """How many runs the selection takes now, and the ids of the newest ``sample`` of them."""
    row = await conn.fetchrow(Q["match_runs"], project_id, *_filter_args(s, app_id), sample, _on(s))
    return int(row["matched"]), list(row["sample"])


async def create(
    conn: Conn,
    operation_id: uuid.UUID,
    project_id: uuid.UUID,
    action: str,
    filter: dict[str, Any],
    s: Selection,
    app_id: uuid.UUID | None,
    deployment: uuid.UUID | None = None,
) -> Record:
    """Create the operation (a move: to ``deployment``) and fix its set of runs, in one
    transaction; the operation."""
    async with conn.transaction():
        await conn.fetchrow(
            Q["insert_operation"], operation_id, project_id, action, filter, s.from_step, deployment
        )
        matched = await conn.fetchval(
            Q["fill_operation"], operation_id, *_filter_args(s, app_id), project_id, _on(s)
        )
        return await conn.fetchrow(Q["operation_filled"], operation_id, matched)


async def get(conn: Conn, project_id: uuid.UUID, operation_id: uuid.UUID) -> Record | None:
    return await conn.fetchrow(Q["get_operation"], project_id, operation_id)


async def page(
    conn: Conn,
    project_id: uuid.UUID,
    before: tuple[datetime, uuid.UUID] | None,
    limit: int,
) -> list[Record]:
    """Operations newest first, after the keyset cursor ``before``."""
    at, ident = before if before else (None, None)
    return list(await conn.fetch(Q["list_operations"], project_id, at, ident, limit))


async def errors(
    conn: Conn, project_id: uuid.UUID, operation_id: uuid.UUID, limit: int
) -> list[Record]:
    """The operation's first ``limit`` errors, in the order of its runs."""
    return list(await conn.fetch(Q["operation_errors"], operation_id, project_id, limit))


async def cancel(conn: Conn, project_id: uuid.UUID, operation_id: uuid.UUID) -> Record | None:
    """Stop a running operation; None when it is not running (or does not exist)."""
    return await conn.fetchrow(Q["cancel_operation"], project_id, operation_id)


async def claim(conn: Conn) -> Record | None:
    """The running operation whose turn it is (environments, then their operations, take
    turns) among those no one else works a batch of, locked, its turn taken. In a
    transaction."""
    return await conn.fetchrow(Q["claim_operation"])


@dataclass(frozen=True)
class Item:
    """One run of an operation: its place in the set and its id."""

    position: int
    run_id: uuid.UUID


async def claim_runs(conn: Conn, operation_id: uuid.UUID, limit: int) -> list[Item]:
    """The operation's next ``limit`` runs not acted on yet, locked. In a transaction."""
    rows = await conn.fetch(Q["claim_operation_runs"], operation_id, limit)
    return [Item(r["position"], r["run_id"]) for r in rows]


async def lock_run_status(conn: Conn, project_id: uuid.UUID, run_id: uuid.UUID) -> str | None:
    """The run's status, with the run locked; None when it is gone. In a transaction."""
    value = await conn.fetchval(Q["lock_operation_run"], project_id, run_id)
    return str(value) if value is not None else None


@dataclass(frozen=True)
class Done:
    """What became of one run of a batch."""

    position: int
    outcome: str
    error: dict[str, Any] | None = None


async def record(conn: Conn, operation_id: uuid.UUID, done: list[Done]) -> Record:
    """Record a batch's outcomes and the operation's counters (completed when no run is left).
    In the batch's transaction."""
    left = await conn.fetchval(Q["operation_runs_left"], operation_id, [d.position for d in done])
    items = [{"position": d.position, "outcome": d.outcome, "error": d.error} for d in done]
    n = await conn.fetchrow(Q["record_operation_runs"], operation_id, items)
    row = await conn.fetchrow(
        Q["count_operation_runs"],
        operation_id,
        n["succeeded"],
        n["failed"],
        n["skipped"],
        bool(left),
    )
    assert row is not None
    return row


@dataclass(frozen=True)
class Ahead:
    """An operation's runs still in the dispatcher: due and not yet taken, or being invoked."""

    waiting: int
    invoking: int


async def ahead(conn: Conn, operation_id: uuid.UUID, window: int) -> Ahead:
    """What the operation keeps in the dispatcher among its latest ``window`` runs done."""
    row = await conn.fetchrow(Q["operation_runs_ahead"], operation_id, window)
    return Ahead(int(row["waiting"]), int(row["invoking"]))


async def delete_old(conn: Conn, older_than_seconds: float, limit: int = 10) -> int:
    """Delete up to ``limit`` operations that ended more than ``older_than_seconds`` ago (with
    their lists of runs); how many."""
    status = await conn.execute(Q["delete_old_operations"], older_than_seconds, limit)
    return int(status.split()[-1])
