"""Leasing one run at once, outside the claim loops: a run just started or just woken by a
callback goes to the orchestrator that handled the request, through the one lease transition
(``lease_runs`` in the database: every claim calls it, so its fence and pausing hold here too).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from stepline_server.engine.transitions import Claim
from stepline_server.store import claims
from stepline_server.store.claims import Lease
from stepline_server.store.db import Conn, Q

__all__ = ["Lease", "Taken", "take_now"]


@dataclass(frozen=True)
class Taken:
    """A run leased at once: its claim (the shape every lease answers) and its invocation,
    begun (None: its lease went at once, past its deadline the run is to be ended)."""

    claim: Claim
    begun: claims.Begun | None


async def take_now(conn: Conn, run_id: uuid.UUID, lease: Lease) -> Taken | None:
    """Lease run ``run_id`` under ``lease`` and begin its invocation when
    nothing gates it (a pull app's run, a capped or rate-limited one wait for their claims);
    None when it was not leased. In the caller's transaction (the one that started or woke the
    run, so one commit does both)."""
    row = await conn.fetchrow(
        Q["lease_now"], run_id, lease.owner, lease.seconds, list(lease.holding),
        lease.takeovers,
    )  # fmt: skip
    if row is None:
        return None
    claim = Claim.of(row)
    if claim.past_deadline:
        return Taken(claim, None)
    start = claims.Begin(
        claim.id, claim.lease_token, claim.invocation_id, claim.invoke_attempts + 1
    )
    begun = await claims.begin_invocations(conn, [start])
    return Taken(claim, begun.get(claim.id))
