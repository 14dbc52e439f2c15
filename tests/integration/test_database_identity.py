"""The database's identity, which a run's history snapshot is kept with: a snapshot taken under
another identity is not built on (the next invocation gets every step)."""

from __future__ import annotations

import asyncpg


async def test_the_identity_names_the_timeline(database_url: str) -> None:
    """A standby promoted keeps the cluster's system identifier but starts a new timeline:
    the identity ends with the timeline the primary writes on, so a snapshot taken before a
    promotion is never laid under the history after it."""
    conn = await asyncpg.connect(database_url)
    try:
        identity = await conn.fetchval("SELECT stepline_database_id()")
        system = await conn.fetchval("SELECT system_identifier::text FROM pg_control_system()")
        timeline = await conn.fetchval("SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)")
    finally:
        await conn.close()
    assert identity.startswith(f"{system}/")
    assert identity.endswith(f"/{timeline}")
    assert int(timeline, 16) >= 1
