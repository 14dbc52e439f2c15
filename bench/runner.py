"""Set up the processes, run the chosen workloads in order, and gather the rows.

Order: PostgreSQL (see :func:`bench.procs.database`), ``stepline serve`` on a free port (it
applies the migrations), an API key from ``stepline keys create``, the app registered with
``POST /v1/apps`` (its signing secret handed to the app process in ``STEPLINE_SIGNING_SECRET``),
the app under uvicorn, ``sync``, a short warm-up, then the workloads. ``idle`` always runs last:
its sleeping runs stay (an hour) in the database.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import stepline
from bench import bulk, procs, scale, workloads
from bench.procs import ROOT, Monitor, Service

WORKLOADS = ("steps", "keyed", "fanout", "sleep", "callback", "long", "idle", "scale", "bulk")
# scale fills the database and bulk makes 10,000 failed runs: only when asked for
DEFAULT_WORKLOADS = WORKLOADS[:-2]


@dataclass
class Config:
    """Sizes and options of one benchmark run (the defaults are the published figures)."""

    workloads: list[str] = field(default_factory=lambda: list(DEFAULT_WORKLOADS))
    runs: int = 200
    steps: int = 10
    latency_repeats: int = 10
    fanout: int = 100
    sleep_ms: int = 1000
    long: list[int] = field(default_factory=lambda: [10, 100, 1000])
    long_every: int = 10  # long-sleep-N-canK: continue as new after each K iterations
    big_steps: int = 20
    big_kb: int = 900
    keyed_runs: int = 1000
    keyed_keys: int = 100
    idle_runs: int = 10_000
    idle_window: float = 60.0
    timeout: float = 600.0
    database_url: str | None = None
    log_level: str = "info"
    workers: int = 1
    keep_logs: bool = False
    scale_ended: int = 1_000_000
    scale_sleeping: int = 100_000
    bulk_runs: int = 10_000  # failed runs the bulk workload retries
    codec: bool = False  # the app encrypts every value it sends (stepline.Encryption)


QUICK = {
    "runs": 20,
    "keyed_runs": 100,
    "keyed_keys": 10,
    "latency_repeats": 5,
    "fanout": 20,
    "long": [10, 100],
    "idle_runs": 500,
    "idle_window": 5.0,
    "timeout": 120.0,
}


@dataclass
class Report:
    meta: dict[str, Any]
    rows: list[dict[str, Any]]
    log_dir: Path | None


def commit() -> str:
    """The project's commit (with ``+dirty`` for local changes), or ``none``."""

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=False
        )
        return done.stdout.strip() if done.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD") or "none"
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return head + ("+dirty" if dirty else "")


async def _workloads(bench: workloads.Bench, config: Config, dsn: str) -> list[workloads.Result]:
    chosen = set(config.workloads)
    results: list[workloads.Result] = []
    if "steps" in chosen:
        results += await workloads.steps(bench, config.runs, config.steps)
        results += await workloads.latency(bench, config.latency_repeats, config.steps)
    if "keyed" in chosen:
        results += await workloads.keyed(bench, config.keyed_runs, config.keyed_keys, config.steps)
    if "fanout" in chosen:
        results += await workloads.fanout(bench, config.fanout)
    if "sleep" in chosen:
        results += await workloads.sleep(bench, config.runs, config.sleep_ms)
    if "callback" in chosen:
        results += await workloads.callback(bench, config.runs)
    if "long" in chosen:
        results += await workloads.long(bench, config.long)
        results += await workloads.long_sleep(bench, config.long)
        results += await workloads.long_sleep(bench, config.long, every=config.long_every)
        results += await workloads.big(bench, config.big_steps, config.big_kb)
    if "bulk" in chosen:
        results += await bulk.bulk(bench, config.bulk_runs, config.latency_repeats, config.steps)
    if "idle" in chosen:
        results += await workloads.idle(bench, config.idle_runs, config.idle_window)
    if "scale" in chosen:
        results += await scale.scale(
            bench,
            dsn,
            config.runs,
            config.steps,
            config.sleep_ms,
            config.scale_ended,
            config.scale_sleeping,
        )
    return results


