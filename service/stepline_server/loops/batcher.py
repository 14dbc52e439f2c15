"""Group commit: progress calls of different runs that arrive together share one statement.

Each step costs a progress call, and committing each alone caps throughput at the database's
commits per second. Calls queue here; a flush takes what has queued (one call per run, at most
``max_batch``) and commits it with one statement, while up to ``max_flushes`` flushes run at
once. An invocation's answer comes here too: its last updates and its outcome (the run ended,
suspended, or is to be invoked again) commit in the group's transaction. A lone call is flushed
at once, so a quiet orchestrator adds no delay; under load the batches grow by themselves. A
reply is sent only after its batch has committed.
"""

from __future__ import annotations

import asyncio
import uuid

import structlog

from stepline_server.metrics import Metrics
from stepline_server.store import progress
from stepline_server.store.db import Pool

log = structlog.get_logger("stepline.batcher")

Entry = tuple[progress.Progress, "asyncio.Future[progress.Committed | None]"]


class ProgressBatcher:
    """Commits progress calls (and the outcomes of invocations that ended) in groups;
    ``apply`` answers what was committed for the run, None when its token was stale."""

    def __init__(
        self,
        pool: Pool,
        metrics: Metrics | None = None,
        *,
        max_batch: int = 64,
        max_flushes: int = 2,
    ) -> None:
        self.pool = pool
        self.metrics = metrics or Metrics()
        self.max_batch = max_batch
        self.max_flushes = max_flushes
        self._queue: list[Entry] = []
        self._flushing = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def apply(self, item: progress.Progress) -> progress.Committed | None:
        """Commit ``item``; None when its token is stale. A plan that starts children or waits
        for events needs a transaction of its own."""
        if item.plan.needs_transaction:
            async with self.pool.acquire() as conn:
                done = await progress.apply_plan(conn, item)
            self.metrics.progress_committed(1, grouped=False)
            if done is not None:
                self._observe([item])
                for child in item.plan.children:
                    self.metrics.run_started(child.workflow, "parent")
            return done
        if not self._queue and self._flushing < self.max_flushes:
            return await self._alone(item)  # nothing to group it with: no task, no hand-off
        future: asyncio.Future[progress.Committed | None] = (
            asyncio.get_running_loop().create_future()
        )
        self._queue.append((item, future))
        self._kick()
        return await future

    async def _alone(self, item: progress.Progress) -> progress.Committed | None:
        self._flushing += 1
        try:
            return (await self._commit([item])).get(item.run_id)
        finally:
            self._flushing -= 1
            self._kick()

    async def _commit(self, items: list[progress.Progress]) -> dict[uuid.UUID, progress.Committed]:
        async with self.pool.acquire() as conn:
            done = await progress.commit(conn, items)
        self.metrics.progress_committed(len(items))
        self._observe([item for item in items if item.run_id in done])
        return done

    def _observe(self, items: list[progress.Progress]) -> None:
        """Time the steps these committed items started or ended."""
        for item in items:
            changes = item.plan.changes
            self.metrics.steps_changed(item.run_id, [(c.name, c.kind, c.status) for c in changes])

    def _kick(self) -> None:
        while self._queue and self._flushing < self.max_flushes:
            batch = self._take()
            self._flushing += 1
            task = asyncio.create_task(self._flush(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _take(self) -> list[Entry]:
        batch: list[Entry] = []
        rest: list[Entry] = []
        runs: set[uuid.UUID] = set()
        for entry in self._queue:
            run_id = entry[0].run_id
            if len(batch) < self.max_batch and run_id not in runs:
                batch.append(entry)
                runs.add(run_id)
            else:
                rest.append(entry)
        self._queue = rest
        return batch

    async def _flush(self, batch: list[Entry]) -> None:
        try:
            try:
                rows = await self._commit([item for item, _ in batch])
                for item, future in batch:
                    if not future.done():
                        future.set_result(rows.get(item.run_id))
            except Exception:
                if len(batch) == 1:
                    raise
                # One bad call must not fail the others: commit them one by one.
                log.warning("progress_batch_failed", size=len(batch))
                for entry in batch:
                    await self._flush_one(entry)
        except Exception as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
        finally:
            self._flushing -= 1
            self._kick()

    async def _flush_one(self, entry: Entry) -> None:
        item, future = entry
        try:
            future.set_result((await self._commit([item])).get(item.run_id))
        except Exception as exc:
            future.set_exception(exc)
