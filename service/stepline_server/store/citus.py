"""The schema laid out on a Citus cluster: distributed and reference tables, delegated functions.

``lay_out`` runs after the migrations (``migrate.apply_migrations`` calls it). On plain
PostgreSQL (no ``citus`` extension in the database) it does nothing. With the extension it lays
out each table the migrations made that Citus does not know yet, so it is idempotent and a new
migration's table is laid out by the next ``stepline migrate``:

* the small per-project tables (projects, environments, keys, apps, workflows, deployments,
  schedules, alerts, operations, ...) and the alerts outbox become reference tables (a copy on
  every node);
* the tables that grow with runs are hashed by run id and colocated with ``runs`` (one run's
  rows, its steps, history, callbacks, logs, state, on one shard);
* the other growing tables are hashed by their own key (events by id, schedule ticks by
  schedule, a bulk action's runs by operation, singleton keys by the key's id);

Citus needs every primary key and unique index of a distributed table to include its
distribution column, and foreign keys between distributed tables to join on their distribution
columns. Where the schema has others, this step changes them on Citus only (see
``docs/scaling.md``, which also says what the statements lose by it): a primary key gets the
distribution column appended; a bare unique index becomes a plain index of the same columns;
a foreign key that Citus cannot keep is dropped. What it changed is returned, and logged by the
caller.

The schema's functions are made on every node (Citus does not propagate by itself those of a
table's row type), and the run transitions (PL/pgSQL functions whose first argument is the run
id) are delegated to the worker holding that run's shard as they appear.

The claims and sweeps that Citus refuses as written (``FOR UPDATE`` across shards) have
variants in ``citus.sql`` (``on_citus_<name>``, chosen by ``db.query``); the per-run functions
those call are Citus-only, made by each layout (``citus_claim_functions``).

The DDL here names tables and columns, so it is composed from the fixed lists below (quoted
identifiers); the catalog reads and Citus calls are named queries in ``citus.sql``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stepline_server.store.db import Conn, Q

__all__ = [
    "CITUS_FUNCTIONS",
    "DELEGATED_FUNCTIONS",
    "DISTRIBUTED",
    "REFERENCE",
    "Layout",
    "citus_present",
    "lay_out",
]

REFERENCE: tuple[str, ...] = (
    "projects",
    "environments",
    "api_keys",
    "dashboard_sessions",
    "server_secrets",
    "orchestrators",
    "apps",
    "workflows",
    "deployments",
    "schedules",
    "alerts",
    "operations",
    "alert_notifications",
)
"""Small per-project (or per-server) tables: a copy on every node, in foreign key order. The
alerts outbox is one too: its claims take row locks, which reference tables allow, and it may
be filled from the runs (record_sla_breaches), which a coordinator-local table may not."""

DISTRIBUTED: tuple[tuple[str, str, str], ...] = (
    ("runs", "id", "none"),
    ("steps", "run_id", "runs"),
    ("callbacks", "run_id", "runs"),
    ("run_events", "run_id", "runs"),
    ("run_logs", "run_id", "runs"),
    ("run_state", "run_id", "runs"),
    ("run_gatherings", "run_id", "runs"),
    ("events", "id", "none"),
    ("schedule_ticks", "schedule_id", "none"),
    ("operation_runs", "operation_id", "none"),
    ("run_singletons", "id", "none"),
)
"""(table, distribution column, colocated with): ``runs`` first, its colocation group's root."""

DELEGATED_FUNCTIONS: tuple[str, ...] = (
    "run_progress",
    "run_suspend",
    "run_wake",
    "run_end",
    "run_release",
    "append_run_events",
    # The run loop on Citus (below):
    "run_begin",
    "run_keep_lease",
    "run_request_cancel",
    "run_continue",
    "run_hold",
    "run_unhold",
    "run_defer",
    "run_resume",
    "run_move",
    "run_repair",
    "run_gather_input",
    "run_fire",
    "run_record_state",
    "citus_lease_run",
    "citus_claim_on_shard",
)
"""The run transitions: each takes the run id first and runs on the worker holding its shard,
inside a transaction too. (Not run_restart, a SQL function returning runs' rows: Citus 13.2.2
crashes the worker it delegates a call of it to, signal 11; it is made on every node.)"""

# The run loop on Citus ------------------------------------------------------------------

CITUS_FUNCTIONS: tuple[str, ...] = ("citus_make_lease_run", "citus_make_claim_on_shard")
"""The functions made on Citus only (``citus.sql``, by name; each ``CREATE OR REPLACE``, so
made again by every layout): the per-run lease and the per-shard claim, on the shard's own
table."""


@dataclass
class Layout:
    """What one ``lay_out`` call did (empty on plain PostgreSQL or when nothing was left)."""

    reference: list[str] = field(default_factory=list)
    distributed: list[str] = field(default_factory=list)
    propagated: list[str] = field(default_factory=list)
    """Functions made on every node (those Citus did not propagate by itself)."""
    delegated: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    """Constraints and indexes changed for Citus, one line each (what they were)."""

    def __bool__(self) -> bool:
        return bool(self.reference or self.distributed or self.propagated or self.delegated)


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


async def citus_present(conn: Conn) -> bool:
    """Whether the database ``conn`` is in has the ``citus`` extension."""
    return bool(await conn.fetchval(Q["citus_present"]))


