"""Published state: the current value of each key a run set with ``ctx.set_state``."""

from __future__ import annotations

import uuid
from typing import Any

from stepline_server.store.db import Conn, Q, Record


async def keys_locked(conn: Conn, run_id: uuid.UUID) -> set[str]:
    """The run's state keys, its row locked until the transaction ends."""
    return {row["key"] for row in await conn.fetch(Q["state_keys_locked"], run_id)}


async def record(conn: Conn, run_id: uuid.UUID, sets: list[tuple[str, str]]) -> list[str]:
    """Keep the values of the state steps ``sets`` ((key, step name), in order) written by this
    transaction as the keys' current values and wake their long polls; the keys set."""
    last = {key: step for key, step in sets}  # the last set of a key wins
    items = [{"key": key, "step": step} for key, step in last.items()]
    keys = [row[0] for row in await conn.fetch(Q["state_record"], run_id, items)]
    if keys:
        await conn.execute(Q["notify_state"], str(run_id))
    return keys


async def of_run(conn: Conn, project_id: uuid.UUID, run_id: uuid.UUID) -> list[Record]:
    """The run's current state (key, value, updated_at), in key order."""
    return list(await conn.fetch(Q["state_of_run"], run_id, project_id))


async def value(conn: Conn, project_id: uuid.UUID, run_id: uuid.UUID, key: str) -> Record | None:
    """One key's current value (key, value, updated_at), or None."""
    row: Record | None = await conn.fetchrow(Q["state_value"], run_id, project_id, key)
    return row


def as_dict(rows: list[Record]) -> dict[str, Any]:
    """State rows as ``{key: value}``."""
    return {row["key"]: row["value"] for row in rows}
