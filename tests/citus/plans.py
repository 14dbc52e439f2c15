"""What each of the store's named statements spans on a Citus cluster, read from its plan.

    python -m tests.citus.plans DSN [NAME ...]

``DSN`` names a database migrated (and so laid out) on a Citus coordinator. Each named query of
``store/*.sql`` (or each NAME) is explained with placeholder values of its parameters' types
(``EXPLAIN``, nothing runs), with custom plans as the store's sessions on Citus make them, and
its distributed scans are read from the plan: how many shard tasks each runs (a delegated
function call is one task on the worker holding its run). Printed one line a statement:
``one shard`` (every distributed scan one task), ``N shards`` (the most tasks of a scan, and
how many distributed scans and subplans), ``coordinator`` (no distributed scan: only the
coordinator's own tables, or a procedure, whose statements are not in the plan), or what
Citus refused. ``tests/integration/test_citus_layout.py`` checks with :func:`spans` that the
statements moving one run are one shard's task.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from dataclasses import dataclass
from typing import Any

import asyncpg

from stepline_server.store.db import Q
from tests.citus.statements import _connect, _value


@dataclass(frozen=True)
class Span:
    """What one statement's plan spans: the task count of each distributed scan (subplans
    included), or why there is no plan."""

    tasks: tuple[int, ...] = ()
    refused: str | None = None

    @property
    def one_shard(self) -> bool:
        return self.refused is None and bool(self.tasks) and max(self.tasks) == 1

    def __str__(self) -> str:
        if self.refused is not None:
            return f"refused: {self.refused}"
        if not self.tasks:
            return "coordinator"
        if max(self.tasks) == 1:
            return "one shard" + (f" ({len(self.tasks)} scans)" if len(self.tasks) > 1 else "")
        return f"{max(self.tasks)} shards ({len(self.tasks)} distributed scans)"


def _task_counts(node: Any) -> list[int]:
    """Every ``Task Count`` in an explained plan (JSON), wherever it sits."""
    found: list[int] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "Task Count" and isinstance(value, int):
                found.append(value)
            else:
                found.extend(_task_counts(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(_task_counts(item))
    return found


async def spans(conn: Any, name: str) -> Span:
    """What the named statement spans, from its plan on this connection (custom plans)."""
    sql = Q[name]
    code = [
        line for line in sql.splitlines() if line.strip() and not line.lstrip().startswith("--")
    ]
    if code and code[0].lstrip().upper().startswith("CALL "):
        return Span()  # a procedure, run on the coordinator (each of its statements routed)
    tr = conn.transaction()
    await tr.start()
    try:
        stmt = await conn.prepare(sql)
        values = [_value(t) for t in stmt.get_parameters()]
        plan = await conn.fetchval("EXPLAIN (FORMAT JSON) " + sql, *values)
    except asyncpg.PostgresError as exc:
        return Span(refused=re.sub(r"_\d{6,}\b", "_<shard>", str(exc).splitlines()[0]))
    finally:
        if not conn.is_closed():
            await tr.rollback()
    if isinstance(plan, str):
        plan = json.loads(plan)
    return Span(tasks=tuple(_task_counts(plan)))


async def explain_all(dsn: str, names: list[str]) -> dict[str, Span]:
    conn = await _connect(dsn, generic=False)
    try:
        return {n: await spans(conn, n) for n in names}
    finally:
        await conn.close()


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    names = argv[1:] or sorted(n for n in Q if not n.startswith("citus_"))
    found = asyncio.run(explain_all(argv[0], names))
    width = max(len(n) for n in found)
    for name, span in found.items():
        print(f"{name:<{width}}  {span}")
    one = sum(1 for s in found.values() if s.one_shard)
    many = sum(1 for s in found.values() if s.tasks and not s.one_shard)
    print(
        f"\n{len(found)} statements: {one} one shard, {many} several shards, "
        f"{sum(1 for s in found.values() if s.refused)} refused"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
