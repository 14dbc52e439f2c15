"""Leasing one run at once, outside the claim loops: a run just started or just woken by a
callback goes to the orchestrator that handled the request, through the one lease transition
(``lease_runs`` in the database: every claim calls it, so its fence and pausing hold here too),
and its invocation begins (``run_begin``) in the same statement: one round trip.

The dispatcher's and pull's claims keep leasing and beginning apart on purpose
(:func:`claims.begin_invocations`): the dispatcher's claim commits at once and what it claimed
begins in groups on another connection, with the timer lead, so a claim never waits on a begin;
a pull poll ends its runs past their deadline first and begins the rest as its worker reads
history (deltas or not).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from stepline.protocol import INLINE_RESULT_BYTES
from stepline_server.engine.transitions import Claim
from stepline_server.store import citus_loop, claims
from stepline_server.store.claims import Lease
from stepline_server.store.db import Conn, Q, on_citus

__all__ = ["Lease", "Taken", "take_now"]


@dataclass(frozen=True)
class Taken:
    """A run leased at once: its claim (the shape every lease answers) and its invocation,
    begun (None: its lease went at once, past its deadline the run is to be ended)."""

    claim: Claim
    begun: claims.Begun | None


async def take_now(
    conn: Conn, run_id: uuid.UUID, lease: Lease, inline_max: int = INLINE_RESULT_BYTES
) -> Taken | None:
    """Lease run ``run_id`` under ``lease`` and begin its invocation when
    nothing gates it (a pull app's run, a capped or rate-limited one wait for their claims);
    None when it was not leased. One statement (``lease_begin_now``), in the caller's
    transaction (the one that started or woke the run, so one commit does both). A result over
    ``inline_max`` bytes is not read (as :func:`claims.begin_invocations`)."""
    if on_citus(conn):
        return await _take_now_on_citus(conn, run_id, lease, inline_max)
    rows = await conn.fetch(
        Q["lease_begin_now"], run_id, lease.owner, lease.seconds, list(lease.holding),
        lease.takeovers, inline_max,
    )  # fmt: skip
    if not rows:
        return None
    first = rows[0]
    claim = Claim.of({**first, "status": first["run_status"]})
    if first["wait_s"] is None:  # past its deadline (run_begin always answers wait_s)
        return Taken(claim, None)
    begun = claims.Begun.of(first)
    begun.steps.extend(row for row in rows if row["name"] is not None)
    return Taken(claim, begun)


async def _take_now_on_citus(
    conn: Conn, run_id: uuid.UUID, lease: Lease, inline_max: int
) -> Taken | None:
    """:func:`take_now` on Citus: the lease on the run's shard (``citus_lease_run``), then its
    begin (``run_begin``, with the deployment its invocation goes to), both delegated to its
    worker: three statements."""
    leased = await citus_loop.lease_run(
        conn, run_id, lease.owner, lease.seconds, list(lease.holding), lease.takeovers
    )
    if leased is None:
        return None
    claim = Claim.of(leased)
    if leased["past_deadline"]:
        return Taken(claim, None)
    of = await citus_loop.invocations(conn, [run_id])
    if run_id not in of:
        return Taken(claim, None)
    rows = await citus_loop.begin(
        conn, run_id, of[run_id], leased["lease_token"], leased["invocation_id"],
        leased["invoke_attempts"] + 1, True, 0.0, inline_max,
    )  # fmt: skip
    if not rows:
        return Taken(claim, None)
    begun = claims.Begun.of(rows[0])
    begun.steps.extend(row for row in rows if row["name"] is not None)
    return Taken(claim, begun)
