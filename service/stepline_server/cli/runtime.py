"""What the server's commands share: the database they work on (``DATABASE_URL`` or an
embedded PostgreSQL) and how a command's coroutine is run (uvloop when installed)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from stepline_server.settings import Settings


@asynccontextmanager
async def database(settings: Settings) -> AsyncIterator[tuple[str, str]]:
    """``DATABASE_URL``, or an embedded PostgreSQL in the data folder for as long as needed
    (the one already running there if another command started it; it is stopped only when no
    other process uses it): yields the DSN and a line saying which it is."""
    if settings.database_url:
        yield settings.database_url, "DATABASE_URL"
        return
    from stepline_server.store.embedded import EmbeddedPostgres

    server = EmbeddedPostgres(settings.data_dir / "pg")
    dsn = await asyncio.to_thread(server.start)
    try:
        yield dsn, f"embedded PostgreSQL, data in {server.data_dir}"
    finally:
        await asyncio.to_thread(server.stop)


def run_async(coro: object) -> None:
    """Run ``coro`` to its end, on uvloop when it is installed."""
    try:
        import uvloop

        uvloop.run(coro)  # type: ignore[arg-type]
    except ImportError:
        asyncio.run(coro)  # type: ignore[arg-type]
