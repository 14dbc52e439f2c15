"""The dispatcher: claims due runs, invokes their apps, and records how each invocation ended."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Coroutine, Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import orjson
import structlog

from stepline.protocol import InvokeResponse, InvokeStatus
from stepline_server import tracing
from stepline_server.engine import deltas, error_codes, history, transitions
from stepline_server.engine import runs as rules
from stepline_server.engine.steps import InvalidUpdate, Plan, plan_updates
from stepline_server.engine.transitions import Claim
from stepline_server.invoke.body import invoke_body
from stepline_server.invoke.client import AppCaller
from stepline_server.invoke.urls import CallbackSigner
from stepline_server.loops.backoff import Backoff
from stepline_server.loops.batcher import ProgressBatcher
from stepline_server.loops.pollers import Pollers
from stepline_server.metrics import Metrics
from stepline_server.settings import Settings
from stepline_server.store import apps, claims, db, leases, orchestrators, outcomes, progress
from stepline_server.store.db import Conn, Pool

log = structlog.get_logger("stepline.dispatcher")

MAX_OUTPUT_BYTES = 1024 * 1024
RELEASE_HELD_SECONDS = 2.0  # how often the heartbeat lets go held runs nobody released


class Dispatcher:
    """Runs invocations concurrently, up to ``settings.max_inflight`` at a time."""

    def __init__(
        self,
        pool: Pool,
        settings: Settings,
        caller: AppCaller,
        signer: CallbackSigner,
        owner: str,
        batcher: ProgressBatcher,
        metrics: Metrics,
    ) -> None:
        self.batcher = batcher
        self.metrics = metrics
        self.pool = pool
        self.signer = signer
        self.settings = settings
        self.caller = caller
        self.owner = owner
        self.wakeup = asyncio.Event()
        self._inflight: dict[uuid.UUID, str] = {}
        self._reserved = 0  # slots held for runs being created leased (see slot())
        self._to_begin: list[Claim] = []
        # Runs claimed ahead of their due time (settings.timer_lead_seconds): not invoked
        # before this monotonic time.
        self._not_before: dict[uuid.UUID, float] = {}
        self._early = 0  # of those, how many wait for their time now: they take no room
        self._deployments: dict[uuid.UUID, str] = {}  # per app: the last it answered with
        self._timers: dict[uuid.UUID, list[float]] = {}  # due times (monotonic) of timers settled
        self._beginning = False
        self._told = 0.0
        self._running = False  # runs are leased to this dispatcher only while it runs
        # Until this monotonic time, expired leases are not taken over: just after the database
        # was away, a lease may have lapsed only because its holder could not beat meanwhile.
        self._no_takeovers_until = 0.0
        # Since when (monotonic) this orchestrator has been up and reaching the database: a pull
        # lease it gave, last kept after then and lapsed, was lost by its worker, not by us
        # (pull.sql, lost_pull_leases); its beats tell the other orchestrators (orchestrators).
        self._serving_since = time.monotonic()
        self._tasks: set[asyncio.Task[None]] = set()
        self.pollers = Pollers()  # pull apps' workers' long polls waiting here

    def database_was_away(self) -> None:
        """The database could not be reached: for one lease from now, leave runs whose lease
        expired to their holders, whose beats could not land either (a dead holder's runs are
        taken over a lease later)."""
        self._no_takeovers_until = time.monotonic() + self.settings.lease_seconds
        self._serving_since = time.monotonic()

    def _takeovers(self) -> bool:
        return time.monotonic() >= self._no_takeovers_until

    def serving_seconds(self) -> float:
        """How long this orchestrator has been up and reaching the database without a break."""
        return time.monotonic() - self._serving_since

    @property
    def inflight(self) -> int:
        """Invocations running now."""
        return len(self._inflight)

    def _room(self) -> int:
        """How many more invocations may start: runs waiting for a sleep to end take no room
        (claimed ahead of it, they are not calling the app yet)."""
        busy = len(self._inflight) - self._early + self._reserved
        return self.settings.max_inflight - busy

    def tell_others(self) -> bool:
        """Whether new due work should wake the other orchestrators too (a NOTIFY, which
        PostgreSQL serialises at commit): only when this dispatcher has no room for it, and at
        most every 50 ms (one wake-up has a dispatcher claim all it has room for)."""
        if self._room() > 0:
            return False
        now = time.monotonic()
        if now - self._told < 0.05:
            return False
        self._told = now
        return True

    def wake(self) -> None:
        """Look for due work now (a NOTIFY arrived or a run was started here); pull apps'
        workers polling here look too."""
        self.wakeup.set()
        self.pollers.wake_all()

    @contextlib.contextmanager
    def slot(self) -> Iterator[Slot]:
        """Room for one run that the caller leases to this orchestrator at once (a run it
        starts, or one a callback wakes), so that its app is called without a claim
        (:func:`stepline_server.store.leases.take_now`). ``slot.lease`` is None when the
        dispatcher is full or not running; what was taken goes to ``slot.take``. Room not
        taken is given back on leaving."""
        room = self._running and self._room() > 0
        lease = self.lease() if room else None
        if room:
            self._reserved += 1
        try:
            yield Slot(self, lease)
        finally:
            if room:
                self._reserved -= 1

    def lease(self) -> leases.Lease:
        """The lease this dispatcher takes runs under: its owner and lease length, the runs it
        invokes now (never leased again while it does) and whether lapsed leases may be taken
        over (not for a lease after the database was away)."""
        return leases.Lease(
            self.owner, self.settings.lease_seconds, tuple(self._inflight), self._takeovers()
        )

    def _adopt(self, taken: leases.Taken) -> None:
        """Invoke a run leased to this orchestrator at once, its invocation begun."""
        claim = taken.claim
        self._inflight[claim.id] = claim.lease_token
        self._spawn(self._handle(claim, taken.begun), f"invoke-{claim.id}", frees_slot=True)

    async def run(self) -> None:
        """Claim and invoke forever, riding out a lost database: the loop takes another
        connection and goes on (backing off to a second) instead of ending."""
        self._running = True
        pause = Backoff()
        try:
            while True:
                try:
                    # One connection for as long as it lasts: its statements are planned once,
                    # not once per pooled connection in the first burst.
                    async with self.pool.acquire() as conn:
                        pause.reset()
                        await self._claim_forever(conn)
                except Exception as exc:
                    if not db.is_transient(exc):
                        raise
                    if pause.failures == 0:  # once an outage, not once a try
                        log.warning("claim_failed", error=str(exc))
                    self.database_was_away()
                    await pause.wait()
        finally:
            self._running = False

    async def _claim_forever(self, conn: Conn) -> None:
        while True:
            self.wakeup.clear()
            free = self._room()
            claimed: list[Claim] = []
            if free > 0:
                rows = await claims.claim_leased(
                    conn, self.lease(), free, self.settings.timer_lead_seconds
                )
                # A wait the database counted from its now() is counted here from the answer:
                # it then ends late by the statement's time at most, never early.
                answered = time.monotonic()
                claimed = [Claim.of(row) for row in rows]
                if claimed:
                    self.metrics.lease_taken_over(sum(row.taken_over for row in claimed))
                    for row in claimed:
                        self._inflight[row.id] = row.lease_token
                        if row.due_in > 0:
                            self._not_before[row.id] = answered + row.due_in
                    # The next claim need not wait for these invocations to begin.
                    self._queue_begin(claimed)
            if claimed and len(claimed) == free:
                await asyncio.sleep(0)
                continue
            await self._wait(conn)

    async def _wait(self, conn: Conn) -> None:
        timeout = self.settings.poll_seconds
        if self.wakeup.is_set():
            return  # something happened while claiming: look again at once
        if self._room() > 0:
            due_in = await claims.next_due_in(conn, takeovers=self._takeovers())
            if due_in is not None:
                # Claim a sleep's run the lead ahead. What comes due within the lead was not
                # taken by the claim, so it is no sleep (a timeout, a retry, a lease): claim it
                # when due. A run due now that the claim skipped is locked by another
                # transaction: look again shortly rather than spin.
                ahead = due_in - self.settings.timer_lead_seconds
                timeout = max(0.005, min(timeout, ahead if ahead > 0 else due_in))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wakeup.wait(), timeout)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str, *, frees_slot: bool) -> None:
        """Run ``coro`` as a task; when one that ``frees_slot`` ends, claim again."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done if frees_slot else self._tasks.discard)

    def _queue_begin(self, claimed: Sequence[Claim]) -> None:
        """Begin these invocations with the next group: one begin statement runs at a time,
        and the runs claimed meanwhile begin together after it."""
        self._to_begin.extend(claimed)
        if not self._beginning:
            self._beginning = True
            self._spawn(self._begin_queued(), "begin", frees_slot=False)

    async def _begin_queued(self) -> None:
        """Begin what is queued, group after group, on one connection while there is any (so a
        burst plans the statement once); after a failure, on another. While the database is
        away the group waits for it (backing off): a begin never makes a lease go unused."""
        pause = Backoff()
        try:
            while self._to_begin:
                try:
                    async with self.pool.acquire() as conn:
                        while self._to_begin:
                            group, self._to_begin = self._to_begin, []
                            if not await self._begin(conn, group):
                                break
                            pause.reset()
                except Exception as exc:
                    if not db.is_transient(exc):
                        raise
                    if pause.failures == 0:
                        log.warning("begin_waits_for_database", error=str(exc))
                    await pause.wait()
        finally:
            self._beginning = False

    async def _begin(self, conn: Conn, claimed: Sequence[Claim]) -> bool:
        """Begin every claimed run's invocation in one statement (a run past its time limit is
        not invoked: it ends), then invoke each, not before what it waited for is due. Should
        that statement fail, the runs are let go (their leases expire and they are claimed
        again) and the answer is False."""
        asked = time.monotonic()
        try:
            begun = await claims.begin_invocations(
                conn,
                [
                    claims.Begin(
                        row.id,
                        row.lease_token,
                        row.invocation_id,
                        row.invoke_attempts + 1,
                    )
                    for row in claimed
                    if not row.past_deadline
                ],
                self.settings.timer_lead_seconds,
            )
        except Exception as exc:
            if db.is_transient(exc):
                # Tried again on another connection: the claims' tokens still fence the begin.
                self._to_begin = [*claimed, *self._to_begin]
                raise
            log.exception("begin_failed", runs=len(claimed))
            for row in claimed:
                self._inflight.pop(row.id, None)
                self._not_before.pop(row.id, None)
            return False
        answered = time.monotonic()
        for row in claimed:
            if not row.past_deadline and row.id not in begun:
                # Its claim went stale before it began (another orchestrator holds the run now):
                # the app is not called.
                self._inflight.pop(row.id, None)
                self._not_before.pop(row.id, None)
                log.info("begin_stale", run_id=str(row.id))
                continue
            run = begun.get(row.id)
            settled = run.steps if run is not None else []
            timers = [asked - s["late_s"] for s in settled if s["late_s"] is not None]
            self._timers[row.id] = timers  # how late each fired is measured at the call
            not_before = self._not_before.pop(row.id, 0.0)
            if run is not None and run.wait_s > 0:
                # (Counted from the answer, as a claim's due_in is: late, never early.)
                not_before = max(not_before, answered + run.wait_s)
            invocation = self._handle(row, run, not_before)
            self._spawn(invocation, f"invoke-{row.id}", frees_slot=True)
        return True

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self.wakeup.set()

    async def release_held(self, claim: Claim) -> None:
        """Let runs held by ``claim``'s concurrency cap go as far as it has room now."""
        await self._release_held(claim)

    async def _release_held(self, claim: Claim) -> None:
        cap = int(claim.cap or 0)
        capped = claims.Capped(claim.project_id, claim.workflow, claim.concurrency_key, cap)
        try:
            async with self.pool.acquire() as conn:
                await claims.release_held(conn, capped)
        except Exception:
            log.exception("release_held_failed")  # the heartbeat loop tries again

    async def heartbeat(self) -> None:
        """Extend the leases of invocations in flight, so only a dead orchestrator loses them.
        The beats run on a connection of their own, so a beat never waits for a pool that
        progress calls and long polls may have filled; a beat that fails (the database is
        away) is tried again soon on another, backing off to a second: the loop never ends."""
        interval = max(0.2, self.settings.lease_seconds / 3)
        pause = Backoff(cap=min(1.0, interval))
        while True:
            try:
                async with self.pool.acquire() as conn:
                    await self._beat_forever(conn, interval, pause)
            except Exception as exc:
                if pause.failures == 0 or not db.is_transient(exc):
                    log.warning("heartbeat_failed", error=str(exc), leases=len(self._inflight))
                if db.is_transient(exc):
                    self.database_was_away()
                await pause.wait()

    async def _beat_forever(self, conn: Conn, interval: float, pause: Backoff) -> None:
        released = 0.0
        await orchestrators.forget_stopped(conn)
        while True:
            began = time.monotonic()
            leases = list(self._inflight.items())
            if leases:
                await claims.heartbeat(conn, leases, self.settings.lease_seconds)
            # This orchestrator is alive: a pull lease it gave that lapses while it beats was
            # lost by the worker, and whoever takes the run over counts it (lost_pull_leases).
            await orchestrators.seen(conn, self.owner, self.serving_seconds())
            pause.reset()
            if began - released >= RELEASE_HELD_SECONDS:
                # A run held while its cap looked full, released by nobody since (a race with
                # the invocation that freed the slot), goes now.
                released = began
                await claims.release_held(conn)
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - began)))

    async def _handle(
        self, claim: Claim, begun: claims.Begun | None, not_before: float = 0.0
    ) -> None:
        run_id: uuid.UUID = claim.id
        structlog.contextvars.bind_contextvars(run_id=str(run_id))
        try:
            await self._invoke(claim, begun, not_before)
        except Exception:
            log.exception("invocation_crashed")
        finally:
            if self._inflight.get(run_id) == claim.lease_token:
                self._inflight.pop(run_id, None)
            self._timers.pop(run_id, None)
            if claim.cap:
                await self._release_held(claim)
            structlog.contextvars.unbind_contextvars("run_id")

    async def _invoke(self, claim: Claim, begun: claims.Begun | None, not_before: float) -> None:
        """Invoke the app for a claimed run whose invocation has begun (``begun``: what to
        send; None for a run past its time limit), not before ``not_before`` (monotonic), and
        record how the invocation ended."""
        run_id: uuid.UUID = claim.id
        if claim.past_deadline or begun is None:
            await self.time_out(claim)
            return
        attempt = claim.invoke_attempts + 1
        if claim.app_url is None:
            return
        if await self.history_spent(claim, begun):
            return
        if (early := not_before - time.monotonic()) > 0:
            # Claimed and begun ahead of a sleep's end: call the app when it ends.
            self._early += 1
            self.wakeup.set()  # the room it took is free until then
            try:
                await asyncio.sleep(early)
            finally:
                self._early -= 1
        body = invoke_body(
            claim,
            begun.steps,
            attempt=attempt,
            api_url=self.settings.base_url,
            signer=self.signer,
            history_base=begun.history_base,
        )
        for due in self._timers.pop(run_id, ()):
            self.metrics.timer_late(time.monotonic() - due)
        self.observe_begun(claim, begun)
        with tracing.invocation(run_id, claim.workflow, attempt) as trace_headers:
            result = await self.caller.invoke(
                claim.app_url, list(claim.app_secrets), body, trace_headers
            )
        sent = f"POST {claim.app_url} ({result.sent_bytes} bytes)"
        if result.ok:
            assert isinstance(result.response, InvokeResponse)
            await self.answered(
                claim, result.response, result.http_status, result.duration_ms, request=sent
            )
            return
        outcome = self._failure(
            claim,
            result.reason,
            result.http_status,
            result.duration_ms,
            None,
            result.retry_after,
        )
        sent_delta = begun.history_base is not None
        if outcome.status == "delivery_failed" and deltas.refused(sent_delta, result.http_status):
            # An SDK from before deltas came in this form ran nothing: the next invocation,
            # at once, carries the whole history (the run's last answer was not this one's).
            outcome = replace(outcome, retry_delay_ms=0, reason=deltas.REFUSED_DELTA)
        await self._record(claim, Plan(), replace(outcome, request=sent))

    def observe_begun(self, claim: Claim, begun: claims.Begun) -> None:
        """An invocation begun: its steps are labelled with the workflow in the metrics."""
        self.metrics.invocation_began(claim.id, claim.workflow)

    async def time_out(self, claim: Claim) -> None:
        """End a claimed run that went past its time limit (no app is called)."""
        run_id: uuid.UUID = claim.id
        async with self.pool.acquire() as conn, conn.transaction():
            error = {
                "type": "TimedOut",
                "code": "timed_out",
                "message": "the run went past its time limit",
            }
            ended = await outcomes.end_run(
                conn, run_id, claim.lease_token, rules.RunStatus.TIMED_OUT, None, error
            )
        if ended:
            self.metrics.run_ended(
                claim.workflow, rules.RunStatus.TIMED_OUT.value, _age(claim.created_at)
            )
            tracing.run_ended(run_id, claim.workflow, "timedOut", claim.created_at)
        log.info("run_timed_out")

    async def worker_lost(self, claim: Claim, reason: str) -> bool:
        """Record the invocation of ``claim`` (its lease, lapsed) as lost with its pull app's
        worker: a delivery failure, as a push app that cannot be reached (tried again with
        backoff, the run failed ``app_unreachable`` once the delivery window is spent); whether
        it was recorded (False: the lease was no longer the run's)."""
        outcome = self._failure(claim, reason, None, None, None)
        return await self._record(claim, Plan(), outcome)

    async def answered(
        self,
        claim: Claim,
        response: InvokeResponse,
        http_status: int | None,
        duration_ms: int,
        *,
        request: str | None = None,
    ) -> bool:
        """Record the app's answer to the invocation of ``claim`` (over HTTP, or from a pull
        app's worker; ``request`` says what was sent, for the history); whether it was recorded
        (False: stale, the lease was lost)."""
        if response.status is InvokeStatus.STALE:
            log.info("invocation_stale")
            return False
        plan: Plan | None
        try:
            plan = plan_updates(
                str(claim.id),
                response.updates,
                response.logs,
                response.logs_dropped,
                generation=claim.generation or 1,
            )
            outcome = _outcome(response, http_status, duration_ms)
        except InvalidUpdate as exc:
            plan = None
            outcome = self._failure(
                claim,
                f"the app answered with a bad update: {exc}",
                http_status,
                duration_ms,
                response.deployment_id,
            )
        await self._app_answered(claim, response.deployment_id)
        return await self._record(claim, plan or Plan(), replace(outcome, request=request))

    async def _app_answered(self, claim: Claim, deployment_id: str | None) -> None:
        """Remember the deployment an app answered with, as the one its next invocations
        expect (``invocation.started`` carries it); a statement only when it changed."""
        app_id = claim.app_id
        if not deployment_id or app_id is None or self._deployments.get(app_id) == deployment_id:
            return
        async with self.pool.acquire() as conn:
            await apps.answered_with(conn, app_id, deployment_id, claim.id)
        self._deployments[app_id] = deployment_id

    async def _record(self, claim: Claim, plan: Plan, outcome: transitions.Outcome) -> bool:
        run_id: uuid.UUID = claim.id
        ok = await self._finish(run_id, claim.lease_token, claim.invocation_id, plan, outcome)
        self.metrics.invocation_ended(outcome.status, outcome.duration_ms, claim.workflow, run_id)
        if ok and transitions.ends_run(outcome.status):
            self.metrics.run_ended(claim.workflow, outcome.status, _age(claim.created_at))
            tracing.run_ended(run_id, claim.workflow, outcome.status, claim.created_at)
        fields = {
            "outcome": outcome.status,
            "http_status": outcome.http_status,
            "duration_ms": outcome.duration_ms,
            "recorded": ok,
            "workflow": claim.workflow,
            "run_id": str(run_id),
        }
        if outcome.status == "delivery_failed" or _code(outcome) == "app_unreachable":
            log.warning("invocation_ended", error=outcome.reason, **fields)
        else:
            log.info("invocation_ended", **fields)
        return ok

    async def history_spent(self, claim: Claim, begun: claims.Begun) -> bool:
        """End the run ``failed`` (``history_limit_exceeded``) when its history is past the
        limit, instead of invoking it; warn near it."""
        limits = history.Limits(self.settings.history_max_steps, self.settings.history_max_bytes)
        size = history.Size(begun.history_steps, begun.history_bytes)
        verdict = history.check(size, limits)
        if verdict.warning:
            log.warning("history_near_limit", steps=size.steps, bytes=size.bytes)
        if verdict.error is None:
            return False
        log.warning("history_limit_exceeded", steps=size.steps, bytes=size.bytes)
        outcome = transitions.Outcome(
            status=transitions.InvocationStatus.FAILED,
            error=verdict.error,
            duration_ms=0,
            reason="history limit exceeded",
        )
        await self._record(claim, Plan(), outcome)
        return True

    async def _finish(
        self,
        run_id: uuid.UUID,
        token: str,
        invocation_id: uuid.UUID,
        plan: Plan,
        outcome: transitions.Outcome,
    ) -> bool:
        """Commit the last updates with the ``invocation.ended`` event and the outcome, in one
        transaction (shared with other runs' progress when they need none of their own). While
        the database is away the answer waits for it (backing off), so it is not lost: its lease
        fences it should another orchestrator have taken the run meanwhile."""
        ended = (outcome.ended_event(),)
        item = progress.Progress(run_id, token, invocation_id, plan, ended, outcome=outcome)
        pause = Backoff()
        give_up = time.monotonic() + max(60.0, 3 * self.settings.lease_seconds)
        while True:
            try:
                done = await self.batcher.apply(item)
                return done is not None and done.recorded
            except Exception as exc:
                if not db.is_transient(exc) or time.monotonic() > give_up:
                    raise
                if pause.failures == 0:
                    log.warning("outcome_waits_for_database", error=str(exc))
                await pause.wait()

    def _failure(
        self,
        claim: Claim,
        reason: str,
        http_status: int | None,
        duration_ms: int | None,
        deployment_id: str | None,
        retry_after: float | None = None,
    ) -> transitions.Outcome:
        """The app could not be invoked: try again later, unless the delivery window is spent
        (never the workflow's retries)."""
        decision = rules.on_delivery_failure(
            failures_so_far=claim.invoke_attempts,
            failing_since=claim.undelivered_since,
            now=datetime.now(UTC),
            window_seconds=rules.delivery_window(
                claim.options, self.settings.delivery_window_seconds
            ),
            reason=reason,
            http_status=http_status,
            retry_after_seconds=retry_after,
            cap_ms=int(self.settings.delivery_backoff_max_seconds * 1000),
        )
        if decision.retry:
            self.metrics.delivery_failed()
        return transitions.Outcome(
            status=(
                transitions.InvocationStatus.DELIVERY_FAILED
                if decision.retry
                else transitions.InvocationStatus.FAILED
            ),
            error=decision.error,
            http_status=http_status,
            duration_ms=duration_ms,
            deployment_id=deployment_id,
            retry_delay_ms=decision.delay_ms,
            reason=reason,
        )


