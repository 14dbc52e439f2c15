"""`stepline serve --workers 2`: two orchestrator processes on one port run workflows
together, a worker that dies is started again, and SIGTERM stops them all."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from typing import Any

import httpx
import psutil

import stepline
from tests.support import app_server, free_port


async def _ready(url: str, serve: subprocess.Popen[bytes]) -> None:
    async with httpx.AsyncClient() as http:
        for _ in range(400):
            try:
                if (await http.get(url + "/readyz")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert serve.poll() is None, "stepline serve exited early"
            await asyncio.sleep(0.05)
    raise AssertionError("stepline serve did not become ready")


def _workers(serve: subprocess.Popen[bytes]) -> list[psutil.Process]:
    """The live child workers of ``serve`` (not one that died and is not reaped yet)."""
    found = []
    for child in psutil.Process(serve.pid).children():
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "stepline_server" in " ".join(
                child.cmdline()
            ):
                found.append(child)
        except psutil.Error:
            continue
    return found


async def test_two_workers_share_the_work_and_stop_together(database_url: str) -> None:
    """Two workers run 30 runs' steps once each, their metrics add up, a killed one comes
    back, and SIGTERM stops both."""
    env = {**os.environ, "DATABASE_URL": database_url, "STEPLINE_LOG_LEVEL": "warning"}
    done = subprocess.run(
        [sys.executable, "-m", "stepline_server.cli.main", "keys", "create"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    key = done.stdout.splitlines()[-1]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve = subprocess.Popen(
        [sys.executable, "-m", "stepline_server.cli.main", "serve", "--port", str(port),
         "--workers", "2"],
        env=env,
    )  # fmt: skip
    calls: Counter[str] = Counter()
    try:
        await _ready(url, serve)
        [child] = _workers(serve)
        app_port = free_port()
        async with stepline.AsyncClient(url, key) as client:
            app = await client.create_app("workers", f"http://127.0.0.1:{app_port}/")
            sl = stepline.Stepline(signing_secret=app["signingSecret"])

            @sl.workflow("three")
            async def three(ctx: stepline.Context, n: int) -> list[int]:
                out = []
                for i in range(3):

                    async def work(i: int = i) -> int:
                        calls[f"{n}:{i}"] += 1
                        return n * 10 + i

                    out.append(await ctx.step(f"s{i}", work))
                return out

            async with app_server(sl, app_port):
                await client.sync_app(app["slug"])
                started = [await client.start_run("three", n) for n in range(30)]
                ended: list[dict[str, Any]] = [
                    await client.wait_run(r["id"], timeout=30) for r in started
                ]
        assert [r["output"] for r in ended] == [[n * 10, n * 10 + 1, n * 10 + 2]
                                                 for n in range(30)]  # fmt: skip
        assert set(calls.values()) == {1} and len(calls) == 90
        # Whichever worker answers, /metrics adds up both workers' counts.
        async with httpx.AsyncClient() as http:
            for _ in range(4):
                text = (await http.get(url + "/metrics")).text
                assert 'stepline_runs_started_total{trigger="api",workflow="three"} 30.0' in text
                assert 'stepline_runs_ended_total{status="completed",workflow="three"} 30.0' in text
        # A worker that dies is started again.
        child.kill()
        for _ in range(100):
            await asyncio.sleep(0.1)
            again = _workers(serve)
            if again and again[0].pid != child.pid:
                break
        else:
            raise AssertionError("the worker was not started again")
        await _ready(url, serve)
        serve.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(serve.wait, 30) == 0
        assert not psutil.pid_exists(again[0].pid) or again[0].status() == psutil.STATUS_ZOMBIE
    finally:
        if serve.poll() is None:
            serve.kill()
