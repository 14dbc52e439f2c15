"""Long histories: a large step result read by reference, the whole history fetched by the SDK,
and a run's next generation."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from stepline.protocol import INLINE_RESULT_BYTES
from stepline_server.engine.events import EventType
from stepline_server.store import runs
from stepline_server.store.db import Conn, Q, Record


@dataclass(frozen=True)
class StoredResult:
    """A step's result as stored: ``found`` is False when the run has no step there; ``text``
    is its JSON text (None for a step without a result)."""

    found: bool
    text: str | None


async def step_result(
    conn: Conn, run_id: uuid.UUID, invocation_id: uuid.UUID, lease: str, position: int
) -> StoredResult | None:
    """The result of the step at ``position`` of the run, for the invocation holding it; None
    when that invocation no longer holds the run."""
    row = await conn.fetchrow(Q["step_result"], run_id, invocation_id, lease, position)
    if row is None:
        return None
    return StoredResult(bool(row["found"]), row["output"])


async def invocation_steps(
    conn: Conn,
    run_id: uuid.UUID,
    invocation_id: uuid.UUID,
    lease: str,
    inline_max: int = INLINE_RESULT_BYTES,
) -> list[Record] | None:
    """Every step of the run as it stands now (rows as :func:`claims.begin_invocations` gives
    them), for the invocation holding it; None when that invocation no longer holds the run."""
    rows = await conn.fetch(Q["invocation_steps"], run_id, invocation_id, lease, inline_max)
    if not rows:
        return None
    return [row for row in rows if row["name"] is not None]


@dataclass(frozen=True)
class Continued:
    """A run's new generation and how many steps the last one had."""

    generation: int
    steps: int


async def continue_run(conn: Conn, run_id: uuid.UUID, lease: str, input: Any) -> Continued | None:
    """Start the run's next generation with ``input`` and no steps, due now, ending the
    invocation holding ``lease``; None when it lost the lease. In a transaction."""
    row = await conn.fetchrow(Q["continue_run"], run_id, lease, input)
    if row is None:
        return None
    return Continued(int(row["generation"]), int(row["steps"]))


async def next_generation(conn: Conn, run_id: uuid.UUID, lease: str, input: Any) -> bool:
    """End the invocation holding ``lease`` by starting the run's next generation
    (``ctx.continue_as_new``), with a ``run.continuedAsNew`` event naming it, and wake the
    dispatchers; False when the lease was lost. In a transaction."""
    continued = await continue_run(conn, run_id, lease, input)
    if continued is None:
        return False
    data = {"generation": continued.generation, "steps": continued.steps, "input": input}
    await runs.append_events(conn, run_id, [{"type": EventType.RUN_CONTINUED_AS_NEW, "data": data}])
    await conn.execute(Q["notify_wake"])
    return True
