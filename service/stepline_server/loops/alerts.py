"""The alert delivery loop: sends the outbox's due notifications, records each attempt, and
looks for scheduled runs past their SLA; now and then deletes settled notifications older
than ``STEPLINE_RETENTION_DAYS`` (one batch of a thousand a sweep).

It runs beside the run loop and shares nothing with it but the database pool, which it holds
only for its short statements: each attempt is sent outside any transaction, in a task of its
own, at most :data:`CONCURRENCY` at once, each bounded by the send timeout. A receiver that
never answers therefore costs one task until the timeout, and no run anything. A notification
is leased while it is sent (:data:`LEASE_SECONDS`), so an attempt cut short by a crash is made
again, after restart or by another orchestrator, under the same notification id.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from datetime import UTC, datetime

import structlog

from stepline_server.engine import alerts as rules
from stepline_server.invoke.alerts import AlertSender, Sent
from stepline_server.loops.backoff import Backoff
from stepline_server.store import alerts, db
from stepline_server.store.db import Pool, Record

log = structlog.get_logger("stepline.alerts")

CONCURRENCY = 16
DB_CONNECTIONS = 2
"""The most pool connections the attempts' records take at once, so a burst of answers never
takes the run loop's connections."""
LEASE_SECONDS = rules.SEND_TIMEOUT_SECONDS + 20.0
SLA_CHECK_SECONDS = 2.0
RETENTION_CHECK_SECONDS = 600.0


class AlertDelivery:
    """Delivers notifications at least once, with backoff, for the delivery window."""

    def __init__(
        self,
        pool: Pool,
        sender: AlertSender,
        base_url: str,
        *,
        poll_seconds: float = 1.0,
        window_seconds: float = rules.DELIVERY_WINDOW_SECONDS,
        retention_days: float = 30.0,
    ) -> None:
        self.pool = pool
        self.sender = sender
        self.base_url = base_url
        self.poll_seconds = poll_seconds
        self.window_seconds = window_seconds
        self._sending: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._db = asyncio.Semaphore(DB_CONNECTIONS)
        self._sla_checked = 0.0
        self._swept = 0.0
        self.retention_days = retention_days

    def wake(self) -> None:
        """Look for due notifications now (one was just recorded)."""
        self._wake.set()

    async def run(self) -> None:
        backoff = Backoff(first=0.5, cap=10.0)
        try:
            while True:
                try:
                    await self.tick()
                    backoff.reset()
                except Exception as exc:
                    if not db.is_transient(exc):
                        raise
                    if backoff.failures == 0:
                        log.warning("alerts_database_away", error=str(exc))
                    await backoff.wait()
                    continue
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.poll_seconds)
        finally:
            for task in list(self._sending):
                task.cancel()

    async def tick(self) -> None:
        """Start an attempt for each due notification there is room for; now and then,
        record the SLA breaches found."""
        now = time.monotonic()
        if now - self._sla_checked >= SLA_CHECK_SECONDS:
            self._sla_checked = now
            async with self.pool.acquire() as conn:
                found = await alerts.record_sla_breaches(conn)
            if found:
                log.info("sla_breaches_recorded", count=found)
        if self.retention_days > 0 and now - self._swept >= RETENTION_CHECK_SECONDS:
            self._swept = now
            async with self.pool.acquire() as conn:
                await alerts.delete_old(conn, max(1, round(self.retention_days)))
        room = CONCURRENCY - len(self._sending)
        if room <= 0:
            return
        lease = uuid.uuid4()
        async with self.pool.acquire() as conn:
            rows = await alerts.claim(conn, room, lease, LEASE_SECONDS)
        for row in rows:
            task = asyncio.create_task(self._attempt(row), name=f"alert-{row['id']}")
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _attempt(self, n: Record) -> None:
        body = rules.notification_body(n, self.base_url)
        try:
            sent = await self.sender.send(n["destination_type"], n["url"], n["secret"], body)
        except Exception as exc:  # a bug in sending must not lose the attempt's record
            log.exception("alert_send_crashed", notification_id=str(n["id"]))
            sent = Sent(False, None, rules.attempt_error(None, type(exc).__name__))
        attempts = n["attempts"] + 1
        now = datetime.now(UTC)
        outcome = rules.after_attempt(
            sent.delivered, attempts, n["created_at"], now, self.window_seconds
        )
        try:
            async with self._db, self.pool.acquire() as conn:
                await alerts.record_attempt(
                    conn,
                    n["id"],
                    n["lease_token"],
                    outcome.status.value,
                    sent.http_status,
                    sent.error,
                    outcome.retry_in_seconds,
                )
        except Exception as exc:
            if not db.is_transient(exc):
                raise
            # Not recorded: the lease runs out and the attempt is made again.
            log.warning("alert_attempt_not_recorded", notification_id=str(n["id"]))
            return
        log.info(
            "alert_attempted",
            notification_id=str(n["id"]),
            type=n["type"],
            status=outcome.status.value,
            http_status=sent.http_status,
        )
