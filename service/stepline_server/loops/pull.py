"""Pull apps' invocations: a worker's poll claims its app's due runs and gets their invoke
bodies; the worker's heartbeats keep the leases; its answer is recorded as the dispatcher
records an app's HTTP answer, and a try a worker lost (its lease lapsed) as a delivery
failure."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import structlog

from stepline.protocol import InvokeResponse
from stepline_server.engine.transitions import Claim
from stepline_server.invoke.body import invoke_body
from stepline_server.loops.dispatcher import Dispatcher
from stepline_server.store import claims, pull
from stepline_server.store.db import Conn, Pool, Record

log = structlog.get_logger("stepline.pull")

WORKER_LOST = "the worker running the invocation was lost (no heartbeat for a whole lease)"


async def _first(timeout: float, *events: asyncio.Event) -> None:
    """Wait until one of ``events`` is set, at most ``timeout`` seconds."""
    waits = {asyncio.ensure_future(e.wait()) for e in events}
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


class PullInvocations:
    """What the pull routes ask of the run loop."""

    def __init__(self, pool: Pool, dispatcher: Dispatcher) -> None:
        self.pool = pool
        self.dispatcher = dispatcher
        self.settings = dispatcher.settings
        self._closing = asyncio.Event()

    def close(self) -> None:
        """The orchestrator shuts down: polls waiting answer at once (with nothing), so that
        a connected worker does not hold up the server's exit."""
        self._closing.set()

    async def poll(
        self,
        app: Record,
        limit: int,
        wait: float,
        gone: asyncio.Event | None = None,
        *,
        deltas: bool = True,
        deployment: uuid.UUID | None = None,
        protocol: int | None = None,
    ) -> list[dict[str, Any]]:
        """The invoke bodies of up to ``limit`` due runs of pull app ``app``, each now leased
        to the poll (its invocation begun); waits up to ``wait`` seconds for one to come due,
        woken by the dispatcher's wake-ups. Empty when none came, or once ``gone`` is set (the
        worker went away: a run claimed for it would wait out its lease). Without ``deltas``
        (the worker does not read them) each carries its run's whole history. Only runs on
        ``deployment`` (the worker's; None: the app's current one). ``protocol``: the version
        the worker declared (None: the app's, at its last sync)."""
        app_id: uuid.UUID = app["id"]
        give_up = time.monotonic() + wait
        gone = gone or asyncio.Event()
        async with self.pool.acquire() as conn:
            await pull.polled(conn, app_id)
        while not gone.is_set() and not self._closing.is_set():
            with self.dispatcher.pollers.watch(app_id) as woken:
                async with self.pool.acquire() as conn:
                    bodies = await self._claim(conn, app_id, limit, deltas, deployment, protocol)
                    if bodies:
                        return bodies
                    due_in = await pull.next_due_in(
                        conn, app_id, self.settings.lease_seconds, deployment
                    )
                left = give_up - time.monotonic()
                if left <= 0:
                    return []
                timeout = min(left, self.settings.poll_seconds)
                if due_in is not None:
                    timeout = min(timeout, max(0.005, due_in))
                await _first(timeout, woken, gone, self._closing)
        return []

    async def _claim(
        self,
        conn: Conn,
        app_id: uuid.UUID,
        limit: int,
        deltas: bool,
        deployment: uuid.UUID | None = None,
        protocol: int | None = None,
    ) -> list[dict[str, Any]]:
        # The dispatcher's lease: no takeovers for a lease after the database was away (a
        # worker's beats could not land either).
        lease = self.dispatcher.lease()
        if lease.takeovers:
            await self._record_lost(conn, app_id)
        rows = await pull.claim(
            conn,
            app_id,
            lease.owner,
            lease.seconds,
            limit,
            takeovers=lease.takeovers,
            deployment=deployment,
        )
        claimed = [Claim.of(row) for row in rows]
        if not claimed:
            return []
        self.dispatcher.metrics.lease_taken_over(sum(row.taken_over for row in claimed))
        overdue = [row for row in claimed if row.past_deadline]
        for row in overdue:  # a capped run past its time limit: it ends, no worker runs it
            await self.dispatcher.time_out(row)
        begin = [row for row in claimed if not row.past_deadline]
        begun = await claims.begin_invocations(
            conn,
            [
                claims.Begin(
                    row.id,
                    row.lease_token,
                    row.invocation_id,
                    row.invoke_attempts + 1,
                    deltas,
                )
                for row in begin
            ],
        )
        bodies = []
        for row in begin:
            run = begun.get(row.id)
            if run is None:
                continue  # its claim went stale before it began
            if await self.dispatcher.history_spent(row, run):
                continue  # past the history limit: the run failed, no worker runs it
            self.dispatcher.observe_begun(row, run)
            bodies.append(
                invoke_body(
                    row,
                    run.steps,
                    attempt=row.invoke_attempts + 1,
                    api_url=self.settings.base_url,
                    signer=self.dispatcher.signer,
                    history_base=run.history_base,
                    app_protocol=protocol,
                )
            )
        log.info("pull_claimed", app_id=str(app_id), runs=len(bodies))
        return bodies

    async def _record_lost(self, conn: Conn, app_id: uuid.UUID) -> None:
        """Before leasing again the runs whose workers lost their invocations (a worker died,
        stalled or was cut off while the orchestrator that leased the run to it, this one or
        another, was serving), record each loss as a delivery failure: the run is invoked
        again after the backoff, or fails ``app_unreachable`` once its delivery window is
        spent."""
        lost = [Claim.of(row) for row in await pull.lost(conn, app_id, self.settings.lease_seconds)]
        for claim in lost:
            log.warning("worker_lost", run_id=str(claim.id))
            await self.dispatcher.worker_lost(claim, WORKER_LOST)
            if claim.cap:
                await self.dispatcher.release_held(claim)

    async def answer(
        self,
        run_id: uuid.UUID,
        lease: str,
        invocation_id: uuid.UUID,
        response: InvokeResponse,
        duration_ms: int,
        *,
        worker: str = "a worker",
    ) -> bool:
        """Record a worker's answer for the invocation holding ``lease`` (``worker`` names who
        ran it); False when the lease is no longer the run's (another invocation owns it, or
        it ended)."""
        async with self.pool.acquire() as conn:
            row = await pull.leased(conn, run_id, lease)
        if row is None or row["invocation_id"] != invocation_id:
            return False
        claim = Claim.of(row)
        recorded = await self.dispatcher.answered(
            claim, response, None, duration_ms, request=f"poll by {worker}"
        )
        if claim.cap:
            await self.dispatcher.release_held(claim)
        # Something may have woken the run while it ran (it is due again at once).
        if claim.app_id is not None:
            self.dispatcher.pollers.wake(claim.app_id)
        return recorded

    async def beat(self, run_id: uuid.UUID, lease: str) -> bool | None:
        """Extend a worker's lease on its invocation; whether the run's cancellation was
        requested, None when the lease is lost."""
        async with self.pool.acquire() as conn:
            held = await claims.heartbeat(conn, [(run_id, lease)], self.settings.lease_seconds)
        return held.get(run_id)
