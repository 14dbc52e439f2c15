"""The bulk operations loop: works running operations through their fixed sets of runs, a small
batch at a time, beside the runs going on.

A batch is one transaction: the operation's row and the batch's runs are claimed with
``FOR UPDATE SKIP LOCKED`` (so several orchestrators never work the same runs, and one batch of
an operation is worked at a time), each run is acted on through the same store function as the
single-run routes (``waits.cancel``, ``waits.retry``) in a savepoint of its own, and the
outcomes and counters are recorded before the commit. A crash (``kill -9``) before the commit
undoes the whole batch, which the next batch takes again: each run is acted on once.
Operations take turns, environment by environment (``operations.claim``): one in another
environment never waits for a big one to end, and one waiting for room holds up no other.

Between batches the loop rests (``rules.rest_after``), and each batch is sized by
``rules.batch_room``: it waits while the dispatcher has a backlog of due runs, and tops up what
the operation keeps in the dispatcher (its runs due and not yet taken, or being invoked, as
``operations.ahead`` counts them in the database, whichever orchestrator acted on them) to at
most one batch. Other workflows' runs never queue behind more than a batch of its runs, and its
runs reach the dispatcher a few at a time instead of in bursts.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import asyncpg
import structlog

from stepline_server.engine import bulk as rules
from stepline_server.engine import runs as run_rules
from stepline_server.store import claims, deployments, operations, waits
from stepline_server.store.db import Conn, Pool, Record

log = structlog.get_logger("stepline.operations")

IDLE_SECONDS = 1.0  # how often to look for a running operation when there is none
SWEEP_SECONDS = 60.0  # how often an idle loop deletes operations past retention


@dataclass
class Batch:
    """What one batch did: the runs acted on (and the workflows of those retried)."""

    operation: Record | None = None
    done: int = 0
    retried: list[str] = field(default_factory=list)
    acted: list[uuid.UUID] = field(default_factory=list)  # the runs cancelled or retried
    held: bool = False  # no room yet: nothing was done, look again after a rest
    backlog: int = 0  # the dispatcher's due runs not yet invoked, when it was held


class OperationsLoop:
    """Works bulk operations; ``wake()`` when one is created, so it starts at once."""

    def __init__(
        self,
        pool: Pool,
        *,
        batch_size: int = rules.BATCH_SIZE,
        rest_seconds: float = rules.REST_SECONDS,
        on_acted: Callable[[], None] | None = None,
        on_retried: Callable[[str], None] | None = None,
        retention_days: float = 0.0,
    ) -> None:
        self._pool = pool
        self._batch_size = max(1, batch_size)
        self._rest = rest_seconds
        self._wakeup = asyncio.Event()
        self._on_acted = on_acted
        self._on_retried = on_retried
        # since when each operation's next batch has waited for room
        self._held_since: dict[uuid.UUID, float] = {}
        self._retention_s = retention_days * 86_400
        self._swept_at = 0.0

    def wake(self) -> None:
        self._wakeup.set()

    async def run(self) -> None:
        while True:
            began = time.monotonic()
            batch = await self.work_once()
            if batch.held:
                await asyncio.sleep(rules.rest_after(0.0, batch.backlog))
                continue
            if batch.done == 0:
                if time.monotonic() - self._swept_at > SWEEP_SECONDS:
                    await self.sweep_once()
                self._wakeup.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), IDLE_SECONDS)
                continue
            rest = max(self._rest, rules.rest_after(time.monotonic() - began, 0))
            await asyncio.sleep(rest)

    async def sweep_once(self) -> int:
        """Delete the operations that ended longer ago than the runs are kept (none when runs
        are kept for ever); how many."""
        self._swept_at = time.monotonic()
        if self._retention_s <= 0:
            return 0
        total = 0
        async with self._pool.acquire() as conn:
            while deleted := await operations.delete_old(conn, self._retention_s):
                total += deleted
        if total:
            log.info("operations_swept", operations=total)
        return total

    async def work_once(self) -> Batch:
        """Work one batch of the running operation whose turn it is, as many runs as it has
        room for (none: ``held``)."""
        async with self._pool.acquire() as conn:
            batch = await self._batch(conn)
        if batch.operation is None:
            self._held_since.clear()
            return batch
        if batch.held:
            self._held_since.setdefault(batch.operation["id"], time.monotonic())
            return batch
        self._held_since.pop(batch.operation["id"], None)
        if batch.done:
            if self._on_acted:
                self._on_acted()
            for workflow in batch.retried:
                if self._on_retried:
                    self._on_retried(workflow)
        return batch

    async def _batch(self, conn: Conn) -> Batch:
        async with conn.transaction():
            op = await operations.claim(conn)
            if op is None:
                return Batch()
            size, backlog = await self._room(conn, op)
            if size == 0:
                return Batch(op, held=True, backlog=backlog)
            items = await operations.claim_runs(conn, op["id"], size)
            batch = Batch(op)
            done = [await self._act(conn, op, item, batch) for item in items]
            batch.operation = await operations.record(conn, op["id"], done)
            batch.done = max(1, len(done))  # an operation with nothing left was just completed
        if batch.operation is not None and batch.operation["status"] != "running":
            log.info(
                "operation_ended",
                operation_id=str(op["id"]),
                status=batch.operation["status"],
                succeeded=batch.operation["succeeded"],
                failed=batch.operation["failed"],
                skipped=batch.operation["skipped"],
            )
        return batch

    async def _room(self, conn: Conn, op: Record) -> tuple[int, int]:
        """How many runs the batch may act on, and the dispatcher's backlog."""
        backlog, _ = await claims.backlog(conn)
        window = rules.AHEAD_BATCHES * self._batch_size
        ahead = await operations.ahead(conn, op["id"], window)
        since = self._held_since.get(op["id"])
        held = time.monotonic() - since if since is not None else 0.0
        size = rules.batch_room(
            self._batch_size,
            backlog=backlog,
            waiting=ahead.waiting,
            invoking=ahead.invoking,
            held_seconds=held,
        )
        return size, backlog

    async def _act(
        self, conn: Conn, op: Record, item: operations.Item, batch: Batch
    ) -> operations.Done:
        """Act on one run in a savepoint: what went wrong undoes that run's action alone."""
        by = rules.by(op["id"])
        action = rules.Action(op["action"])
        try:
            async with conn.transaction():
                if action is rules.Action.CANCEL:
                    status = await operations.lock_run_status(conn, op["project_id"], item.run_id)
                    skip = rules.cancel_outcome(status)
                    if skip is not None:
                        return operations.Done(item.position, skip)
                    row = await waits.cancel(conn, op["project_id"], item.run_id, by=by)
                elif action is rules.Action.MOVE:
                    moved = await deployments.move_run(
                        conn, op["project_id"], item.run_id, op["deployment"]
                    )
                    if not moved:  # ended, gone, or of another app than the deployment's
                        return operations.Done(item.position, rules.Outcome.SKIPPED)
                    row = {"id": item.run_id}
                else:
                    row = await waits.retry(
                        conn,
                        op["project_id"],
                        item.run_id,
                        op["from_step"],
                        by=by,
                        trigger=rules.TRIGGER,
                    )
                    if row is not None:
                        batch.retried.append(str(row["workflow"]))
        except asyncpg.TransactionRollbackError:
            raise  # a deadlock or serialization failure: the whole batch goes again later
        except run_rules.RuleError:
            return operations.Done(item.position, rules.Outcome.SKIPPED)  # no longer qualifies
        except (asyncpg.PostgresError, ValueError) as exc:
            log.warning(
                "operation_run_failed",
                operation_id=str(op["id"]),
                run_id=str(item.run_id),
                error=str(exc),
            )
            error = {"code": "internal", "message": str(exc)[:500], "type": type(exc).__name__}
            return operations.Done(item.position, rules.Outcome.FAILED, error)
        if row is None:
            return operations.Done(item.position, rules.Outcome.SKIPPED)  # the run is gone
        batch.acted.append(item.run_id)
        return operations.Done(item.position, rules.Outcome.SUCCEEDED)
