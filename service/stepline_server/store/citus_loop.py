"""The run loop's statements on a Citus coordinator: the claims per shard, the group statements
one run at a time (``docs/scaling.md``, "Claims without locks across shards").

On plain PostgreSQL the store runs its statements as they are (``claims.sql``,
``progress.sql``, ``outcomes.sql``, ``leases.sql``); where Citus refuses one, the store's
function asks :func:`stepline_server.store.db.on_citus` and calls the form here instead:

* the due runs are found across the shards without locks, then claimed on each shard that
  holds one, by a function delegated to the shard (``citus_claim_on_shard``, called with that
  run's id), which locks and leases on the shard's own table;
* a run is leased by ``citus_lease_run`` (lease_runs's rule on the run's shard, the one lease
  rule there): a run leased at once, and each candidate of the gated claims and pull polls
  (read across the shards without locks, under the gate's lock where there is one);
* the group statements (heartbeat, begin, progress, suspend, end), one statement over many runs
  on one PostgreSQL (runs locked in id order, then moved), are here one delegated transition
  call per run, in id order, in one transaction: each call runs on its run's worker, so its
  locks and writes stay on one shard;
* a run's end is told to the listeners (``stepline_ended``) from this session: ``run_end``'s
  own notification is sent on the worker, where no orchestrator listens.

Each function answers what its plain-PostgreSQL counterpart answers, in the same shape.
"""

from __future__ import annotations

import uuid
from typing import Any, NamedTuple

from stepline_server.store.db import Conn, Q, Record

CITUS_FORMS: dict[str, tuple[str, ...]] = {
    "claim_due": ("citus_due_candidates", "citus_claim_on_shard"),
    "lease_begin_now": ("citus_lease_run", "citus_run_invocations", "citus_begin"),
    "claim_pull": ("citus_pull_candidates", "citus_lease_run"),
    "claim_rate_limited": ("citus_rate_limited_candidates", "citus_lease_run"),
    "claim_capped": ("citus_capped_candidates", "citus_lease_run"),
    "heartbeat": ("citus_run_projects", "citus_keep_lease", "citus_keep_leases"),
    "begin_invocations": ("citus_run_invocations", "citus_begin"),
    "progress": ("citus_run_projects", "citus_progress"),
    "suspend_runs": ("citus_run_projects", "citus_suspend"),
    "end_runs": ("citus_run_projects", "citus_end", "citus_after_end"),
}
"""The store's statements never run on Citus, each with the statements run there instead
(``tests.citus.statements`` probes these in their place)."""


async def claim_due(
    conn: Conn,
    limit: int,
    owner: str,
    seconds: float,
    lead: float,
    takeovers: bool,
    holding: list[uuid.UUID],
) -> list[Record]:
    """``claim_due`` on Citus: up to ``limit`` due runs. The due runs are found across the
    shards first, without locks (``citus_due_candidates``); then each shard holding one is
    claimed on (``citus_claim_on_shard``, called with one of its runs' ids) in the candidates'
    order, highest priority and longest due first, for as many runs as it holds candidates in
    a row in that order (its due runs in its own order), until the claim is full. A shard with
    nothing due is never called, so a cycle costs one statement plus about one call per shard
    with work, however many shards there are. Answered higher priority first, then the longest
    due."""
    candidates = await conn.fetch(Q["citus_due_candidates"], lead, limit, holding, takeovers)
    ordered = sorted(candidates, key=lambda c: (-c["priority"], c["ready_at"], c["id"]))
    # Consecutive candidates of one shard are claimed by one call, so runs go in the order
    # above across shards (a shard's later runs wait for the other shards' earlier ones).
    turns: list[list[Record]] = []
    for c in ordered:
        if turns and turns[-1][0]["shard"] == c["shard"]:
            turns[-1].append(c)
        else:
            turns.append([c])
    claimed: list[Record] = []
    for turn in turns:
        room = min(limit - len(claimed), len(turn))
        if room <= 0:
            break
        claimed += await conn.fetch(
            Q["citus_claim_on_shard"], turn[0]["id"], room, owner, seconds, lead, takeovers,
            holding,
        )  # fmt: skip
    claimed.sort(key=lambda r: (-r["priority"], r["due_in"]))
    return claimed


