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
    "schemas": """
        SELECT nspname FROM pg_namespace
        WHERE nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema' AND $1::text IS NOT NULL
    """,
    "relations": """
        SELECT c.relname, c.relkind::text, c.relpersistence::text,
               coalesce(c.reloptions::text, ''), c.relrowsecurity, c.relforcerowsecurity,
               c.relreplident::text
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f', 'c')
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
        WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'c')
          AND c.relname <> $1 AND a.attnum > 0 AND NOT a.attisdropped
    """,
    "constraints": """
        SELECT coalesce(c.relname, ''), coalesce(t.typname, ''), con.conname,
               con.contype::text, pg_get_constraintdef(con.oid), con.condeferrable,
               con.condeferred, con.convalidated, con.connoinherit
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
    "policies": """
        SELECT tablename, policyname, permissive, roles::text, cmd, coalesce(qual, ''),
               coalesce(with_check, '')
        FROM pg_policies WHERE schemaname = 'public' AND tablename <> $1
    """,
    "sequences": """
        SELECT c.relname, format_type(s.seqtypid, NULL), s.seqstart, s.seqincrement, s.seqmax,
               s.seqmin, s.seqcache, s.seqcycle,
               coalesce(owner.relname || '.' || a.attname, '')
        FROM pg_sequence s
        JOIN pg_class c ON c.oid = s.seqrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = c.oid
             AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')
        LEFT JOIN pg_class owner ON owner.oid = d.refobjid
        LEFT JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
        WHERE n.nspname = 'public' AND coalesce(owner.relname, '') <> $1
    """,
    "types": """
        SELECT t.typname, t.typtype::text, format_type(t.typbasetype, t.typtypmod), t.typnotnull,
               coalesce(t.typdefault, '')
        FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
        LEFT JOIN pg_class c ON c.oid = t.typrelid
        WHERE n.nspname = 'public' AND t.typcategory <> 'A'
          AND (c.oid IS NULL OR c.relkind = 'c') AND $1::text IS NOT NULL
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
        SELECT p.proname, pg_get_function_identity_arguments(p.oid), p.prokind::text,
               CASE WHEN p.prokind IN ('f', 'p') THEN pg_get_functiondef(p.oid) ELSE '' END
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'public' AND $1::text IS NOT NULL
    """,
    "triggers": """
        SELECT c.relname, tg.tgname, pg_get_triggerdef(tg.oid), tg.tgenabled::text
        FROM pg_trigger tg JOIN pg_class c ON c.oid = tg.tgrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND NOT tg.tgisinternal AND c.relname <> $1
    """,
    "extensions": "SELECT extname FROM pg_extension WHERE $1::text IS NOT NULL",
}


# One change of each kind a migration could leave behind, with the part that must notice it: the
# parity test below is only as strict as these show describe_schema to be.
SCHEMA_CHANGES = [
    ("schemas", "CREATE SCHEMA extra"),
    ("relations", "ALTER TABLE runs SET (fillfactor = 90)"),
    ("relations", "CREATE TABLE extra (id integer)"),
    ("columns", "ALTER TABLE runs ALTER COLUMN trigger SET DEFAULT 'cron'"),
    ("columns", "ALTER TABLE runs ALTER COLUMN parent_step SET NOT NULL"),
    ("columns", "ALTER TABLE runs ALTER COLUMN rate_key TYPE varchar(64)"),
    ("columns", "ALTER TYPE lease_claim ADD ATTRIBUTE extra integer"),
    ("constraints", "ALTER TABLE apps DROP CONSTRAINT apps_url_of_kind"),
    (
        "constraints",
        "ALTER TABLE steps DROP CONSTRAINT steps_attempt_check, "
        "ADD CONSTRAINT steps_attempt_check CHECK (attempt >= 1) NOT VALID",
    ),
    ("indexes", "DROP INDEX runs_paused"),
    ("indexes", "ALTER INDEX runs_ready SET (fillfactor = 70)"),
    ("policies", "CREATE POLICY extra ON runs USING (true)"),
    ("sequences", "ALTER SEQUENCE server_secrets_id_seq INCREMENT 2"),
    ("sequences", "ALTER SEQUENCE server_secrets_id_seq OWNED BY NONE"),
    ("types", "CREATE DOMAIN extra AS integer"),
    ("enums", "ALTER TYPE step_kind ADD VALUE 'extra' BEFORE 'run'"),
    ("comments", "COMMENT ON COLUMN runs.held IS 'changed'"),
    ("comments", "COMMENT ON CONSTRAINT apps_url_of_kind ON apps IS 'added'"),
    (
        "functions",
        "CREATE OR REPLACE FUNCTION woken_ready_at(lease_token text, ready_at timestamptz,"
        " at timestamptz) RETURNS timestamptz LANGUAGE sql IMMUTABLE AS $$ SELECT at $$",
    ),
    ("functions", "ALTER FUNCTION stepline_database_id() VOLATILE"),
    ("triggers", "ALTER TABLE steps DISABLE TRIGGER steps_version"),
    ("extensions", "CREATE EXTENSION citext"),
]


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


async def test_schema_comparison_sees_each_kind_of_change(admin_dsn: str) -> None:
    """Each part describe_schema compares notices a change of its kind: the parity test can fail."""
    assert {part for part, _ in SCHEMA_CHANGES} == set(SCHEMA_QUERIES)
    async with scratch_database(admin_dsn) as dsn:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(migrate.schema_sql())
            base = await describe_schema(conn)
            for part, change in SCHEMA_CHANGES:
                transaction = conn.transaction()
                await transaction.start()
                try:
                    await conn.execute(change)
                    changed = await describe_schema(conn)
                finally:
                    await transaction.rollback()
                assert changed[part] != base[part], f"{part} missed: {change}"
        finally:
            await conn.close()


def test_schema_sql_is_folded() -> None:
    """schema.sql states each object once in its final form: nothing altered, dropped, replaced."""
    # Drop comments and string literals (whichever starts first), so only statements are read.
    code = re.sub(r"'(?:[^']|'')*'|--[^\n]*", "", migrate.schema_sql())
    patches = re.findall(r"\b(?:ALTER|DROP)\s+\w+|\bOR\s+REPLACE\b", code, re.IGNORECASE)
    assert patches == []
    created = re.findall(
        r"\bCREATE\s+(?:OR\s+REPLACE\s+)?(?:UNIQUE\s+)?(TABLE|TYPE|INDEX|FUNCTION|TRIGGER|SEQUENCE|VIEW)"
        r"\s+(\w+)",
        code,
        re.IGNORECASE,
    )
    assert len(created) > 40
    assert sorted(created) == sorted(set(created)), "an object is created twice"


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
