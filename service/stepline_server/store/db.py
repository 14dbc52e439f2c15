"""The asyncpg pool, JSON codecs, and the named queries of the .sql files, loaded once."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, TypeAlias

import asyncpg
import orjson

Conn: TypeAlias = Any  # asyncpg.Connection (asyncpg ships no type information)
Pool: TypeAlias = Any  # asyncpg.Pool
Record: TypeAlias = Any  # asyncpg.Record

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def _load(path: Path) -> dict[str, str]:
    text = path.read_text()
    parts = _NAME.split(text)
    return {parts[i]: parts[i + 1].strip() for i in range(1, len(parts), 2)}


def _load_all(folder: Path) -> dict[str, str]:
    queries: dict[str, str] = {}
    for path in sorted(folder.glob("*.sql")):
        if path.name != "schema.sql":
            for name, sql in _load(path).items():
                if name in queries:
                    raise RuntimeError(f"query {name!r} is defined twice ({path.name})")
                queries[name] = sql
    return queries


Q: dict[str, str] = _load_all(Path(__file__).parent)
"""Every named query of the store's .sql files, by name."""


_JSONB_VERSION = b"\x01"


def _jsonb_encode(value: Any) -> bytes:
    return _JSONB_VERSION + orjson.dumps(value)


def _jsonb_decode(data: bytes) -> Any:
    return orjson.loads(data[1:])


class StoreConnection(asyncpg.Connection):  # type: ignore[misc]
    """A connection that knows whether its database is a Citus coordinator (``on_citus``):
    asked once, when it is opened, so no statement of the run loop asks again."""

    citus = False


def on_citus(conn: Conn) -> bool:
    """Whether ``conn`` (one of the pool's, or :func:`connect`'s) is on a Citus coordinator:
    the store then runs the Citus form of the statements Citus refuses (``store/citus.sql``);
    on plain PostgreSQL it runs the statements as they are."""
    return bool(getattr(conn, "citus", False))


async def init_connection(conn: Conn) -> None:
    """Teach a connection to read and write JSON values as Python objects (jsonb in its binary
    form: a version byte and the JSON text, with no str round trip), and tell whether its
    database is a Citus coordinator (:func:`on_citus`)."""
    # (Not isinstance: asyncpg's connections answer it for any connection class.)
    if issubclass(type(conn), StoreConnection):
        conn.citus = bool(await conn.fetchval(Q["citus_present"]))
    await conn.set_type_codec(
        "jsonb",
        encoder=_jsonb_encode,
        decoder=_jsonb_decode,
        schema="pg_catalog",
        format="binary",
    )
    await conn.set_type_codec(
        "json", encoder=orjson.dumps, decoder=orjson.loads, schema="pg_catalog", format="binary"
    )


# Every query is prepared once per connection and run with its parameters. PostgreSQL plans the
# first five runs of a prepared statement for their values and only then considers one plan for
# all, so each new connection re-plans the big statements (about a millisecond each) and a
# statement whose values look different can be re-planned for good. The store's statements are
# written for one plan: look-ups by key, and small batches unnested from their parameters.
# JIT compilation is off: a generic plan's cost is estimated for any parameter values, often
# past PostgreSQL's JIT threshold, and compiling a claim that reads a few index entries took
# hundreds of milliseconds where running it takes one.
SESSION_SETTINGS = {"plan_cache_mode": "force_generic_plan", "jit": "off"}


# The schema's enums, read and written as text. Registering them up front spares each new
# connection asyncpg's catalogue query for types it does not know (PostgreSQL takes about ten
# milliseconds to plan it); for the same reason the hot statements take their lists as one
# jsonb parameter, not arrays (asyncpg looks array types up too).
ENUMS = ("run_status", "step_kind", "step_status", "run_event_type")


async def _init_pooled(conn: Conn) -> None:
    await init_connection(conn)
    for name in ENUMS:
        await conn.set_type_codec(name, encoder=str, decoder=str, format="text")
    if conn.citus:
        # On a Citus coordinator, a plan for the values at hand: Citus cannot make a generic
        # plan of most distributed statements, and crashes on some (docs/scaling.md).
        await conn.execute(Q["citus_session"])


# Statements Citus refuses as written have a variant in citus.sql, named after them with
# CITUS_VARIANT in front, run instead when the connection is on a Citus coordinator
# (:func:`on_citus`; plain PostgreSQL keeps the statement as it is).
CITUS_VARIANT = "on_citus_"


def query(conn: Conn, name: str) -> str:
    """The named statement ``name``, or on Citus its variant when it has one."""
    variant = CITUS_VARIANT + name
    if variant in Q and on_citus(conn):
        return Q[variant]
    return Q[name]


async def _keep_session(conn: Conn) -> None:
    """Nothing to reset: the store sets no session state, LISTEN has its own connection and
    advisory locks are transaction-scoped. asyncpg's default reset costs a round trip on every
    release (about a seventh of the orchestrator's time per step)."""


async def create_pool(dsn: str, *, min_size: int = 2, max_size: int = 10) -> Pool:
    """A pool whose connections speak JSON and know the schema's enums (the schema must exist);
    statements are prepared and cached per connection."""
    pool = await asyncpg.create_pool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        init=_init_pooled,
        connection_class=StoreConnection,
        reset=_keep_session,
        command_timeout=60,
        server_settings=SESSION_SETTINGS,
        # Connections are not closed for being idle: that would arm a timer on every release.
        max_inactive_connection_lifetime=0,
    )
    assert pool is not None
    return pool


async def connect(dsn: str) -> Conn:
    """One connection that speaks JSON (for LISTEN, migrations and tools)."""
    conn = await asyncpg.connect(dsn, connection_class=StoreConnection)
    await init_connection(conn)
    return conn


UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError,  # ConnectionError included: refused, reset; TimeoutError (no answer) too
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,  # the connection closed under the statement
    asyncpg.InternalClientError,  # mid-exchange by the break; no host matched the session attrs
    asyncpg.CannotConnectNowError,
    asyncpg.OperatorInterventionError,  # admin shutdown, crash shutdown
    asyncpg.ReadOnlySQLTransactionError,  # 25006: the server is a standby now (a failover)
)
"""What a database that is away raises (a restart, a failover, a dropped connection, a server
starting up or demoted), rather than a statement that was wrong: the same work may be tried
again, on the primary there is then."""


_SHARD_SUFFIX = re.compile(r"_\d{6,}$")
_NAMED_IN_MESSAGE = re.compile(r'constraint "([^"]+)"')


def constraint_name(exc: asyncpg.PostgresError) -> str | None:
    """The constraint a violation names, as the schema names it. On Citus the violation is a
    shard's, relayed by the coordinator: the constraint is named only in the message, and as
    the shard's copy, which carries the shard's id (``apps_project_id_name_key_102014``)."""
    name = getattr(exc, "constraint_name", None)
    if not name:
        found = _NAMED_IN_MESSAGE.search(str(exc))
        name = found.group(1) if found else None
    return _SHARD_SUFFIX.sub("", name) if name else None


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` says the database went away (see :data:`UNAVAILABLE`)."""
    return isinstance(exc, UNAVAILABLE)
