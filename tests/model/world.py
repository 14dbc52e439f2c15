"""The model test's world: a private PostgreSQL cluster, an orchestrator process (``stepline
serve``, killed with ``kill -9`` and started again) and the app, served in this process on an
event loop of its own (the test's rules are synchronous and call into it)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import httpx
import uvicorn

from tests.chaos.postgres import PrivateCluster
from tests.chaos.procs import Proc, free_port, orchestrator_argv
from tests.chaos.scenario import _child_env, _cli
from tests.model.app import App

T = TypeVar("T")

LEASE_SECONDS = 2.0

# A run is stuck when it is not ended and has no way forward (the way-forward check's rule):
# the model test asserts there is never one, rather than waiting for the check to repair it.
STUCK = """
SELECT r.id FROM runs r
WHERE r.ready_at IS NULL AND r.ended_at IS NULL AND NOT r.held AND NOT r.paused
  AND NOT EXISTS (SELECT 1 FROM steps s WHERE s.run_id = r.id AND s.status = 'waiting'
                  AND s.kind IN ('callback', 'event', 'invoke'))
"""


class World:
    """Everything the model test drives; ``run`` runs a coroutine on its loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.workdir = Path(tempfile.mkdtemp(prefix="stepline-model-"))
        self.pg = PrivateCluster(free_port())
        self.app = App()
        self.key = ""
        self.orchestrator: Proc | None = None
        self.http: httpx.AsyncClient | None = None
        self._server: uvicorn.Server | None = None
        self._serving: asyncio.Future[None] | None = None
        self.kills = 0

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 120.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self) -> None:
        self.pg.init()
        self.pg.start()
        env = _child_env(DATABASE_URL=self.pg.admin_dsn, STEPLINE_LOG_LEVEL="warning")
        _cli(env, "migrate")
        self.key = _cli(env, "keys", "create", "--name", "model").strip().splitlines()[-1]
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        orch_env = {
            **env,
            "STEPLINE_LEASE_SECONDS": str(LEASE_SECONDS),
            "STEPLINE_DELIVERY_BACKOFF_MAX": "1s",
            "STEPLINE_PUBLIC_URL": url,
        }
        self.orchestrator = Proc(
            "orchestrator", orchestrator_argv(port), orch_env, url, self.workdir / "orch.log"
        )
        self.orchestrator.start()
        self.run(self._start())

    async def _start(self) -> None:
        assert self.orchestrator is not None
        await self.orchestrator.wait_ready("/healthz")
        self.http = httpx.AsyncClient(
            base_url=self.orchestrator.url,
            headers={"Authorization": f"Bearer {self.key}"},
            timeout=30.0,
        )
        app_port = free_port()
        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=app_port, log_level="warning", lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._serving = asyncio.ensure_future(self._server.serve())
        while not self._server.started:
            await asyncio.sleep(0.01)
        made = await self.call(
            "POST", "/v1/apps", {"name": "model", "url": f"http://127.0.0.1:{app_port}/"}
        )
        self.app.restart(made["signingSecret"])
        await self.call("POST", f"/v1/apps/{made['slug']}/sync")

    async def call(self, method: str, path: str, body: Any = None, *, ok: bool = True) -> Any:
        """A REST call, tried again while the orchestrator or the database is away; with
        ``ok``, a 4xx answer fails the test (else the answer is returned whatever it is)."""
        assert self.http is not None
        deadline = time.monotonic() + 60
        while True:
            try:
                answer = await self.http.request(method, path, json=body)
                if answer.status_code < 500:
                    if ok and answer.status_code >= 400:
                        raise AssertionError(f"{method} {path}: {answer.text}")
                    return answer.json() if ok else answer
                last = f"HTTP {answer.status_code}: {answer.text[:500]}"
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{method} {path} kept failing, last with {last}\n{self._orchestrator_log()}"
                )
            await asyncio.sleep(0.1)

    def _orchestrator_log(self, lines: int = 60) -> str:
        """The end of the orchestrator's log (what a failure quotes)."""
        path = self.workdir / "orch.log"
        if not path.exists():
            return "(no orchestrator log)"
        tail = path.read_text(errors="replace").splitlines()[-lines:]
        return "the orchestrator's log ends:\n" + "\n".join(line[:400] for line in tail)

    def kill_orchestrator(self) -> None:
        """``kill -9`` of the orchestrator, started again at once (its leases lapse)."""
        assert self.orchestrator is not None
        self.orchestrator.kill()
        self.kills += 1
        self.app.ex.epoch += 1
        self.orchestrator.start()
        self.run(self.orchestrator.wait_ready("/healthz"))

    def restart_postgres(self) -> None:
        """``pg_ctl restart -m immediate``: every connection cut, nothing checkpointed."""
        self.pg.restart_immediate()
        self.kills += 1
        self.app.ex.epoch += 1

    async def stuck(self) -> list[str]:
        """The runs without a way forward right now (there must be none)."""
        deadline = time.monotonic() + 30
        while True:
            try:
                conn = await asyncpg.connect(self.pg.admin_dsn)
                break
            except (OSError, asyncpg.PostgresError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
        try:
            return [str(r["id"]) for r in await conn.fetch(STUCK)]
        finally:
            await conn.close()

    async def _stop(self) -> None:
        """Stop the app cleanly: its parked executions, its server (waiting for it to shut
        down), the HTTP clients, then every task still pending on this loop."""
        for sl in self.app.built:
            sl.parked.clear()
        if self._server is not None:
            self._server.should_exit = True
            if self._serving is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._serving, 15)
        if self.http is not None:
            await self.http.aclose()
        for sl in self.app.built:
            with contextlib.suppress(Exception):
                await sl.aclose()
        me = asyncio.current_task()
        pending = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.run(self._stop(), timeout=60)
        if self.orchestrator is not None:
            self.orchestrator.close()
        self.pg.remove()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()
        shutil.rmtree(self.workdir, ignore_errors=True)
