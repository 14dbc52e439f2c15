"""The orchestrators' beats: each says it is alive and since when it has reached the database,
so that any orchestrator can tell a pull lease its worker lost from one lost on our side."""

from __future__ import annotations

from stepline_server.store.db import Conn, Q


async def seen(conn: Conn, owner: str, serving_seconds: float) -> None:
    """Orchestrator ``owner`` beats: up and reaching the database for ``serving_seconds``."""
    await conn.execute(Q["orchestrator_seen"], owner, serving_seconds)


async def forget_stopped(conn: Conn) -> None:
    """Forget the orchestrators unseen for a day."""
    await conn.execute(Q["forget_orchestrators"])
