"""The Python event types mirror the database's enum of them, value for value and in order."""

from __future__ import annotations

import asyncpg

from stepline_server.engine.events import EventType


async def test_event_type_mirrors_the_sql_enum(database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        values = await conn.fetchval("SELECT enum_range(NULL::run_event_type)::text[]")
        column = await conn.fetchval(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute"
            " WHERE attrelid = 'run_events'::regclass AND attname = 'type'"
        )
    finally:
        await conn.close()
    assert list(values) == [t.value for t in EventType]
    assert column == "run_event_type"