async def lease_run(
    conn: Conn, run_id: uuid.UUID, owner: str, seconds: float, holding: list[uuid.UUID],
    takeovers: bool,
) -> Record | None:  # fmt: skip
    """``lease_begin_now``'s lease on Citus: run ``run_id`` leased when nothing gates it."""
    return await conn.fetchrow(
        Q["citus_lease_run"], run_id, owner, seconds, holding, takeovers, True
    )


async def claim_pull(
    conn: Conn, limit: int, app_id: uuid.UUID, deployment: uuid.UUID | None, owner: str,
    seconds: float, takeovers: bool,
) -> list[Record]:  # fmt: skip
    """``claim_pull`` on Citus: up to ``limit`` due runs of pull app ``app_id`` on
    ``deployment``, read across the shards without locks (``citus_pull_candidates``), each
    then leased on its shard (:func:`lease_runs`); higher priority first, then the longest
    due."""
    due = await conn.fetch(Q["citus_pull_candidates"], limit, app_id, deployment, takeovers)
    claimed = await lease_runs(conn, [r["id"] for r in due], owner, seconds, [], takeovers)
    claimed.sort(key=lambda r: (-r["priority"], r["due_in"]))
    return claimed


async def lease_runs(
    conn: Conn, run_ids: list[uuid.UUID], owner: str, seconds: float,
    holding: list[uuid.UUID], takeovers: bool,
) -> list[Record]:  # fmt: skip
    """``lease_runs`` on Citus: each of ``run_ids`` leased by ``citus_lease_run`` on its shard,
    in the order given, in one transaction (the caller's, when it is in one); a run another
    transaction holds locked, or no longer leasable, is passed over."""
    leased: list[Record] = []
    async with conn.transaction():
        for run_id in run_ids:
            leased += await conn.fetch(
                Q["citus_lease_run"], run_id, owner, seconds, holding, takeovers, False
            )
    return leased


class Invocation(NamedTuple):
    """What ``run_begin`` takes of a run besides its lease."""

    project_id: uuid.UUID
    deployment_id: str | None  # the deployment its invocation goes to


async def invocations(conn: Conn, run_ids: list[uuid.UUID]) -> dict[uuid.UUID, Invocation]:
    """The project of each of ``run_ids`` that exists and the deployment its invocation goes
    to (one read, no lock)."""
    rows = await conn.fetch(Q["citus_run_invocations"], run_ids)
    return {r["id"]: Invocation(r["project_id"], r["invoked_deployment_id"]) for r in rows}


async def begin(
    conn: Conn, run_id: uuid.UUID, of: Invocation, token: str | None,
    invocation_id: uuid.UUID, attempt: int, deltas: bool, lead: float, inline_max: int,
) -> list[Record]:  # fmt: skip
    """One run's begin (``run_begin``, delegated): its rows, as ``begin_invocations``'s."""
    return list(
        await conn.fetch(
            Q["citus_begin"], run_id, of.project_id, token, invocation_id, attempt, deltas,
            lead, inline_max, of.deployment_id,
        )
    )  # fmt: skip


async def projects(conn: Conn, run_ids: list[uuid.UUID]) -> dict[uuid.UUID, uuid.UUID]:
    """The project of each of ``run_ids`` that exists (one read, no lock)."""
    return {r["id"]: r["project_id"] for r in await conn.fetch(Q["citus_run_projects"], run_ids)}


async def heartbeat(
    conn: Conn, leases: list[tuple[uuid.UUID, str]], lease_seconds: float
) -> dict[uuid.UUID, bool]:
    """``heartbeat`` on Citus: each lease kept by ``run_keep_lease`` on its run's shard, the
    runs' projects read first; one lease delegated to its worker, several by the procedure
    ``citus_keep_leases`` (one call, in rounds: the runs whose rows are free now in one
    transaction, those whose rows are held in a later round). (Kept in one transaction, call
    after call, beats of 60 leases took up to 4 s in the chaos run: each run's row stayed
    locked until every lease was kept, beats and progress commits waited for each other, and
    a 5 s lease lapsed under its live invocation.)"""
    of = await projects(conn, [run_id for run_id, _ in leases])
    kept = [(run_id, token) for run_id, token in leases if run_id in of]
    if len(kept) == 1:
        [(run_id, token)] = kept
        cancel = await conn.fetchval(
            Q["citus_keep_lease"], run_id, of[run_id], token, lease_seconds
        )
        return {} if cancel is None else {run_id: cancel}
    items = [
        {"id": str(run_id), "project_id": str(of[run_id]), "token": token} for run_id, token in kept
    ]
    answer = await conn.fetchval(Q["citus_keep_leases"], items, lease_seconds) or {}
    return {uuid.UUID(run_id): bool(cancel) for run_id, cancel in answer.items()}


