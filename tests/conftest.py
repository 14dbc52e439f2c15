"""Shared fixtures: a PostgreSQL server, a migrated template database, a fresh database per test.

The server is ``STEPLINE_TEST_ADMIN_URL`` when set, else the machine's PostgreSQL on
127.0.0.1:5432 when it answers, else an embedded one started for the session. Database
administration runs on a private event loop in a background thread, so these fixtures work the
same for sync and async tests, whatever loop scope a test uses.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from stepline_server.store import migrate
from stepline_server.store.embedded import EmbeddedPostgres

T = TypeVar("T")

MACHINE_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


class AdminLoop:
    """An event loop in a daemon thread, for the fixtures' own database work."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


def database_dsn(dsn: str, database: str) -> str:
    """``dsn`` pointed at another database on the same server."""
    return urlunsplit(urlsplit(dsn)._replace(path=f"/{database}"))


async def _reachable(dsn: str) -> bool:
    try:
        conn = await asyncpg.connect(dsn, timeout=2)
    except (TimeoutError, OSError, asyncpg.PostgresError):
        return False
    await conn.close()
    return True


async def _execute(dsn: str, sql: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def _create_template(admin_dsn: str, name: str) -> None:
    await _execute(admin_dsn, f'CREATE DATABASE "{name}"')
    conn = await asyncpg.connect(database_dsn(admin_dsn, name))
    try:
        await migrate.apply_migrations(conn)
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def admin_loop() -> Iterator[AdminLoop]:
    """The background loop the database fixtures run on."""
    loop = AdminLoop()
    yield loop
    loop.close()


@pytest.fixture(scope="session")
def admin_dsn(admin_loop: AdminLoop) -> Iterator[str]:
    """A superuser DSN for a PostgreSQL server that tests may create databases on."""
    configured = os.environ.get("STEPLINE_TEST_ADMIN_URL")
    if configured:
        yield configured
        return
    if admin_loop.run(_reachable(MACHINE_ADMIN_URL)):
        yield MACHINE_ADMIN_URL
        return
    # mkdtemp makes a private (0700) folder; PostgreSQL's own user must traverse it as root.
    tmp = Path(tempfile.mkdtemp(prefix="stepline-test-pg-"))
    tmp.chmod(0o755)
    server = EmbeddedPostgres(tmp / "data")
    try:
        yield server.start()
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def template_database(admin_loop: AdminLoop, admin_dsn: str) -> Iterator[str]:
    """The name of a database with all migrations applied, copied for each test."""
    name = f"stepline_tmpl_{uuid.uuid4().hex[:12]}"
    try:
        admin_loop.run(_create_template(admin_dsn, name))
        yield name
    finally:
        admin_loop.run(_execute(admin_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def database_url(admin_loop: AdminLoop, admin_dsn: str, template_database: str) -> Iterator[str]:
    """The DSN of a fresh, migrated database of the test's own, dropped afterwards."""
    name = f"stepline_test_{uuid.uuid4().hex[:12]}"
    admin_loop.run(_execute(admin_dsn, f'CREATE DATABASE "{name}" TEMPLATE "{template_database}"'))
    try:
        yield database_dsn(admin_dsn, name)
    finally:
        admin_loop.run(_execute(admin_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
