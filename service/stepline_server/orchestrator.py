"""The orchestrator's running parts wired together: pool, signer, app caller and loops."""

from __future__ import annotations

import socket
import uuid

import httpx

from stepline.protocol import DescribeResponse
from stepline_server.invoke.client import AppCaller
from stepline_server.invoke.urls import CallbackSigner
from stepline_server.loops import listener
from stepline_server.loops.dispatcher import Dispatcher
from stepline_server.loops.supervisor import Supervisor
from stepline_server.loops.waiters import RunWaiters
from stepline_server.settings import Settings
from stepline_server.store import db, keys
from stepline_server.store.migrate import apply_migrations


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
        self.signer: CallbackSigner
        self.caller: AppCaller
        self.dispatcher: Dispatcher
        self.supervisor = Supervisor()
        self.waiters = RunWaiters()

    async def start(self) -> None:
        conn = await db.connect(self.dsn)
        try:
            await apply_migrations(conn)
            await keys.bootstrap(conn)
            secrets = await keys.server_secrets(conn)
        finally:
            await conn.close()
        self.pool = await db.create_pool(self.dsn, min_size=2, max_size=20)
        self.signer = CallbackSigner(secrets)
        self.caller = AppCaller(
            self.settings.invoke_timeout_seconds,
            max_connections=self.settings.max_inflight,
            transport=self._app_transport,
        )
        self.dispatcher = Dispatcher(self.pool, self.settings, self.caller, self.signer, self.owner)
        if self.run_loops:
            self.supervisor.add("dispatcher", self.dispatcher.run)
            self.supervisor.add("heartbeat", self.dispatcher.heartbeat)
            self.supervisor.add(
                "listener",
                lambda: listener.listen(self.dsn, self.dispatcher.wake, self.waiters.ended),
            )
            self.supervisor.start()

    async def after_sync(self, conn: db.Conn, app: db.Record, described: DescribeResponse) -> None:
        """Register what a sync found beyond workflows (schedules declared in code)."""

    async def stop(self) -> None:
        await self.supervisor.stop()
        await self.caller.aclose()
        await self.pool.close()
