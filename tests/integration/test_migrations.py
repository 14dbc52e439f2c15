"""Migrations against schema.sql, the migration runner, and the embedded PostgreSQL server."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from stepline_server.store import migrate
from stepline_server.store.embedded import SAFE_ROOT, EmbeddedPostgres

IGNORED_TABLE = "stepline_migrations"

# Each query returns rows that describe one part of the public schema, independent of the
# database it runs in; stepline_migrations (the runner's bookkeeping) is left out.
SCHEMA_QUERIES = {
    "relations": """
        SELECT c.relname, c.relkind::text, c.relpersistence::text
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
          AND c.relname <> $1
    """,
    "columns": """
        SELECT c.relname, a.attname,
               row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum) AS position,
               format_type(a.atttypid, a.atttypmod), a.attnotnull,
               pg_get_expr(d.adbin, d.adrelid), a.attidentity::text, a.attgenerated::text,
               coalesce(co.collname, '')
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        LEFT JOIN pg_collation co ON co.oid = a.attcollation AND a.attcollation <> 0
        WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
          AND c.relname <> $1 AND a.attnum > 0 AND NOT a.attisdropped
    """,
    "constraints": """
        SELECT coalesce(c.relname, ''), coalesce(t.typname, ''), con.conname,
               con.contype::text, pg_get_constraintdef(con.oid), con.condeferrable,
               con.condeferred
        FROM pg_constraint con
        JOIN pg_namespace n ON n.oid = con.connamespace
        LEFT JOIN pg_class c ON c.oid = con.conrelid
        LEFT JOIN pg_type t ON t.oid = con.contypid
        WHERE n.nspname = 'public' AND coalesce(c.relname, '') <> $1
    """,
    "indexes": """
        SELECT tablename, indexname, indexdef FROM pg_indexes
        WHERE schemaname = 'public' AND tablename <> $1
    """,
    "enums": """
        SELECT t.typname, array_agg(e.enumlabel::text ORDER BY e.enumsortorder)
        FROM pg_type t
        JOIN pg_namespace n ON n.oid = t.typnamespace
        JOIN pg_enum e ON e.enumtypid = t.oid
        WHERE n.nspname = 'public' AND $1::text IS NOT NULL
        GROUP BY t.typname
    """,
    "comments": """
        SELECT pg_describe_object(d.classoid, d.objoid, d.objsubid), d.description
        FROM pg_description d
        WHERE pg_describe_object(d.classoid, d.objoid, d.objsubid) NOT LIKE '%' || $1 || '%'
          AND (
            d.objoid IN (SELECT c.oid FROM pg_class c JOIN pg_namespace n
                         ON n.oid = c.relnamespace WHERE n.nspname = 'public')
            OR d.objoid IN (SELECT t.oid FROM pg_type t JOIN pg_namespace n
                            ON n.oid = t.typnamespace WHERE n.nspname = 'public')
            OR d.objoid IN (SELECT p.oid FROM pg_proc p JOIN pg_namespace n
                            ON n.oid = p.pronamespace WHERE n.nspname = 'public')
            OR d.objoid IN (SELECT con.oid FROM pg_constraint con JOIN pg_namespace n
                            ON n.oid = con.connamespace WHERE n.nspname = 'public')
          )
    """,
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_functiondef(p.oid)
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'public' AND p.prokind IN ('f', 'p') AND $1::text IS NOT NULL
    """,
    "triggers": """
        SELECT c.relname, tg.tgname, pg_get_triggerdef(tg.oid)
        FROM pg_trigger tg JOIN pg_class c ON c.oid = tg.tgrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND NOT tg.tgisinternal AND c.relname <> $1
    """,
    "extensions": "SELECT extname FROM pg_extension WHERE $1::text IS NOT NULL",
}


def database_dsn(dsn: str, database: str) -> str:
    """``dsn`` pointed at another database on the same server."""
    return urlunsplit(urlsplit(dsn)._replace(path=f"/{database}"))


def _normalise(value: Any) -> Any:
    # Definitions are the same text in any database, but collapse whitespace to be safe.
    return re.sub(r"\s+", " ", value).strip() if isinstance(value, str) else value


async def describe_schema(conn: asyncpg.Connection) -> dict[str, list[tuple[Any, ...]]]:
    """Every part of the public schema, as sorted rows per part."""
    described = {}
    for part, query in SCHEMA_QUERIES.items():
        rows = await conn.fetch(query, IGNORED_TABLE)
        described[part] = sorted(tuple(_normalise(v) for v in row.values()) for row in rows)
    return described


@asynccontextmanager
async def scratch_database(admin_dsn: str) -> AsyncIterator[str]:
    """The DSN of an empty database, dropped afterwards."""
    name = f"stepline_scratch_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
        yield database_dsn(admin_dsn, name)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def test_migrations_build_the_schema_in_schema_sql(admin_dsn: str) -> None:
    """A database built by the migrations matches one built from schema.sql, part by part."""
    async with (
        scratch_database(admin_dsn) as schema_dsn,
        scratch_database(admin_dsn) as migrated_dsn,
    ):
        from_schema = await asyncpg.connect(schema_dsn)
        migrated = await asyncpg.connect(migrated_dsn)
        try:
            await from_schema.execute(migrate.schema_sql())
            await migrate.apply_migrations(migrated)
            expected = await describe_schema(from_schema)
            actual = await describe_schema(migrated)
        finally:
            await from_schema.close()
            await migrated.close()
    assert expected["relations"], "schema.sql created no tables"
    for part in SCHEMA_QUERIES:
        assert actual[part] == expected[part], f"migrations and schema.sql differ in {part}"