async def run(config: Config, progress: bool = True) -> Report:
    """Run the benchmark described by ``config``; every process is ended before returning."""
    unknown = set(config.workloads) - set(WORKLOADS)
    if unknown:
        raise ValueError(f"unknown workloads: {', '.join(sorted(unknown))}")
    log_dir = Path(tempfile.mkdtemp(prefix="stepline-bench-"))
    log_dir.chmod(0o755)
    ok = False

    def say(text: str) -> None:
        if progress:
            print(f"[bench] {text}", flush=True)

    try:
        async with procs.database(config.database_url) as db:
            say(f"PostgreSQL {db.version} ({db.kind}); logs in {log_dir}")
            report = await _with_database(config, db, log_dir, say)
        ok = True
        return report
    finally:
        if ok and not config.keep_logs:
            shutil.rmtree(log_dir, ignore_errors=True)
        elif progress:
            print(f"[bench] logs kept in {log_dir}", flush=True)


async def _with_database(config: Config, db: procs.Database, log_dir: Path, say: Any) -> Report:
    orch_port, app_port = procs.free_port(), procs.free_port()
    orch_env = procs.tool_env(
        os.environ,
        DATABASE_URL=db.dsn,
        STEPLINE_HOST="127.0.0.1",
        STEPLINE_PORT=str(orch_port),
        STEPLINE_LOG_LEVEL=config.log_level,
        STEPLINE_WORKERS=str(config.workers),
        STEPLINE_DATA_DIR=str(log_dir / "data"),
    )
    orch = Service(
        "orchestrator",
        procs.orchestrator_argv(),
        orch_env,
        f"http://127.0.0.1:{orch_port}",
        log_dir / "orchestrator.log",
        cwd=log_dir,
    )
    app: Service | None = None
    monitor = Monitor()
    try:
        orch.start()
        await orch.wait_ready("/readyz")
        key = await asyncio.to_thread(procs.create_key, orch_env, log_dir)
        # With --codec the load generator encrypts inputs and decrypts outputs, as the app does.
        codec = stepline.Encryption(keys={"bench": bytes(range(32))}) if config.codec else None
        async with (
            stepline.AsyncClient(orch.url, api_key=key, codec=codec) as api,
            stepline.AsyncClient(orch.url, api_key=key, codec=codec) as waiter,
        ):
            app_base = f"http://127.0.0.1:{app_port}"
            # A name of its own, so a database given with --database-url can be used again.
            name = f"bench-{uuid.uuid4().hex[:8]}"
            created = await api.create_app(name, app_base + "/stepline/")
            app = Service(
                "app",
                procs.app_argv(app_port),
                procs.tool_env(
                    os.environ,
                    STEPLINE_SIGNING_SECRET=created["signingSecret"],
                    STEPLINE_BENCH_CODEC="1" if config.codec else "",
                ),
                app_base,
                log_dir / "app.log",
            )
            app.start()
            await app.wait_ready("/stats")
            await api.sync_app(created["slug"])
            say(f"orchestrator pid {orch.pid} on {orch.url}; app pid {app.pid} on {app_base}")
            monitor.add("orchestrator", orch.pid, children=config.workers > 1)
            monitor.add("app", app.pid)
            if db.postmaster_pid is not None:
                # A shared server: count its auxiliary processes and our database's backends.
                keep = None if db.kind == "embedded" else procs.backend_filter(db.name)
                monitor.add("postgres", db.postmaster_pid, children=True, keep=keep)
            monitor.add("loadgen", os.getpid())
            monitor.start()
            bench = workloads.Bench(api, waiter, orch.url, app_base, monitor, config.timeout)
            try:
                await workloads.warmup(bench)
                started = time.monotonic()
                results = await _workloads(bench, config, db.dsn)
                say(f"workloads took {time.monotonic() - started:.1f} s")
            finally:
                await bench.aclose()
            if bench.errors:
                say("errors: " + " | ".join(bench.errors[:5]))
    finally:
        monitor.close()
        if app is not None:
            app.stop()
        orch.stop()
    meta = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit(),
        "machine": procs.describe_machine(),
        "postgres": {
            "kind": db.kind,
            "version": db.version,
            "shared": db.kind != "embedded",
        },
        "config": {
            k: v for k, v in config.__dict__.items() if k not in ("database_url", "keep_logs")
        },
        "orchestrator": " ".join(procs.orchestrator_argv()),
        "errors": bench.errors,
    }
    return Report(meta, [r.as_json() for r in results], log_dir)
