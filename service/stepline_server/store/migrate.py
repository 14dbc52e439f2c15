"""Forward-only schema migrations: ``migrations/NNNN_name.sql`` applied in order, once each.

Each migration runs in its own transaction that first takes a transaction-level advisory lock,
so orchestrators starting together apply each file exactly once: the second waits, then finds
the version recorded in ``stepline_migrations`` and skips it. A migration file therefore must
not contain statements that cannot run in a transaction (``CREATE INDEX CONCURRENTLY``). On a
Citus database laid out already, DDL on a distributed or reference table is sent to the
workers as the whole text it came in, which Citus refuses when it holds several commands: such
a statement stands alone in its file.
``schema.sql`` is the current truth, folded: each object once, in its final form, never the
migrations pasted in order. A test checks that the migrations produce exactly it, so a new
migration changes ``schema.sql`` in the same commit.

These few statements stay here rather than in a queries file: they bootstrap the database
before anything else in the store can run.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from stepline_server.store import citus

if TYPE_CHECKING:
    import asyncpg

__all__ = ["MigrationError", "apply_migrations", "migration_files", "schema_sql"]

_log = structlog.get_logger(__name__)

_STORE_DIR = Path(__file__).resolve().parent
_MIGRATIONS_DIR = _STORE_DIR / "migrations"
_FILE_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")

# The first 8 bytes of sha256(b"stepline_migrations"), as a signed bigint.
_LOCK_KEY = -1737815417872889171

_LOCK = "SELECT pg_advisory_lock($1)"
_UNLOCK = "SELECT pg_advisory_unlock($1)"
_CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS stepline_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""
_IS_APPLIED = "SELECT EXISTS (SELECT 1 FROM stepline_migrations WHERE version = $1)"
_RECORD = "INSERT INTO stepline_migrations (version, name) VALUES ($1, $2)"


class MigrationError(RuntimeError):
    """The migration files are inconsistent (a misnamed file or a duplicate version)."""


def schema_sql() -> str:
    """The text of ``schema.sql``, the current schema in one file."""
    return (_STORE_DIR / "schema.sql").read_text(encoding="utf-8")


def migration_files() -> list[Path]:
    """The migration files, in version order."""
    files: dict[int, Path] = {}
    for path in _MIGRATIONS_DIR.glob("*.sql"):
        match = _FILE_NAME.match(path.name)
        if match is None:
            raise MigrationError(f"{path.name}: migration files are named NNNN_name.sql")
        version = int(match.group(1))
        if version in files:
            raise MigrationError(f"{path.name} and {files[version].name} share version {version}")
        files[version] = path
    return [files[version] for version in sorted(files)]


def _version(path: Path) -> int:
    return int(path.name[:4])


async def _lay_out_for_citus(conn: asyncpg.Connection) -> None:
    """On a Citus coordinator, lay out what the migrations made (``citus.lay_out``).

    Nothing happens on plain PostgreSQL. Kept apart from the migrations: they stay the same
    on both, and this step follows each run of them under the same lock.
    """
    layout = await citus.lay_out(conn)
    if layout:
        _log.info(
            "citus layout",
            reference=layout.reference,
            distributed=layout.distributed,
            propagated=layout.propagated,
            delegated=layout.delegated,
            changed=layout.changed,
        )


async def apply_migrations(conn: asyncpg.Connection) -> list[str]:
    """Apply the migrations ``conn``'s database lacks, in order; return their names.

    ``conn`` must not be inside a transaction: each migration commits on its own. One lock is
    held over them all, so a process migrating beside another waits until every migration is
    in rather than going on with a schema half migrated.
    """
    applied: list[str] = []
    await conn.execute(_LOCK, _LOCK_KEY)
    try:
        for path in migration_files():
            version, name = _version(path), path.stem
            async with conn.transaction():
                await conn.execute(_CREATE_TABLE)
                if await conn.fetchval(_IS_APPLIED, version):
                    continue
                await conn.execute(path.read_text(encoding="utf-8"))
                await conn.execute(_RECORD, version, name)
            applied.append(name)
        await _lay_out_for_citus(conn)
    finally:
        await conn.execute(_UNLOCK, _LOCK_KEY)
    return applied
