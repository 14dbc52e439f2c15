"""Crashes: the app killed mid-run, the orchestrator killed with SIGKILL; runs still complete."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg
import httpx
import pytest

import stepline
from stepline_server.store import apps, db, keys
from tests.apps import counting_app
from tests.support import app_server, free_port, orchestrator_stack

pytestmark = pytest.mark.slow

SECRET = "crash-secret"
SERVE = [sys.executable, "-m", "stepline_server.cli.main", "serve"]


def _spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        args,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


async def _until_up(url: str, proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
    async with httpx.AsyncClient() as http:
        for _ in range(int(timeout / 0.05)):
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
            try:
                await http.get(url)
                return
            except httpx.HTTPError:
                await asyncio.sleep(0.05)
    raise TimeoutError(url)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@asynccontextmanager
async def _app_process(port: int, count_file: Path) -> AsyncIterator[subprocess.Popen[bytes]]:
    proc = _spawn(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "tests.apps.counting_app:app",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        {"STEPLINE_SIGNING_SECRET": SECRET, "COUNT_FILE": str(count_file)},
    )
    try:
        await _until_up(f"http://127.0.0.1:{port}/", proc)
        yield proc
    finally:
        _kill(proc)


async def _step_status(client: stepline.AsyncClient, run_id: str, name: str) -> str | None:
    run = await client.get_run(run_id)
    return next((s["status"] for s in run["steps"] if s["name"] == name), None)


async def _register(client: stepline.AsyncClient, conn: asyncpg.Connection, app_url: str) -> None:
    """Register the app at ``app_url`` with the secret its workflows are signed with."""
    app = await client.create_app("local", app_url)
    await conn.execute(
        "UPDATE apps SET signing_secrets = $1 WHERE id = $2", [SECRET], uuid.UUID(app["id"])
    )
    await client.sync_app(app["slug"])


def _orchestrator_env(database_url: str, port: int) -> dict[str, str]:
    return {
        "DATABASE_URL": database_url,
        "STEPLINE_PORT": str(port),
        "STEPLINE_LEASE_SECONDS": "2",
        "STEPLINE_POLL_SECONDS": "0.5",
        "STEPLINE_LOG_LEVEL": "warning",
    }


async def test_app_killed_mid_run_and_restarted(database_url: str, tmp_path: Path) -> None:
    """The app dies in the middle of a step; once it is back the run completes, and the steps
    recorded before the crash did not run again."""
    counts = tmp_path / "counts"
    port = free_port()
    async with orchestrator_stack(database_url) as stack:
        async with stack.orchestrator.pool.acquire() as conn:
            row = await apps.create(
                conn, keys.DEFAULT_PROJECT, "crashy", f"http://127.0.0.1:{port}/", SECRET
            )
        async with _app_process(port, counts) as proc:
            await stack.client.sync_app(row["slug"])
            run = await stack.client.start_run("slow-steps", {"steps": 4, "delay": 0.4})
            while await _step_status(stack.client, run["id"], "s2") != "running":
                await asyncio.sleep(0.05)
            _kill(proc)
        async with _app_process(port, counts):
            done = await stack.client.wait_run(run["id"], timeout=60)
        assert done["status"] == "completed", done
        assert done["output"] == [0, 1, 4, 9]
        ran = Counter(counts.read_text().split())
        assert ran["s0"] == 1 and ran["s1"] == 1 and ran["s3"] == 1
        assert ran["s2"] >= 1
        types = [e["type"] async for e in stack.client.iter_run_events(run["id"])]
        assert "invocation.ended" in types and types[-1] == "run.completed"


async def test_orchestrator_sigkill_mid_run_then_restart(database_url: str, tmp_path: Path) -> None:
    """SIGKILL of the orchestrator mid-run: after a restart the run completes, every step has
    exactly one recorded result, and recorded steps never ran again."""
    counts = tmp_path / "counts"
    os.environ["COUNT_FILE"] = str(counts)
    counting_app.sl.signing_secrets = (SECRET,)
    port = free_port()
    env = _orchestrator_env(database_url, port)
    conn = await db.connect(database_url)
    try:
        orch = _spawn(SERVE, env)
        base = f"http://127.0.0.1:{port}"
        try:
            await _until_up(base + "/healthz", orch)
            key = await keys.create_key(conn, "crash")
            async with (
                app_server(counting_app.sl) as app_url,
                stepline.AsyncClient(base, api_key=key) as client,
            ):
                await _register(client, conn, app_url)
                run = await client.start_run("slow-steps", {"steps": 6, "delay": 0.25})
                while await _step_status(client, run["id"], "s2") != "completed":
                    await asyncio.sleep(0.05)
                _kill(orch)
                orch = _spawn(SERVE, env)
                await _until_up(base + "/healthz", orch)
                done = await client.wait_run(run["id"], timeout=60)
        finally:
            _kill(orch)
        assert done["status"] == "completed", done
        assert done["output"] == [i * i for i in range(6)]
        ran = Counter(counts.read_text().split())
        assert ran["s0"] == ran["s1"] == ran["s2"] == 1
        assert all(ran[f"s{i}"] >= 1 for i in range(6))
        rows = await conn.fetch(
            "SELECT step_name, count(*) AS n FROM run_events WHERE run_id = $1 AND "
            "type = 'step.completed' GROUP BY step_name",
            uuid.UUID(run["id"]),
        )
        assert {r["step_name"]: r["n"] for r in rows} == {f"s{i}": 1 for i in range(6)}
    finally:
        await conn.close()


async def test_outcomes_lost_to_orchestrator_crashes_use_no_attempts(
    database_url: str,
) -> None:
    """A step allowed 2 attempts is mid-try each time the orchestrator is killed (twice), so
    two tries' outcomes are never recorded: those are delivery failures, not failed attempts.
    The third try's result completes the run, and every try ran as attempt 1."""
    sl = stepline.Stepline(SECRET)
    gates: list[asyncio.Event] = []
    entered: asyncio.Queue[int] = asyncio.Queue()

    @sl.workflow("outlives-crashes", retries=stepline.Retries(attempts=2))
    async def outlives(ctx: stepline.Context, input: object) -> int:
        async def slow() -> int:
            gate = asyncio.Event()
            gates.append(gate)
            entered.put_nowait(len(gates))
            await gate.wait()
            return len(gates)

        return await ctx.step("slow", slow)

    port = free_port()
    env = _orchestrator_env(database_url, port)
    base = f"http://127.0.0.1:{port}"
    conn = await db.connect(database_url)
    orchestrators = [_spawn(SERVE, env)]
    try:
        await _until_up(base + "/healthz", orchestrators[0])
        key = await keys.create_key(conn, "crash")
        async with app_server(sl) as app_url, stepline.AsyncClient(base, api_key=key) as client:
            await _register(client, conn, app_url)
            run = await client.start_run("outlives-crashes", None)
            try:
                await _crash_twice_mid_step(orchestrators, env, base, client, run["id"], entered)
            finally:
                for gate in gates:  # no try is left blocked, whatever happened
                    gate.set()
            done = await client.wait_run(run["id"], timeout=30)
        assert done["status"] == "completed", done
        assert done["output"] == 3 and len(gates) == 3
        attempts = await conn.fetch(
            "SELECT type, (data->>'attempt')::int AS attempt FROM run_events "
            "WHERE run_id = $1 AND step_name = 'slow' ORDER BY seq",
            uuid.UUID(run["id"]),
        )
        assert [(r["type"], r["attempt"]) for r in attempts] == [
            ("step.started", 1),
            ("step.started", 1),
            ("step.started", 1),
            ("step.completed", 1),
        ]
    finally:
        for orch in orchestrators:
            _kill(orch)
        await conn.close()