async def lay_out(conn: Conn) -> Layout:
    """Lay out on Citus the tables it does not know yet (nothing without the extension).

    ``conn`` must not be in a transaction: each table's layout commits on its own (Citus
    creates the shards in its own transactions); a step interrupted is taken up again by the
    next call.
    """
    layout = Layout()
    if not await citus_present(conn):
        return layout
    known = {row["name"] for row in await conn.fetch(Q["citus_tables_laid_out"])}

    async def exists(name: str) -> bool:
        return bool(await conn.fetchval(Q["citus_table_exists"], name))

    reference = [t for t in REFERENCE if t not in known and await exists(t)]
    distributed = [d for d in DISTRIBUTED if d[0] not in known and await exists(d[0])]
    if reference or distributed:
        await _lay_out_tables(conn, reference, distributed, layout)

    for name in CITUS_FUNCTIONS:
        await conn.execute(Q[name])
    for row in await conn.fetch(Q["citus_functions_to_propagate"], list(DELEGATED_FUNCTIONS)):
        await conn.fetchval(Q["citus_propagate_function"], row["signature"])
        layout.propagated.append(row["signature"])
    rows = await conn.fetch(Q["citus_functions_to_delegate"], list(DELEGATED_FUNCTIONS))
    for row in rows:
        await conn.fetchval(Q["citus_delegate_function"], row["signature"])
        layout.delegated.append(row["signature"])
    await _make_claim_functions(conn)
    return layout


async def _lay_out_tables(
    conn: Conn,
    reference: list[str],
    distributed: list[tuple[str, str, str]],
    layout: Layout,
) -> None:
    """Lay the tables out, the foreign keys that touch them dropped first, then restored.

    The keys go first because Citus turns a plain table that references a new reference table
    into a coordinator-local one, and distributing such a table later rebuilds it, dropping
    what depends on its row type (lease_claim_of, pull_lease_lapse). Restored are the keys
    Citus keeps: to a reference table, or between colocated distribution columns.
    """
    columns = {t: col for t, col, _ in DISTRIBUTED}
    names = [*REFERENCE, *columns]
    todo = {*reference, *(t for t, _, _ in distributed)}
    keys = [
        k
        for k in await conn.fetch(
            Q["citus_foreign_keys_among"], names, [columns.get(n) for n in names]
        )
        if k["tbl"] in todo or k["ref"] in todo
    ]
    kept = [k for k in keys if k["colocated"] or k["ref"] in REFERENCE]
    async with conn.transaction():
        for k in keys:
            table, name = _ident(k["tbl"]), _ident(k["name"])
            await conn.execute(f"ALTER TABLE {table} DROP CONSTRAINT {name}")
            if k not in kept:
                layout.changed.append(
                    f"{k['tbl']}: foreign key {k['name']} dropped ({k['definition']})"
                )
        for table, col, _ in distributed:
            await _fit_unique(conn, table, col, layout)
    for name in reference:
        await conn.fetchval(Q["citus_create_reference_table"], name)
        layout.reference.append(name)
    # steps keeps its trigger (steps_version): Citus calls triggers on distributed tables
    # unsafe (they run on the shard's node, in its transaction) and takes them on request.
    await conn.execute(Q["citus_allow_triggers"])
    try:
        for table, col, with_ in distributed:
            await conn.fetchval(Q["citus_create_distributed_table"], table, col, with_)
            layout.distributed.append(table)
    finally:
        await conn.execute(Q["citus_reset_triggers"])
    for k in kept:
        table, name = _ident(k["tbl"]), _ident(k["name"])
        await conn.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} {k['definition']}")


async def _fit_unique(conn: Conn, table: str, col: str, layout: Layout) -> None:
    """Make ``table``'s primary key and unique indexes acceptable to Citus (by ``col``)."""
    for ix in await conn.fetch(Q["citus_unique_without"], table, col):
        cols = ", ".join(_ident(c) for c in [*ix["columns"], col])
        if ix["constraint_name"] is not None:
            kind = "PRIMARY KEY" if ix["primary_key"] else "UNIQUE"
            name = _ident(ix["constraint_name"])
            # (Citus takes one subcommand per ALTER TABLE.)
            await conn.execute(f"ALTER TABLE {_ident(table)} DROP CONSTRAINT {name}")
            await conn.execute(f"ALTER TABLE {_ident(table)} ADD CONSTRAINT {name} {kind} ({cols})")
            layout.changed.append(f"{table}: {kind.lower()} {ix['constraint_name']} now ({cols})")
        else:
            # A unique index: the same columns, not unique (what it promised is kept elsewhere
            # or lost: docs/scaling.md).
            plain = ix["definition"].replace("CREATE UNIQUE INDEX", "CREATE INDEX", 1)
            await conn.execute(f"DROP INDEX {_ident(ix['index'])}")
            await conn.execute(plain)
            layout.changed.append(f"{table}: unique index {ix['index']} no longer unique")


# --- Claims and sweeps across shards -------------------------------------------------------


async def _make_claim_functions(conn: Conn) -> None:
    """Make (again) the per-run functions the Citus variants of the claims and sweeps call
    (``citus.sql``, ``citus_claim_functions``): made on the coordinator, where those
    statements run; each statement in them is routed to one run's shard."""
    await conn.execute(Q["citus_claim_functions"])
