"""Pull apps' runs: what a worker's poll claims, and the lease its answer is recorded under."""

from __future__ import annotations

import uuid

from stepline_server.store import citus_loop, db
from stepline_server.store.claims import Lease, PullScope, claim_gated
from stepline_server.store.db import Conn, Q, Record


async def claim(
    conn: Conn,
    app_id: uuid.UUID,
    owner: str,
    lease_seconds: float,
    limit: int,
    *,
    takeovers: bool = True,
    deployment: uuid.UUID | None = None,
) -> list[Record]:
    """Lease up to ``limit`` due runs of pull app ``app_id`` to ``owner`` for ``lease_seconds``
    (a poll), through the one lease transition as the dispatcher's claim does; runs of a capped
    or rate-limited workflow under its gate's lock (which counts the workflow's runs whatever
    their deployment). Without ``takeovers``, runs whose lease
    lapsed are left to their workers. Only runs on ``deployment`` (None: the app's current
    one)."""
    lease = Lease(owner, lease_seconds, (), takeovers)
    if db.on_citus(conn):
        claimed = await citus_loop.claim_pull(
            conn, limit, app_id, deployment, owner, lease_seconds, takeovers
        )
    else:
        claimed = list(
            await conn.fetch(
                Q["claim_pull"], limit, app_id, owner, lease_seconds, takeovers, deployment
            )
        )
    room = limit - len(claimed)
    if room > 0:
        groups = await conn.fetch(Q["due_gated_pull_groups"], app_id, deployment)
        scope = PullScope(app_id, deployment)
        claimed += await claim_gated(conn, groups, lease, room, scope=scope)
    return claimed


async def lost(conn: Conn, app_id: uuid.UUID, lease_seconds: float) -> list[Record]:
    """The lapsed leases of pull app ``app_id``'s runs that their workers lost: last kept and
    lapsed while the orchestrator that gave them (this one or another) was serving, as its
    beats say; each in the shape every lease answers."""
    return list(await conn.fetch(db.query(conn, "lost_pull_leases"), app_id, lease_seconds))


async def next_due_in(
    conn: Conn, app_id: uuid.UUID, lease_seconds: float, deployment: uuid.UUID | None = None
) -> float | None:
    """Seconds until a run of pull app ``app_id`` on ``deployment`` (None: the current one)
    comes due (negative: overdue); None: none."""
    value = await conn.fetchval(
        db.query(conn, "next_pull_due_in"), app_id, lease_seconds, deployment
    )
    return float(value) if value is not None else None


async def leased(conn: Conn, run_id: uuid.UUID, token: str) -> Record | None:
    """Run ``run_id`` of a pull app while lease ``token`` holds it, else None."""
    return await conn.fetchrow(db.query(conn, "pull_lease"), run_id, token)


async def polled(conn: Conn, app_id: uuid.UUID) -> None:
    """A worker of the app polled now."""
    await conn.execute(Q["app_polled"], app_id)