async def _crash_twice_mid_step(
    orchestrators: list[subprocess.Popen[bytes]],
    env: dict[str, str],
    base: str,
    client: stepline.AsyncClient,
    run_id: str,
    entered: asyncio.Queue[int],
) -> None:
    """Kill the orchestrator (the last of ``orchestrators``) while the run's step is mid-try,
    twice, each time seeing the restarted one (added to the list) start the step's next try."""
    assert await asyncio.wait_for(entered.get(), 30) == 1
    for tries in (2, 3):
        _kill(orchestrators[-1])  # the try in flight can no longer report its outcome
        orchestrators.append(_spawn(SERVE, env))
        await _until_up(base + "/healthz", orchestrators[-1])
        waiting = asyncio.ensure_future(entered.get())
        ending = asyncio.ensure_future(client.wait_run(run_id, timeout=30))
        await asyncio.wait({waiting, ending}, return_when=asyncio.FIRST_COMPLETED)
        if ending.done():
            waiting.cancel()
            raise AssertionError(f"the run ended while a try was lost: {ending.result()}")
        ending.cancel()
        assert await waiting == tries


async def test_a_pull_lease_lost_with_its_orchestrator_counts_no_delivery_failure(
    database_url: str, tmp_path: Path
) -> None:
    """SIGKILL of the orchestrator that leased a run to a pull app's worker, mid-step, and a
    restart after the lease ran out: the run completes (the worker's late beat keeps the lease,
    or its next poll takes the run over). Whatever was lost was our loss, not the worker's: no
    delivery failure, and the step ran as attempt 1 each time."""
    count_file = tmp_path / "steps"
    count_file.touch()
    port = free_port()
    env = _orchestrator_env(database_url, port)
    base = f"http://127.0.0.1:{port}"
    conn = await db.connect(database_url)
    orch = _spawn(SERVE, env)
    worker: subprocess.Popen[bytes] | None = None
    try:
        await _until_up(base + "/healthz", orch)
        key = await keys.create_key(conn, "crash")
        async with stepline.AsyncClient(base, api_key=key) as client:
            slug = (await client.create_app("pulled", kind="pull"))["slug"]
            worker = _spawn(
                [
                    *(str(Path(sys.executable).parent / "stepline"), "worker"),
                    *("tests.apps.pull_app:sl", "--app", slug, "--url", base),
                ],
                {"STEPLINE_API_KEY": key},
            )
            while not (await client.get_app(slug))["syncedAt"]:
                assert worker.poll() is None, "the worker exited"
                await asyncio.sleep(0.05)
            input = {"countFile": str(count_file), "seconds": 4.0}
            run = await client.start_run("slow-step", input)
            while not count_file.read_text():
                await asyncio.sleep(0.05)
            _kill(orch)  # the try in flight can no longer report its outcome
            await asyncio.sleep(float(env["STEPLINE_LEASE_SECONDS"]) + 1)  # its lease runs out
            orch = _spawn(SERVE, env)
            await _until_up(base + "/healthz", orch)
            done = await client.wait_run(run["id"], timeout=60)
            events = [e async for e in client.iter_run_events(run["id"])]
        assert done["status"] == "completed" and done["output"] == "finished", done
        assert done["deliveryFailures"] == 0, done
        started = [e["data"]["attempt"] for e in events if e["type"] == "step.started"]
        assert started and set(started) == {1}, started
    finally:
        if worker is not None:
            _kill(worker)
        _kill(orch)
        await conn.close()
