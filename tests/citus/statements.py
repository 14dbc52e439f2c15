"""Which of the store's named statements a Citus coordinator refuses, grouped by the reason.

    python -m tests.citus.statements DSN [--all] [--generic]

``DSN`` names a database migrated (and so laid out) on a Citus coordinator. Each named query of
``store/*.sql`` is prepared and run once (its Citus variant ``on_citus_<name>`` instead, when it
has one: what the store runs there; the variants' own steps under their names), with
placeholder values of its parameters' types, inside a transaction rolled back, with custom
plans (``--generic``: the store's own session settings, generic plans; Citus 13.2.2 crashes
the coordinator's backend on some of those, which restarts the coordinator: each is listed as
"the session was lost").
Errors that Citus gives (feature not supported, and the other messages of its planner) are
grouped by message, each with the statements that met it; other errors (a placeholder value
that breaks a check, say) are counted apart and listed with ``--all``. Placeholder values reach
empty tables, so a statement that passes here may still be refused with rows to read (a plan
Citus chooses by its data); the e2e tests on the cluster find those. The statements the store
never runs on Citus (``citus_loop.CITUS_FORMS``) are not run; the Citus forms it runs in their
place are.
"""

from __future__ import annotations

import asyncio
import datetime
import re
import sys
import uuid
from collections import defaultdict
from typing import Any

import asyncpg

from stepline_server.store.citus_loop import CITUS_FORMS
from stepline_server.store.db import CITUS_VARIANT, ENUMS, SESSION_SETTINGS, Q, init_connection

_VALUES: dict[str, Any] = {
    "uuid": uuid.UUID(int=1),
    "text": "x",
    "varchar": "x",
    "int2": 1,
    "int4": 1,
    "int8": 1,
    "float8": 1.0,
    "numeric": 1,
    "bool": False,
    "jsonb": {},
    "json": {},
    "timestamptz": datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
    "interval": datetime.timedelta(seconds=1),
    "run_status": "running",
    "step_status": "running",
    "step_kind": "run",
}

# Codes of errors that say the statement itself is not run by Citus as written: not
# supported, internal, no unique index for ON CONFLICT (one was changed for Citus), a function
# of the table's row type (a shard's row type is another), a table not found where a query was
# pushed down.
_CITUS_CODES = {"0A000", "XX000", "42P10", "42809", "42883", "42P01"}


def _is_citus(exc: asyncpg.PostgresError) -> bool:
    # (A placeholder of the wrong type raises 42883 too: only functions of runs' row count.)
    if exc.sqlstate == "42883":
        return "(runs" in str(exc)
    # Citus 13.2.2 reads an intermediate result's binary COPY header as a value.
    return exc.sqlstate in _CITUS_CODES or "PGCOPY" in str(exc)


def _value(type_: Any) -> Any:
    if type_.kind == "array":
        return []
    return _VALUES.get(type_.name)


async def _connect(dsn: str, generic: bool) -> Any:
    settings = SESSION_SETTINGS if generic else {"plan_cache_mode": "force_custom_plan"}
    for _ in range(60):  # a coordinator restarting after a crash answers within seconds
        try:
            conn = await asyncpg.connect(dsn, server_settings=settings)
            break
        except (OSError, asyncpg.CannotConnectNowError):
            await asyncio.sleep(0.5)
    else:
        raise RuntimeError(f"{dsn} does not answer")
    await init_connection(conn)
    for name in ENUMS:
        await conn.set_type_codec(name, encoder=str, decoder=str, format="text")
    return conn


Found = dict[str, list[str]]


async def probe(dsn: str, generic: bool) -> tuple[Found, Found, list[str]]:
    """(Citus's refusals by message, other errors by message, the statements that ran)."""
    conn = await _connect(dsn, generic)
    refused: dict[str, list[str]] = defaultdict(list)
    other: dict[str, list[str]] = defaultdict(list)
    ran: list[str] = []
    try:
        # On Citus the store runs the Citus forms of some statements instead (citus_loop):
        # those are probed, the statements they replace are not.
        forms = {form for names in CITUS_FORMS.values() for form in names}
        for name, sql in sorted(Q.items()):
            if name in CITUS_FORMS or (name.startswith("citus_") and name not in forms):
                continue
            if name.startswith(CITUS_VARIANT) and name[len(CITUS_VARIANT) :] in Q:
                continue  # (run in its statement's place)
            sql = Q.get(CITUS_VARIANT + name, sql)
            tr = conn.transaction()
            await tr.start()
            try:
                stmt = await conn.prepare(sql)
                await stmt.fetch(*(_value(t) for t in stmt.get_parameters()))
                ran.append(name)
            except asyncpg.PostgresError as exc:
                if conn.is_closed():
                    refused["the session was lost (the backend crashed)"].append(name)
                else:
                    # (A shard's name, runs_102020, said as its table's: runs_<shard>.)
                    message = re.sub(r"_\d{6,}\b", "_<shard>", str(exc).splitlines()[0])
                    (refused if _is_citus(exc) else other)[message].append(name)
            except (asyncpg.InterfaceError, OSError):
                refused["the session was lost (the backend crashed)"].append(name)
            if conn.is_closed():
                conn = await _connect(dsn, generic)
            else:
                await tr.rollback()
    finally:
        await conn.close()
    return refused, other, ran


def main(argv: list[str]) -> int:
    """Print the refusals (and with ``--all`` the other errors); 1 when Citus refused any."""
    if not argv:
        print(__doc__)
        return 2
    refused, other, ran = asyncio.run(probe(argv[0], "--generic" in argv))
    total = sum(len(v) for v in refused.values())
    print(
        f"{len(ran)} statements ran; {total} refused by Citus; "
        f"{sum(len(v) for v in other.values())} failed on placeholder values"
    )
    for message, names in sorted(refused.items(), key=lambda kv: -len(kv[1])):
        print(f"\n{len(names)} x {message}\n    " + ", ".join(sorted(names)))
    if "--all" in argv:
        for message, names in sorted(other.items(), key=lambda kv: -len(kv[1])):
            print(f"\n(other) {len(names)} x {message}\n    " + ", ".join(sorted(names)))
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
