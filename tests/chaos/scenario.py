"""One chaos run: the private cluster, two orchestrators, the app, the load and the faults.

:func:`run` sets everything up in a temporary folder, starts the runs evenly over
``start_seconds`` while :func:`faults` kills and restarts processes at fixed fractions of that
window, waits (at most ``settle_seconds``) for every run to end, collects the runs' state and
history from the API and the app's records, and hands them to :mod:`tests.chaos.checks`.
Every process it started is killed and the folder removed in ``finally`` blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.chaos import checks
from tests.chaos.citus import CitusCluster, three_free_ports
from tests.chaos.config import Config
from tests.chaos.driver import Api, Ledger, RunLedger, drive_run, plan_runs
from tests.chaos.postgres import PrivateCluster
from tests.chaos.procs import Proc, free_port, orchestrator_argv, stepline_argv

__all__ = ["Fault", "Stack", "run"]


@dataclass
class Fault:
    """One injected fault: what, and when (wall clock) it began and was over."""

    kind: str  # kill-orchestrator, postgres-restart, kill-app
    targets: list[str]
    began: float
    ended: float = 0.0


@dataclass
class Stack:
    """The processes of one chaos run."""

    workdir: Path
    pg: PrivateCluster | CitusCluster
    orchestrators: list[Proc] = field(default_factory=list)
    app: Proc | None = None
    key: str = ""

    def close(self) -> None:
        for proc in [*self.orchestrators, *([self.app] if self.app else [])]:
            proc.close()
        self.pg.remove()


def _child_env(**changes: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STEPLINE_", "CHAOS_"))}
    env.pop("DATABASE_URL", None)
    env.update(changes)
    return env


def _cli(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        stepline_argv(*args), env=env, capture_output=True, text=True, timeout=120, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"stepline {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


async def _setup(stack: Stack, config: Config) -> tuple[Api, str]:
    pg = stack.pg
    await asyncio.to_thread(pg.init)
    await asyncio.to_thread(pg.start)
    dsn = pg.admin_dsn
    base_env = _child_env(DATABASE_URL=dsn, STEPLINE_LOG_LEVEL="info")
    await asyncio.to_thread(_cli, base_env, "migrate")
    out = await asyncio.to_thread(_cli, base_env, "keys", "create", "--name", "chaos")
    stack.key = out.strip().splitlines()[-1].strip()
    for n in (1, 2):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = {
            **base_env,
            "STEPLINE_LEASE_SECONDS": str(config.lease_seconds),
            # A run whose invocations failed many times in a row (app down, then injected
            # 503s) is tried again within seconds, so it ends within the settle window.
            "STEPLINE_DELIVERY_BACKOFF_MAX": "3s",
            "STEPLINE_PUBLIC_URL": url,
        }
        stack.orchestrators.append(
            Proc(
                f"orchestrator-{n}",
                orchestrator_argv(port),
                env,
                url,
                stack.workdir / f"orch{n}.log",
            )
        )
    for orch in stack.orchestrators:
        orch.start()
    await asyncio.gather(*(o.wait_ready("/healthz") for o in stack.orchestrators))
    api = Api([o.url for o in stack.orchestrators], stack.key)
    app_port = free_port()
    app_url = f"http://127.0.0.1:{app_port}"
    created = await api.call("POST", "/v1/apps", {"name": "chaos", "url": app_url + "/"})
    if created.status_code != 201:
        raise RuntimeError(f"POST /v1/apps answered {created.status_code}: {created.text}")
    app_info = created.json()
    app_env = _child_env(
        STEPLINE_SIGNING_SECRET=str(app_info["signingSecret"]),
        CHAOS_RECORDS=str(stack.workdir / "records.jsonl"),
        CHAOS_FAIL_RATE=str(config.fail_rate),
        CHAOS_API_KEY=stack.key,
    )
    argv = [
        sys.executable, "-m", "uvicorn", "tests.chaos.app:app", "--host", "127.0.0.1",
        "--port", str(app_port), "--log-level", "warning", "--no-access-log",
    ]  # fmt: skip
    stack.app = Proc("app", argv, app_env, app_url, stack.workdir / "app.log")
    stack.app.start()
    await stack.app.wait_ready("/")
    synced = await api.call("POST", f"/v1/apps/{app_info['slug']}/sync")
    if synced.status_code != 200:
        raise RuntimeError(f"sync answered {synced.status_code}: {synced.text}")
    return api, app_url


async def _restart(procs: list[Proc]) -> None:
    for proc in procs:
        proc.start()
    await asyncio.gather(*(p.wait_ready("/healthz" if p.name != "app" else "/") for p in procs))


async def faults(stack: Stack, config: Config, log: list[Fault]) -> None:
    """The fault schedule, spread over the start window."""
    o1, o2 = stack.orchestrators
    assert stack.app is not None
    app = stack.app

    async def kill(procs: list[Proc]) -> None:
        fault = Fault(
            "kill-orchestrator" if app not in procs else "kill-app",
            [p.name for p in procs],
            time.time(),
        )
        log.append(fault)
        for proc in procs:
            proc.kill()
        await asyncio.sleep(config.app_down_seconds if app in procs else config.down_seconds)
        await _restart(procs)
        fault.ended = time.time()

    async def pg_restart() -> None:
        fault = Fault("postgres-restart", ["postgres"], time.time())
        log.append(fault)
        await asyncio.to_thread(stack.pg.restart_immediate)
        fault.ended = time.time()

    schedule: list[tuple[float, Callable[[], Awaitable[None]]]] = [
        (0.15, lambda: kill([o1])),
        (0.30, lambda: kill([o2])),
        (0.45, lambda: kill([o1, o2])),
        (0.62, pg_restart),
        (0.80, lambda: kill([app])),
    ]
    began = time.monotonic()
    for fraction, action in schedule:
        delay = began + fraction * config.start_seconds - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        await action()


async def _load(api: Api, ledger: Ledger, config: Config, deadline: float) -> None:
    gap = config.start_seconds / max(1, len(ledger.runs))
    poll = 1.0 if config.runs > 50 else 0.5
    tasks = []
    began = time.monotonic()
    for n, entry in enumerate(ledger.runs):
        delay = began + n * gap - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(drive_run(api, entry, config, deadline, poll)))
    await asyncio.gather(*tasks)


async def _history(api: Api, run_id: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    after = 0
    for _ in range(1000):
        page = (await api.call("GET", f"/v1/runs/{run_id}/events?after={after}&limit=500")).json()
        batch = page.get("events") or []
        events.extend(batch)
        if not batch or (not page.get("nextCursor") and len(batch) < 500):
            break
        after = int(batch[-1]["seq"])
    return events


async def _collect(api: Api, ledger: Ledger) -> checks.Observed:
    observed = checks.Observed()

    async def one(entry: RunLedger) -> None:
        if entry.run_id is None:
            return
        response = await api.call("GET", f"/v1/runs/{entry.run_id}")
        if response.status_code != 200:
            return
        observed.runs[entry.run_id] = response.json()
        observed.histories[entry.run_id] = await _history(api, entry.run_id)

    await asyncio.gather(*(one(e) for e in ledger.runs))
    cursor: str | None = None
    for _ in range(1000):  # every run of the workflow, to find duplicates per run key
        query = "/v1/runs?workflow=chaos&limit=500" + (f"&cursor={cursor}" if cursor else "")
        page = (await api.call("GET", query)).json()
        observed.listed.extend(page.get("runs") or [])
        cursor = page.get("nextCursor")
        if not cursor:
            break
    return observed


def _read_records(path: Path) -> list[dict[str, Any]]:
    records = []
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                records.append(json.loads(line))
    return records


async def run(config: Config, out: Callable[[str], None] = print) -> checks.Report:
    """One chaos run end to end; the report says which invariants held."""
    workdir = Path(tempfile.mkdtemp(prefix="stepline-chaos-"))
    pg = CitusCluster(three_free_ports()) if config.citus else PrivateCluster(free_port())
    stack = Stack(workdir, pg)
    fault_log: list[Fault] = []
    api: Api | None = None
    try:
        api, _ = await _setup(stack, config)
        ledger = Ledger([RunLedger(p) for p in plan_runs(config, uuid.uuid4().hex[:8])])
        low, high = config.step_ms
        out(
            f"chaos ({config.size}{', stress' if config.stress else ''}"
            f"{', on Citus' if config.citus else ''}): {config.runs} runs "
            f"over {config.start_seconds:.0f} s, lease {config.lease_seconds:g} s, "
            f"steps {low}-{high} ms"
        )
        began = time.time()
        deadline = time.monotonic() + config.start_seconds + config.settle_seconds
        await asyncio.gather(_load(api, ledger, config, deadline), faults(stack, config, fault_log))
        for fault in fault_log:
            out(f"  fault {fault.kind} {','.join(fault.targets)} at +{fault.began - began:.1f} s")
        out(f"  load done after {time.time() - began:.1f} s; collecting")
        # The app's records first: an invocation it received had its begin committed before,
        # so the histories read next have it; read after them, the records would hold
        # invocations of runs still going begun since (none of those in their histories).
        records = _read_records(workdir / "records.jsonl")
        observed = await _collect(api, ledger)
        observed.records = records
        if config.keep:
            dump = {"runs": observed.runs, "histories": observed.histories}
            (workdir / "observed.json").write_text(json.dumps(dump))
        names = {o.url: o.name for o in stack.orchestrators}
        report = checks.check(ledger, observed, fault_log, stack.pg.deadlocks(), api.retried, names)
        if config.keep:
            out(f"  logs and records kept in {workdir}")
        return report
    except httpx.HTTPError as exc:
        raise RuntimeError(f"chaos setup failed: {exc!r}") from exc
    finally:
        if api is not None:
            await api.close()
        if config.keep:
            with contextlib.suppress(OSError):
                shutil.copy(stack.pg.log_path, workdir / "postgres.log")
        await asyncio.to_thread(stack.close)
        if not config.keep:
            shutil.rmtree(workdir, ignore_errors=True)
