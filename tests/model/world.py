"""The model test's world: a private PostgreSQL cluster, two live orchestrator processes on one
database (``stepline serve``, either killed with ``kill -9`` and started again), the push app,
served in this process on an event loop of its own (the test's rules are synchronous and call
into it), a pull app's two worker processes (``stepline worker``, one polling each
orchestrator; a worker that died is started again), and the doomed pull app's worker (its step
kills it every time; started again, it polls the other orchestrator, so that each lapsed lease
is taken over by the orchestrator that did not give it). REST calls go to the orchestrators in
turn."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import shutil
import tempfile
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import httpx
import uvicorn

from tests.chaos.postgres import PrivateCluster
from tests.chaos.procs import Proc, free_port, orchestrator_argv, stepline_argv
from tests.chaos.scenario import _child_env, _cli
from tests.model import fleet, pull_app
from tests.model.app import App, Execution

T = TypeVar("T")

LEASE_SECONDS = 2.0
ORCHESTRATORS = 2
WORKERS = 2
CROWD = "crowd"  # another environment, its bulk retry held for good (_start_crowd)
CROWD_RUNS = 50
BULK_BATCH_SIZE = 2  # the crowd's retry then lasts minutes (50 runs, two at a time)
DELIVERY_WINDOW = "15s"  # how long a run's deliveries may fail before it ends app_unreachable


class World:
    """Everything the model test drives; ``run`` runs a coroutine on its loop."""

    def __init__(self, fleet: bool = False) -> None:
        self.fleet = fleet  # with the app fleet of two protocol versions (tests/model/fleet.py)
        self.fleet_slug = ""
        self.front: fleet.Front | None = None
        self.replicas: list[Proc] = []
        self._servers: list[tuple[uvicorn.Server, asyncio.Future[None]]] = []
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.workdir = Path(tempfile.mkdtemp(prefix="stepline-model-"))
        self.pg = PrivateCluster(free_port())
        self.app = App()
        self.key = ""
        self.orchestrators: list[Proc] = []
        self.clients: list[httpx.AsyncClient] = []
        self._turn = itertools.count()
        self._server: uvicorn.Server | None = None
        self._serving: asyncio.Future[None] | None = None
        self.kills = 0
        self.pg_restarts = 0
        self.pg_restart_times: list[float] = []  # when each began (epoch seconds)
        self.workers: list[Proc] = []
        self.doomed_worker: Proc | None = None  # the doomed pull app's (pull_app.doomed)
        self.doomed_slug = ""
        self.doomed_deaths = 0  # how often it was started again (each time: the other orch)
        self.record = self.workdir / "pull.jsonl"
        self._env: dict[str, str] = {}
        self.app_urls: list[str] = []  # the push app's two deployments' URLs
        self.app_slug = ""
        self.deployed = 0  # which of app_urls is the app's current deployment's
        self.crowd_key = ""  # the other environment's (_start_crowd)
        self.crowd_operation = ""

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 120.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self) -> None:
        self.pg.init()
        self.pg.start()
        env = _child_env(DATABASE_URL=self.pg.admin_dsn, STEPLINE_LOG_LEVEL="warning")
        self._env = env
        _cli(env, "migrate")
        self.key = _cli(env, "keys", "create", "--name", "model").strip().splitlines()[-1]
        for i in range(ORCHESTRATORS):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            orch_env = {
                **env,
                "STEPLINE_LEASE_SECONDS": str(LEASE_SECONDS),
                "STEPLINE_DELIVERY_BACKOFF_MAX": "1s",
                "STEPLINE_DELIVERY_WINDOW": DELIVERY_WINDOW,
                "STEPLINE_BULK_BATCH_SIZE": str(BULK_BATCH_SIZE),
                "STEPLINE_PUBLIC_URL": url,
            }
            log = self.workdir / f"orch{i}.log"
            self.orchestrators.append(Proc(f"orch{i}", orchestrator_argv(port), orch_env, url, log))
            self.orchestrators[-1].start()
        self.run(self._start())

    async def _start(self) -> None:
        for orch in self.orchestrators:
            await orch.wait_ready("/healthz")
            self.clients.append(
                httpx.AsyncClient(
                    base_url=orch.url,
                    headers={"Authorization": f"Bearer {self.key}"},
                    timeout=30.0,
                )
            )
        app_port = free_port()
        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=app_port, log_level="warning", lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._serving = asyncio.ensure_future(self._server.serve())
        while not self._server.started:
            await asyncio.sleep(0.01)
        # The same app at a second URL: each deploy (a new deployment) takes the other one.
        other = await self._serve(self.app)
        self.app_urls = [f"http://127.0.0.1:{app_port}/", other + "/"]
        made = await self.call("POST", "/v1/apps", {"name": "model", "url": self.app_urls[0]})
        self.app_slug = made["slug"]
        self.app.restart(made["signingSecret"])
        await self.call("POST", f"/v1/apps/{made['slug']}/sync")
        pull = await self.call("POST", "/v1/apps", {"name": "model-pull", "kind": "pull"})
        for i in range(WORKERS):
            argv = self._worker_argv("sl", pull["slug"], self.orchestrators[i % ORCHESTRATORS])
            env = {**self._env, "STEPLINE_MODEL_RECORD": str(self.record)}
            self.workers.append(Proc(f"worker{i}", argv, env, "", self.workdir / f"w{i}.log"))
            self.workers[-1].start()
        # The doomed run's app has a worker of its own: one it kills loses no other run's try.
        doomed = await self.call("POST", "/v1/apps", {"name": "model-doomed", "kind": "pull"})
        self.doomed_slug = doomed["slug"]
        argv = self._doomed_argv(self.orchestrators[0])
        env = {**self._env, "STEPLINE_MODEL_RECORD": str(self.record)}
        self.doomed_worker = Proc("doomed-worker", argv, env, "", self.workdir / "wd.log")
        self.doomed_worker.start()
        deadline = time.monotonic() + 60
        while not all(
            pull_app.PREFIX + name in shown
            for shown in [str(await self.call("GET", "/v1/workflows"))]
            for name in ("flow", "doomed")
        ):
            assert time.monotonic() < deadline, "the pull apps' workers never synced"
            await asyncio.sleep(0.1)
        if self.fleet:
            await self._start_fleet()
        await self._start_crowd()

    async def _start_crowd(self) -> None:
        """Another environment whose bulk retry waits for room most of the time (its runs are
        a pull app's that no worker polls, so the ones it retried are never taken, and each
        batch of two goes only after the longest wait for room): the model's own bulk
        operations must go on beside it (operations of different environments take turns)."""
        await asyncio.to_thread(_cli, self._env, "environments", "create", CROWD)
        made = await asyncio.to_thread(
            _cli, self._env, "keys", "create", "--name", CROWD, "--environment", CROWD
        )
        key = self.crowd_key = made.strip().splitlines()[-1]
        app = await self.call("POST", "/v1/apps", {"name": CROWD, "kind": "pull"}, key=key)
        description = {"workflows": [{"name": "stalled"}]}
        await self.call("POST", f"/v1/apps/{app['slug']}/sync", description, key=key)
        for _ in range(CROWD_RUNS):
            await self.call("POST", "/v1/runs", {"workflow": "stalled"}, key=key)
        await self.arm_crowd()

    async def arm_crowd(self) -> None:
        """Unless the crowd's bulk retry still runs, cancel its runs and retry them again in
        one operation (which takes minutes: see _start_crowd)."""
        if self.crowd_operation and (await self.crowd_op())["status"] == "running":
            return
        for action, status in (("cancel", "running"), ("retry", "cancelled")):
            body = {"action": action, "filter": {"workflow": "stalled", "status": status}}
            made = await self.call("POST", "/v1/runs/bulk", body, key=self.crowd_key)
            self.crowd_operation = made["id"]
            if action == "cancel":
                deadline = time.monotonic() + 60
                while (await self.crowd_op())["status"] == "running":
                    assert time.monotonic() < deadline, "the crowd's cancel never ended"
                    await asyncio.sleep(0.1)

    def port(self) -> int:
        """The port of the push app's current deployment."""
        return int(self.app_urls[self.deployed].rstrip("/").rsplit(":", 1)[1])

    async def deploy(self) -> None:
        """A new deployment of the push app at its other URL, made current: the runs started
        before stay on theirs."""
        other = 1 - self.deployed
        body = {"url": self.app_urls[other]}
        await self.call("POST", f"/v1/apps/{self.app_slug}/deployments", body)
        self.deployed = other

    async def crowd_op(self) -> dict[str, Any]:
        """The crowd environment's last bulk operation as the API shows it."""
        path = f"/v1/operations/{self.crowd_operation}"
        return dict(await self.call("GET", path, key=self.crowd_key))

    async def _start_fleet(self) -> None:
        """The fleet's front, the app registered at it, then its two replicas and a sync."""
        env = {**self._env, "STEPLINE_MODEL_RECORD": str(self.record)}
        self.replicas = fleet.replicas(self.workdir, env, "")
        front = self.front = fleet.Front([r.url for r in self.replicas])
        url = await self._serve(front)
        made = await self.call("POST", "/v1/apps", {"name": "model-fleet", "url": url + "/"})
        for replica in self.replicas:
            replica.env["STEPLINE_MODEL_FLEET_SECRET"] = made["signingSecret"]
            replica.start()
        for replica in self.replicas:
            await replica.wait_ready("/")
        self.fleet_slug = made["slug"]
        await self.call("POST", f"/v1/apps/{self.fleet_slug}/sync")

    async def _serve(self, app: Any) -> str:
        port = free_port()
        config = uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"
        )
        server = uvicorn.Server(config)
        self._servers.append((server, asyncio.ensure_future(server.serve())))
        while not server.started:
            await asyncio.sleep(0.01)
        return f"http://127.0.0.1:{port}"

    def _worker_argv(self, attr: str, slug: str, orch: Proc, concurrency: int = 4) -> list[str]:
        """A ``stepline worker`` of ``tests.model.pull_app``'s ``attr`` for app ``slug``,
        polling ``orch``."""
        return stepline_argv(
            "worker", f"tests.model.pull_app:{attr}", "--app", slug, "--url", orch.url,
            "--api-key", self.key, "--wait", "5", "--concurrency", str(concurrency),
            "--drain", "1",
        )  # fmt: skip

    def _doomed_argv(self, orch: Proc) -> list[str]:
        """The doomed app's worker, polling ``orch``: one invocation at a time, so that each
        it claims runs its step (two claimed at once: the first step run would kill the
        other's try before its step ran)."""
        return self._worker_argv("doomed", self.doomed_slug, orch, concurrency=1)

    def revive_workers(self) -> None:
        """Start again each worker that died: the model's (a kill, a fault that touches the
        runs it held) and the doomed app's (its step kills it every time; it touches no other
        run), which then polls the other orchestrator."""
        for worker in self.workers:
            if worker.proc is not None and worker.proc.poll() is not None:
                self.app.ex.epoch += 1
                worker.start()
        doomed = self.doomed_worker
        if doomed is not None and doomed.proc is not None and doomed.proc.poll() is not None:
            self.doomed_deaths += 1
            orch = self.orchestrators[self.doomed_deaths % ORCHESTRATORS]
            doomed.argv = self._doomed_argv(orch)
            doomed.start()

    def kill_worker(self, which: int) -> None:
        """``kill -9`` of worker ``which`` (mid-step, maybe), started again at once."""
        self.workers[which].kill()
        self.app.ex.epoch += 1
        self.workers[which].start()

    def executions(self) -> list[Execution]:
        """Every step execution, the push app's and the workers'."""
        return self.app.ex.seen + pull_app.read(self.record)

    async def call(
        self, method: str, path: str, body: Any = None, *, ok: bool = True, key: str = ""
    ) -> Any:
        """A REST call, tried again while the orchestrator or the database is away; with
        ``ok``, a 4xx answer fails the test (else the answer is returned whatever it is). Each
        try goes to the next orchestrator. ``key``: another key than the model's (another
        environment's)."""
        deadline = time.monotonic() + 60
        headers = {"Authorization": f"Bearer {key}"} if key else None
        while True:
            http = self.clients[next(self._turn) % len(self.clients)]
            try:
                answer = await http.request(method, path, json=body, headers=headers)
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

    def _orchestrator_log(self, lines: int = 40) -> str:
        """The end of each orchestrator's log (what a failure quotes)."""
        return "\n".join(
            f"{orch.name}'s log ends:\n{orch.tail(lines)}" for orch in self.orchestrators
        )

    def kill_orchestrator(self, which: int) -> None:
        """``kill -9`` of orchestrator ``which``, started again at once (its leases lapse,
        the other takes its runs over or it does once back)."""
        orch = self.orchestrators[which]
        orch.kill()
        self.kills += 1
        self.app.ex.epoch += 1
        orch.start()
        self.run(orch.wait_ready("/healthz"))

    def restart_postgres(self) -> None:
        """``pg_ctl restart -m immediate``: every connection cut, nothing checkpointed."""
        self.pg_restart_times.append(time.time())
        self.pg.restart_immediate()
        self.kills += 1
        self.pg_restarts += 1
        self.app.ex.epoch += 1

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
        for server, serving in self._servers:
            server.should_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(serving, 15)
        for http in self.clients + ([self.front.http] if self.front else []):
            await http.aclose()
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
        doomed = [self.doomed_worker] if self.doomed_worker else []
        for proc in self.workers + doomed + self.replicas + self.orchestrators:
            proc.close()
        self.pg.remove()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()
        shutil.rmtree(self.workdir, ignore_errors=True)