class Slot:
    """See :meth:`Dispatcher.slot`."""

    def __init__(self, dispatcher: Dispatcher, lease: leases.Lease | None) -> None:
        self.lease = lease
        self._dispatcher = dispatcher

    def take(self, taken: leases.Taken | None) -> None:
        """Invoke the run leased at once (``taken``), else have the dispatcher claim what is
        due."""
        if self.lease is not None and taken is not None:
            self.lease = None  # taken once
            self._dispatcher._adopt(taken)
        else:
            self._dispatcher.wake()


def _code(outcome: transitions.Outcome) -> str | None:
    """The error code an outcome ends its run with, if any."""
    return None if outcome.error is None else outcome.error.get("code")


def _age(created_at: datetime | None) -> float | None:
    """Seconds since ``created_at`` (a run's creation), for the run-duration histogram."""
    return None if created_at is None else (datetime.now(UTC) - created_at).total_seconds()


def _outcome(response: InvokeResponse, http_status: int | None, took: int) -> transitions.Outcome:
    status = response.status.value
    output, error = (
        response.output,
        (response.error.model_dump(exclude_none=True) if response.error else None),
    )
    if status == "continued":
        output = response.input  # the next generation's
    if status in ("completed", "continued") and len(orjson.dumps(output)) > MAX_OUTPUT_BYTES:
        what = "output" if status == "completed" else "input to continue with"
        status, output = "failed", None
        error = {
            "type": "PayloadTooLarge",
            "code": "payload_too_large",
            "message": f"the run's {what} is larger than 1 MiB",
        }
    if status == "failed" and error is None:
        error = {"type": "Error", "message": "the workflow failed"}
    error = error_codes.with_code(error, error_codes.WORKFLOW_FAILED)
    return transitions.Outcome(
        status=transitions.InvocationStatus(status),
        output=output,
        error=error,
        http_status=http_status,
        duration_ms=took,
        deployment_id=response.deployment_id,
        reads_deltas=deltas.reads_deltas(response.protocol_version),
    )
