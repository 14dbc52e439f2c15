"""The way-forward check: a run not ended without a live lease, a due time or an open wait is
made due again (a safety net: every transition is meant to leave one)."""

from __future__ import annotations

from stepline_server.store import alerts, db
from stepline_server.store.db import Conn, Record


async def repair_stuck(conn: Conn, limit: int = 500) -> list[Record]:
    """Make due up to ``limit`` runs that have no way forward, with a ``run.stuck``
    notification for each alert listening (in the same transaction: a crash loses neither);
    the runs repaired (id, project, workflow)."""
    async with conn.transaction():
        repaired = list(await conn.fetch(db.query(conn, "repair_stuck_runs"), limit))
        for row in repaired:
            await alerts.record_run_stuck(conn, row["project_id"], row["id"])
    return repaired