async def test_apply_migrations_applies_every_file_once(admin_dsn: str) -> None:
    """The first call applies every migration in order and records it; the second applies none."""
    names = [path.stem for path in migrate.migration_files()]
    assert names and names[0] == "0001_initial"
    async with scratch_database(admin_dsn) as dsn:
        conn = await asyncpg.connect(dsn)
        try:
            assert await migrate.apply_migrations(conn) == names
            assert await migrate.apply_migrations(conn) == []
            recorded = await conn.fetch("SELECT version, name FROM stepline_migrations ORDER BY 1")
        finally:
            await conn.close()
    assert [(r["version"], r["name"]) for r in recorded] == [(int(n[:4]), n) for n in names]


async def test_migrated_template_needs_no_migration(database_url: str) -> None:
    """A per-test database copied from the template is already fully migrated."""
    conn = await asyncpg.connect(database_url)
    try:
        assert await migrate.apply_migrations(conn) == []
    finally:
        await conn.close()


async def test_concurrent_apply_migrations_apply_each_file_once(admin_dsn: str) -> None:
    """Two orchestrators migrating one database together apply each migration exactly once."""
    async with scratch_database(admin_dsn) as dsn:
        first, second = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
        try:
            results = await asyncio.gather(
                migrate.apply_migrations(first), migrate.apply_migrations(second)
            )
        finally:
            await first.close()
            await second.close()
    # Each file is its own transaction, so the two may share the files: each exactly once.
    applied = sorted(results[0] + results[1])
    assert applied == [p.stem for p in migrate.migration_files()]


@pytest.fixture
def pg_folder() -> Iterator[Path]:
    """A folder for an embedded server's data that PostgreSQL's own user can traverse."""
    folder = Path(tempfile.mkdtemp(prefix="stepline-embedded-"))
    folder.chmod(0o755)  # mkdtemp makes it private; as root, the server runs as another user
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _query(dsn: str, sql: str) -> Any:
    async def run() -> Any:
        conn = await asyncpg.connect(dsn)
        try:
            return await conn.fetchval(sql)
        finally:
            await conn.close()

    return asyncio.run(run())


def _postmaster_pid(data_dir: Path) -> int:
    return int((data_dir / "postmaster.pid").read_text().splitlines()[0])


def test_embedded_postgres_keeps_data_across_restarts(pg_folder: Path) -> None:
    """EmbeddedPostgres starts, serves asyncpg, stops, and starts again with its data kept."""
    pg = EmbeddedPostgres(pg_folder / "data")
    with pg:
        dsn = pg.start()
        assert pg.start() == dsn  # idempotent
        _query(dsn, "CREATE TABLE kept AS SELECT 42 AS x")
    assert pg.dsn is None
    assert not (pg.data_dir / "postmaster.pid").exists()
    with EmbeddedPostgres(pg_folder / "data") as again:
        assert again.dsn is not None
        assert _query(again.dsn, "SELECT x FROM kept") == 42


@pytest.mark.slow
def test_embedded_postgres_survives_kill_9(pg_folder: Path) -> None:
    """A server left by a killed process is adopted, and one killed itself is restarted."""
    data_dir = pg_folder / "data"
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from stepline_server.store.embedded import EmbeddedPostgres
        print("DSN", EmbeddedPostgres(Path({str(data_dir)!r})).start(), flush=True)
        time.sleep(60)
    """)
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    try:
        dsn = next(line for line in owner.stdout if line.startswith("DSN ")).split()[1]
        _query(dsn, "CREATE TABLE kept AS SELECT 7 AS x")
    finally:
        owner.kill()
        owner.wait()
        owner.stdout.close()
    first_pid = _postmaster_pid(data_dir)

    adopter = EmbeddedPostgres(data_dir)
    try:
        assert _query(adopter.start(), "SELECT x FROM kept") == 7
        assert _postmaster_pid(data_dir) == first_pid  # adopted, not restarted
    except BaseException:
        adopter.stop()
        raise
    os.kill(first_pid, signal.SIGKILL)  # the server dies too, leaving a stale postmaster.pid
    adopter.stop()  # nothing left to stop; the adopter no longer counts as using the server
    # A new process (as after a crash) starts the server again on the same data.
    restart = textwrap.dedent(f"""
        import asyncio, asyncpg
        from pathlib import Path
        from stepline_server.store.embedded import EmbeddedPostgres
        pg = EmbeddedPostgres(Path({str(data_dir)!r}))
        async def main():
            conn = await asyncpg.connect(pg.start())
            print("KEPT", await conn.fetchval("SELECT x FROM kept"), flush=True)
            await conn.close()
        try:
            asyncio.run(main())
        finally:
            pg.stop()
    """)
    done = subprocess.run(
        [sys.executable, "-c", restart], capture_output=True, text=True, timeout=120
    )
    assert "KEPT 7" in done.stdout, done.stderr[-2000:]


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="root only")
def test_embedded_postgres_as_root_avoids_private_folders(pg_folder: Path) -> None:
    """As root, a data folder under a private folder moves to SAFE_ROOT; nothing is chmod-ed."""
    private = pg_folder / "private"
    private.mkdir(mode=0o700)
    private.chmod(0o700)
    pg = EmbeddedPostgres(private / "data")
    assert pg.data_dir.parent == SAFE_ROOT.resolve()
    assert pg.data_dir == EmbeddedPostgres(private / "data").data_dir  # stable, so data persists
    assert EmbeddedPostgres(pg_folder / "data").data_dir == (pg_folder / "data").resolve()
    assert private.stat().st_mode & 0o777 == 0o700
