"""The orchestrator's running parts wired together: pool, signer, app caller and loops."""

from __future__ import annotations

import asyncio
import socket
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from pydantic import ValidationError

from stepline.protocol import DescribeResponse, ScheduleSpec
from stepline_server import tracing
from stepline_server.engine import bulk as bulk_rules
from stepline_server.engine import schedules as schedule_rules
from stepline_server.engine.egress import Egress
from stepline_server.invoke.alerts import AlertSender
from stepline_server.invoke.client import AppCaller
from stepline_server.invoke.urls import CallbackSigner
from stepline_server.loops import gatherer, listener, repair, sweeper
from stepline_server.loops.alerts import AlertDelivery
from stepline_server.loops.batcher import ProgressBatcher
from stepline_server.loops.dispatcher import Dispatcher
from stepline_server.loops.operations import OperationsLoop
from stepline_server.loops.pull import PullInvocations
from stepline_server.loops.scheduler import Scheduler
from stepline_server.loops.supervisor import Supervisor
from stepline_server.loops.waiters import RunWaiters
from stepline_server.metrics import Metrics
from stepline_server.settings import Settings
from stepline_server.store import db, keys, schedules
from stepline_server.store.migrate import apply_migrations

if TYPE_CHECKING:
    import httpx


class Orchestrator:
    """Everything the API and the loops share; ``start`` migrates and starts the loops."""

    def __init__(
        self,
        settings: Settings,
        dsn: str,
        *,
        app_transport: httpx.AsyncBaseTransport | None = None,
        run_loops: bool = True,
    ) -> None:
        self.settings = settings
        self.dsn = dsn
        self.owner = f"{socket.gethostname()}:{uuid.uuid4().hex[:8]}"
        self.run_loops = run_loops
        self._app_transport = app_transport
        self.pool: db.Pool
        # Reads that may lag (lists, searches, dashboard pages, metrics): the replica of
        # STEPLINE_DATABASE_READ_URL, else the primary's pool. A client's own writes are read
        # back from the primary (GET /v1/runs/{id}), never from here.
        self.read_pool: db.Pool
        self.signer: CallbackSigner
        self.caller: AppCaller
        self.dispatcher: Dispatcher
        self.batcher: ProgressBatcher
        self.pull: PullInvocations
        self.scheduler: Scheduler
        self.operations: OperationsLoop
        self.alert_sender: AlertSender
        self.alerts: AlertDelivery
        self.supervisor = Supervisor()
        self.waiters = RunWaiters()
        self.state_waiters = RunWaiters()  # long polls on a run's published state
        self.metrics = Metrics()

    async def start(self) -> None:
        tracing.configure()
        conn = await db.connect(self.dsn)
        try:
            await apply_migrations(conn)
            await keys.bootstrap(conn)
            secrets = await keys.server_secrets(conn)
        finally:
            await conn.close()
        self.pool = await db.create_pool(self.dsn, min_size=2, max_size=20)
        read_url = self.settings.database_read_url
        self.read_pool = (
            await db.create_pool(read_url, min_size=0, max_size=10) if read_url else self.pool
        )
        self.signer = CallbackSigner(secrets)
        self.batcher = ProgressBatcher(self.pool, self.metrics)
        self.caller = AppCaller(
            self.settings.invoke_timeout_seconds,
            describe_timeout=self.settings.describe_timeout_seconds,
            max_connections=self.settings.max_inflight,
            transport=self._app_transport,
            egress=Egress.of(self.settings.app_networks),
        )
        self.dispatcher = Dispatcher(
            self.pool,
            self.settings,
            self.caller,
            self.signer,
            self.owner,
            self.batcher,
            self.metrics,
        )
        self.pull = PullInvocations(self.pool, self.dispatcher)
        self.alert_sender = AlertSender(Egress.of(self.settings.app_networks))
        self.alerts = AlertDelivery(
            self.pool,
            self.alert_sender,
            self.settings.base_url,
            poll_seconds=min(self.settings.poll_seconds, 1.0),
            retention_days=self.settings.retention_days,
        )
        self.scheduler = Scheduler(
            self.pool, self.settings, on_started=self.dispatcher.wake, metrics=self.metrics
        )
        self.operations = OperationsLoop(
            self.pool,
            batch_size=self.settings.bulk_batch_size,
            rest_seconds=self.settings.bulk_rest_seconds,
            on_acted=self.dispatcher.wake,
            on_retried=lambda workflow: self.metrics.run_started(workflow, bulk_rules.TRIGGER),
            retention_days=self.settings.retention_days,
        )
        if self.run_loops:
            self.supervisor.add("dispatcher", self.dispatcher.run)
            self.supervisor.add("scheduler", self.scheduler.run)
            self.supervisor.add("heartbeat", self.dispatcher.heartbeat)
            self.supervisor.add("alerts", self.alerts.run)
            self.supervisor.add("metrics", self._sample_forever)
            self.supervisor.add(
                "sweeper", lambda: sweeper.sweep(self.pool, self.settings.retention_days)
            )
            self.supervisor.add("repair", lambda: repair.check_forever(self.pool, self.metrics))
            self.supervisor.add("operations", self.operations.run)
            self.supervisor.add(
                "gatherer",
                lambda: gatherer.fire_forever(
                    self.pool,
                    self.metrics,
                    self.dispatcher.wake,
                    min(self.settings.poll_seconds, gatherer.GATHER_SECONDS),
                ),
            )
            self.supervisor.add(
                "listener",
                lambda: listener.listen(
                    self.dsn,
                    self.dispatcher.wake,
                    self.waiters.ended,
                    on_connected=self._listening,
                    on_schedule=self.scheduler.wake,
                    on_state=self.state_waiters.ended,
                ),
            )
            self.supervisor.start()

    def _listening(self) -> None:
        """The listener (re)connected: what it missed is unknown, so every long poll looks."""
        self.waiters.wake_all()
        self.state_waiters.wake_all()

    def sample(self) -> None:
        """Set this process's gauges (in flight, pool use) as they are now."""
        pool = self.pool
        self.metrics.sample_process(
            self.dispatcher.inflight, pool.get_size(), pool.get_idle_size(), pool.get_max_size()
        )

    async def _sample_forever(self, interval: float = 2.0) -> None:
        """Keep the gauges fresh between scrapes: with ``--workers``, a scrape is answered by
        one worker and reads the others' gauges as they last set them."""
        while True:
            self.sample()
            await asyncio.sleep(interval)

    async def after_sync(self, conn: db.Conn, app: db.Record, described: DescribeResponse) -> None:
        """Register what a sync found beyond workflows (schedules declared in code).

        A declared schedule that does not parse raises a ValidationError naming its field.
        """
        declared = {
            wf.name: _code_schedule(wf.name, wf.schedule)
            for wf in described.workflows
            if wf.schedule is not None
        }
        await schedules.sync_code(conn, app, declared, datetime.now(UTC))

    def closing(self) -> None:
        """The server shuts down: long polls answer now instead of holding it up."""
        pull = getattr(self, "pull", None)
        if pull is not None:
            pull.close()

    async def stop(self) -> None:
        await self.supervisor.stop()
        await self.caller.aclose()
        await self.alert_sender.aclose()
        if self.read_pool is not self.pool:
            await self.read_pool.close()
        await self.pool.close()


def _code_schedule(workflow: str, spec: ScheduleSpec) -> schedules.ScheduleDef:
    """A schedule declared in code, validated; errors name ``workflows.<name>.schedule.<field>``."""
    field = "cron"
    try:
        cron = schedule_rules.parse_cron(spec.cron)
        schedule_rules.parse_timezone(spec.timezone)
        field = "overlap"
        overlap = schedule_rules.OverlapPolicy(spec.overlap)
        field = "misfire"
        misfire = schedule_rules.MisfirePolicy(spec.misfire)
    except ValueError as exc:
        field = exc.field if isinstance(exc, schedule_rules.ScheduleError) else field
        error = {
            "type": "value_error",
            "loc": ("workflows", workflow, "schedule", field),
            "input": getattr(spec, field),
            "ctx": {"error": str(exc)},
        }
        raise ValidationError.from_exception_data("ScheduleSpec", [error]) from None  # type: ignore[list-item]
    return schedules.ScheduleDef(
        workflow=workflow,
        cron=cron,
        timezone=spec.timezone,
        input=spec.input,
        overlap=overlap,
        misfire=misfire,
        sla_ms=spec.sla_ms,
    )
