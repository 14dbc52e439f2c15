"""The way-forward check: a run not ended without a live lease, a due time or an open wait is
made due again (a safety net: every transition is meant to leave one)."""

from __future__ import annotations

from stepline_server.store.db import Conn, Q, Record


async def repair_stuck(conn: Conn, limit: int = 500) -> list[Record]:
    """Make due up to ``limit`` runs that have no way forward; the runs repaired (id, project,
    workflow)."""
    return list(await conn.fetch(Q["repair_stuck_runs"], limit))
