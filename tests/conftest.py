"""Shared fixtures: a PostgreSQL server, a migrated template database, a fresh database per test.

The server is ``STEPLINE_TEST_ADMIN_URL`` when set, else the machine's PostgreSQL on
127.0.0.1:5432 when it answers, else an embedded one started for the session. With
``STEPLINE_TEST_CITUS`` naming the folder of a running local Citus cluster (``cluster.sh start``
of ``../shared/citus/``; ``tests/citus/run.sh`` makes one), the server is its coordinator, and
every test database is made on every node, with the workers added, the template laid out for
Citus by the migrations: a test's database is the template copied on each node at once (the
shards are copied with the metadata that places them). Database administration runs on a
private event loop in a background thread, so these fixtures work the same for sync and async
tests, whatever loop scope a test uses.
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


def citus_nodes(folder: str) -> list[str]:
    """The admin DSNs of a local Citus cluster's nodes (``cluster.sh``'s folder), coordinator
    first."""
    ports = Path(folder, "ports").read_text().split()
    return [f"postgresql://postgres@127.0.0.1:{port}/postgres" for port in ports]


async def _on_nodes(nodes: list[str], sql: str) -> None:
    await asyncio.gather(*(_execute(node, sql) for node in nodes))


async def _drop_everywhere(nodes: list[str], name: str) -> None:
    """Drop database ``name`` on every node: the coordinator first (its sessions ended), then
    each worker, with what two-phase commits the ended sessions left prepared there."""
    sql = f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'
    await _execute(nodes[0], sql)
    await asyncio.gather(*(_drop_on_worker(node, name, sql) for node in nodes[1:]))


async def _drop_on_worker(node: str, name: str, sql: str) -> None:
    admin = await asyncpg.connect(node)
    try:
        gids = [
            r["gid"]
            for r in await admin.fetch(
                "SELECT gid FROM pg_prepared_xacts WHERE database = $1", name
            )
        ]
    finally:
        await admin.close()
    if gids:
        conn = await asyncpg.connect(database_dsn(node, name))
        try:
            for gid in gids:
                await conn.execute(f"ROLLBACK PREPARED '{gid}'")
        finally:
            await conn.close()
    await _execute(node, sql)


async def _create_template(nodes: list[str], name: str) -> None:
    """Database ``name`` on every node, migrated on the first (with Citus: its coordinator)."""
    await _on_nodes(nodes, f'CREATE DATABASE "{name}"')
    if len(nodes) > 1:
        await _on_nodes([database_dsn(n, name) for n in nodes], "CREATE EXTENSION citus")
        coordinator = urlsplit(nodes[0])
        workers = [urlsplit(n) for n in nodes[1:]]
        await _execute(
            database_dsn(nodes[0], name),
            f"SELECT citus_set_coordinator_host('{coordinator.hostname}', {coordinator.port});"
            + "".join(f"SELECT citus_add_node('{w.hostname}', {w.port});" for w in workers),
        )
    conn = await asyncpg.connect(database_dsn(nodes[0], name))
    try:
        await migrate.apply_migrations(conn)
    finally:
        await conn.close()
    if len(nodes) > 1:
        # A template is copied only while no session is in it: Citus keeps some (its
        # maintenance daemon, connections between nodes) unless the database refuses them.
        await _on_nodes(
            nodes,
            f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false;'
            f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'",
        )


@pytest.fixture(scope="session")
def admin_loop() -> Iterator[AdminLoop]:
    """The background loop the database fixtures run on."""
    loop = AdminLoop()
    yield loop
    loop.close()


@pytest.fixture(scope="session")
def server_nodes(admin_dsn: str) -> list[str]:
    """The admin DSNs each test database is made on: the server's, or every Citus node's."""
    folder = os.environ.get("STEPLINE_TEST_CITUS")
    return citus_nodes(folder) if folder else [admin_dsn]


@pytest.fixture(scope="session")
def admin_dsn(admin_loop: AdminLoop) -> Iterator[str]:
    """A superuser DSN for a PostgreSQL server that tests may create databases on."""
    citus = os.environ.get("STEPLINE_TEST_CITUS")
    if citus:
        yield citus_nodes(citus)[0]
        return
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
def template_database(admin_loop: AdminLoop, server_nodes: list[str]) -> Iterator[str]:
    """The name of a database with all migrations applied, copied for each test."""
    name = f"stepline_tmpl_{uuid.uuid4().hex[:12]}"
    try:
        admin_loop.run(_create_template(server_nodes, name))
        yield name
    finally:
        admin_loop.run(_drop_everywhere(server_nodes, name))


@pytest.fixture
def database_url(
    admin_loop: AdminLoop, server_nodes: list[str], template_database: str
) -> Iterator[str]:
    """The DSN of a fresh, migrated database of the test's own, dropped afterwards."""
    name = f"stepline_test_{uuid.uuid4().hex[:12]}"
    admin_loop.run(
        _on_nodes(server_nodes, f'CREATE DATABASE "{name}" TEMPLATE "{template_database}"')
    )
    try:
        yield database_dsn(server_nodes[0], name)
    finally:
        admin_loop.run(_drop_everywhere(server_nodes, name))