async def begin_invocations(
    conn: Conn, starts: list[dict[str, Any]], lead: float, inline_max: int
) -> list[tuple[uuid.UUID, list[Record]]]:
    """``begin_invocations`` on Citus: each run begun by its own call (``run_begin``), in run id
    order, in one transaction; each begun run with its rows."""
    of = await invocations(conn, [uuid.UUID(s["run_id"]) for s in starts])
    begun: list[tuple[uuid.UUID, list[Record]]] = []
    async with conn.transaction():
        for s in sorted(starts, key=lambda s: s["run_id"]):
            run_id = uuid.UUID(s["run_id"])
            if run_id not in of:
                continue
            rows = await begin(
                conn, run_id, of[run_id], s["token"], uuid.UUID(s["invocation_id"]),
                s["attempt"], s["deltas"], lead, inline_max,
            )  # fmt: skip
            if rows:
                begun.append((run_id, rows))
    return begun


async def progress(
    conn: Conn,
    requests: list[dict[str, Any]],
    changes: list[dict[str, Any]],
    callbacks: list[dict[str, Any]],
    lines: list[dict[str, Any]],
    max_lines: int,
    max_bytes: int,
) -> list[Record]:
    """``progress`` on Citus: each run's progress committed by its own call (``run_progress``),
    in run id order, in one transaction; rows as ``progress`` answers them."""
    of = await projects(conn, [uuid.UUID(r["run_id"]) for r in requests])

    def of_run(items: list[dict[str, Any]], run: str) -> list[dict[str, Any]] | None:
        mine = [item for item in items if item["run_id"] == run]
        return mine or None

    answered: list[Record] = []
    async with conn.transaction():
        for r in sorted(requests, key=lambda r: r["run_id"]):
            run_id = uuid.UUID(r["run_id"])
            if run_id not in of:
                continue
            row = await conn.fetchrow(
                Q["citus_progress"], run_id, of[run_id], r["token"],
                uuid.UUID(r["invocation_id"]), r["events"], r["seq"], r["digest"],
                r["logs_dropped"], of_run(changes, r["run_id"]),
                of_run(callbacks, r["run_id"]), of_run(lines, r["run_id"]), max_lines,
                max_bytes,
            )  # fmt: skip
            if row is not None:
                answered.append(_Row(id=run_id, project_id=of[run_id], **dict(row)))
    return answered


async def suspend_runs(conn: Conn, leases: list[dict[str, Any]]) -> set[uuid.UUID]:
    """``suspend_runs`` on Citus: each run suspended by its own call (``run_suspend``), in run
    id order; the runs suspended."""
    of = await projects(conn, [uuid.UUID(x["id"]) for x in leases])
    suspended: set[uuid.UUID] = set()
    for x in sorted(leases, key=lambda x: x["id"]):
        run_id = uuid.UUID(x["id"])
        if run_id in of and await conn.fetchval(
            Q["citus_suspend"], run_id, of[run_id], x["token"], x["acked"]
        ):
            suspended.add(run_id)
    return suspended


async def end_runs(conn: Conn, ends: list[dict[str, Any]]) -> list[Record]:
    """``end_runs`` on Citus: each run ended by its own call (``run_end``), in run id order,
    then from this session whether it has children, its alerts and its end told to the
    listeners; rows as
    ``end_runs`` answers them."""
    of = await projects(conn, [uuid.UUID(e["id"]) for e in ends])
    ended: list[Record] = []
    for e in sorted(ends, key=lambda e: e["id"]):
        run_id = uuid.UUID(e["id"])
        if run_id not in of:
            continue
        row = await conn.fetchrow(
            Q["citus_end"], run_id, of[run_id], e["token"], e["status"], e["output"],
            e["error"], e["event"], e["data"],
        )  # fmt: skip
        if row is not None:
            after = await conn.fetchrow(
                Q["citus_after_end"], run_id, of[run_id], row["status"], e["error"]
            )
            has_children = after["has_children"]
            ended.append(
                _Row(id=run_id, project_id=of[run_id], has_children=has_children, **dict(row))
            )
    return ended


class _Row(dict[str, Any]):
    """A row put together here, read by key as a record is."""

    def __init__(self, **values: Any) -> None:
        super().__init__(values)
