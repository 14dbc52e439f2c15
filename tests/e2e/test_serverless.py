"""Serverless hosting: an app whose every request runs on a fresh event loop (closed afterwards),
or in a fresh process, runs multi-step workflows with sleeps and callbacks to the end with no
delivery failure and each side effect once."""

from __future__ import annotations

import gc
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.loopserver import serving
from tests.support import Stack, orchestrator_stack

pytest.importorskip("fastapi")

SECRET = "whsec_serverless"
EFFECTS = ["book", "leg-0", "leg-1", "after-nap-0", "after-nap-1", "ask"]


async def _trips(stack: Stack, sl: Any, url: str, runs: int) -> list[dict[str, Any]]:
    await stack.register(sl, url + "/stepline/")
    started = [await stack.client.start_run("trip", {"key": f"k{n}"}) for n in range(runs)]
    return [await stack.client.wait_run(r["id"], timeout=60) for r in started]


async def _check(stack: Stack, ended: list[dict[str, Any]], effects: Path) -> None:
    assert [e["status"] for e in ended] == ["completed"] * len(ended), ended
    assert all(e["output"]["approved"] is True for e in ended)
    for run in ended:
        events = [e async for e in stack.client.iter_run_events(run["id"])]
        failed = [
            e["data"]
            for e in events
            if e["type"] == "invocation.ended" and e["data"]["outcome"] == "delivery_failed"
        ]
        assert failed == [], failed
    counts = Counter(effects.read_text().splitlines())
    assert counts == Counter(f"k{n} {name}" for n in range(len(ended)) for name in EFFECTS)


@pytest.mark.parametrize("mode", ["run", "close"])
async def test_a_fresh_event_loop_per_request(
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    mode: str,
) -> None:
    """Each invocation on a loop of its own, closed when it is answered (with what is left
    cancelled, or left pending): every run completes, no answer is a 500, no delivery failed,
    each step's side effect ran once and asyncio reports no task destroyed while pending."""
    from tests.apps.serverless_app import make_app

    effects = tmp_path / "effects"
    monkeypatch.setenv("STEPLINE_TEST_EFFECTS", str(effects))
    sl, app = make_app()
    sl.signing_secrets = (SECRET,)
    caplog.set_level(logging.ERROR, logger="asyncio")
    async with orchestrator_stack(database_url) as stack:
        with serving(app, mode) as server:
            url = f"http://127.0.0.1:{server.server_address[1]}"
            ended = await _trips(stack, sl, url, runs=3)
        await _check(stack, ended, effects)
        assert set(server.statuses) == {200}, server.statuses
        assert server.loops > 10
    await sl.aclose()  # lets go of what the last loop left: connections, parked runs
    gc.collect()
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


async def test_a_fresh_process_per_request(database_url: str, tmp_path: Path) -> None:
    """Each invocation in a process of its own (nothing kept between them): the runs complete
    with no delivery failure and each side effect once."""
    from tests.apps.serverless_app import sl

    effects = tmp_path / "effects"
    env = {"STEPLINE_TEST_EFFECTS": str(effects), "STEPLINE_SIGNING_SECRET": SECRET}
    async with orchestrator_stack(database_url) as stack:
        target = "tests.apps.serverless_app:app"
        with serving(None, "process", target, env) as server:
            url = f"http://127.0.0.1:{server.server_address[1]}"
            probe = type(sl)(SECRET)  # registers with the secret the processes sign with
            ended = await _trips(stack, probe, url, runs=2)
        await _check(stack, ended, effects)
        assert set(server.statuses) == {200}, server.statuses
