"""Protocol versions: an app speaking the oldest supported protocol (the SDK as it was before
history deltas, taken from this repository's history) gets whole histories and its runs
complete; an app of today declares its version and gets deltas; a fleet mixing both behind one
URL (a rolling deploy, a rollback) runs every step once, whichever replica answered the sync."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

import stepline
from stepline.protocol import PROTOCOL_VERSION, InvokeRequest
from tests.ports import free_port
from tests.support import (
    Stack,
    lifespan,
    orchestrator_stack,
    read_body,
    serve,
    unpack_sdk,
    until,
)

ROOT = Path(__file__).resolve().parents[2]
OLDEST_SDK = "7a8814b"  # the last commit whose SDK speaks protocol 1 (whole histories only)

APP = textwrap.dedent(
    """
    import stepline

    sl = stepline.Stepline("secret-old-protocol")

    @sl.workflow("stepping")
    async def stepping(ctx, input):
        total = 0
        for i in range(4):
            total += await ctx.step(f"add-{i}", lambda i=i: i + 1)
            await ctx.sleep(f"nap-{i}", "30ms")
        return {"total": total, "sdk": stepline.__file__}

    app = sl.asgi()
    """
)


FLEET_APP = textwrap.dedent(
    """
    import os

    import stepline

    sl = stepline.Stepline("secret-fleet")

    def effect(name, value):
        with open(os.environ["EFFECTS"], "a") as out:
            out.write(name + "\\n")
        return value

    @sl.workflow("stepping")
    async def stepping(ctx, input):
        total = 0
        for i in range(4):
            total += await ctx.step(f"add-{i}", effect, f"{input}:add-{i}", i + 1)
            await ctx.sleep(f"nap-{i}", "20ms")
        return {"total": total}

    app = sl.asgi()
    """
)


class Bases:
    """ASGI wrapper noting each invocation's ``historyBase`` (None: a whole history)."""

    def __init__(self, app: Any, bases: list[str | None]) -> None:
        self.app, self.bases = app, bases

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        body = await read_body(receive)
        request = json.loads(body)
        if request.get("kind") == "invoke":
            self.bases.append(InvokeRequest.model_validate(request).history_base)
        sent = False

        async def again() -> Any:
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, again, send)


@pytest.fixture(scope="module")
def old_sdk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The SDK package as it was at OLDEST_SDK, unpacked into a folder of its own."""
    folder = tmp_path_factory.mktemp("old-sdk")
    unpack_sdk(OLDEST_SDK, folder)
    (folder / "oldapp.py").write_text(APP)
    yield folder


@asynccontextmanager
async def old_app(folder: Path) -> AsyncIterator[str]:
    """The app above, served by uvicorn in a process whose ``stepline`` is the old SDK."""
    async with app_process(folder, "oldapp", old=True) as url:
        yield url


@asynccontextmanager
async def app_process(
    folder: Path, module: str, *, old: bool, env: dict[str, str] | None = None
) -> AsyncIterator[str]:
    """``module:app`` in ``folder``, served by uvicorn in a process of its own whose
    ``stepline`` is the old SDK (``old``) or today's."""
    port = free_port()
    path = f"{folder}{os.pathsep}{folder / 'sdk'}" if old else str(folder)
    env = {**os.environ, **(env or {}), "PYTHONPATH": path}
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", f"{module}:app", "--port", str(port), "--log-level",
         "warning"],
        cwd=folder,
        env=env,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/"
    try:
        async with httpx.AsyncClient() as http:
            for _ in range(300):
                try:
                    await http.get(url)
                    break
                except httpx.TransportError:
                    await asyncio.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def test_an_app_of_the_oldest_protocol_gets_whole_histories(
    database_url: str, old_sdk: Path
) -> None:
    """The old SDK declares no protocol version: the orchestrator records version 1 and sends
    it every invocation's whole history (it would take a delta for the whole one), so a run of
    four steps and sleeps completes; a run of an app of today, version 2, gets deltas."""
    async with orchestrator_stack(database_url) as stack, old_app(old_sdk) as url:
        async with stack.orchestrator.pool.acquire() as conn:
            from stepline_server.store import apps, keys

            row = await apps.create(conn, keys.DEFAULT_PROJECT, "old", url, "secret-old-protocol")
            assert row is not None
        await stack.client.sync_app(row["slug"])
        shown = await stack.client.get_app(row["slug"])
        assert shown["protocolVersion"] == 1
        run = await stack.client.start_run("stepping", None)
        done = await stack.client.wait_run(run["id"], timeout=30)
        assert done["status"] == "completed", done
        assert done["output"]["total"] == 10
        assert done["output"]["sdk"].startswith(str(old_sdk))

    sl = stepline.Stepline("secret-new-protocol")
    bases: list[str | None] = []

    @sl.workflow("stepping-now")
    async def stepping_now(ctx: stepline.Context, input: object) -> int:
        total = 0
        for i in range(3):
            total += await ctx.step(f"add-{i}", lambda i=i: i + 1)
            await ctx.sleep(f"nap-{i}", "30ms")
        return total

    async with orchestrator_stack(database_url) as stack, serve(Bases(sl.asgi(), bases)) as url:
        slug = await stack.register(sl, url + "/", "new")
        assert (await stack.client.get_app(slug))["protocolVersion"] == PROTOCOL_VERSION
        run = await stack.client.start_run("stepping-now", None)
        done = await stack.client.wait_run(run["id"], timeout=30)
    assert done["status"] == "completed" and done["output"] == 6
    assert bases[0] is None and all(b is not None for b in bases[1:]) and len(bases) > 1


class Fleet:
    """One URL in front of two replicas of an app, as a load balancer: ``describe`` goes to
    ``sync_to``, the n-th invocation (from 0) to ``route(n)``. Notes each invocation as
    (replica, whether it carried a history delta, the answer's status)."""

    def __init__(self, replicas: dict[str, str], route: Callable[[int], str]) -> None:
        self.replicas, self.route = replicas, route
        self.sync_to = "new"
        self.calls: list[tuple[str, bool, int]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        body = await read_body(receive)
        request = json.loads(body) if body else {}
        invoke = request.get("kind") == "invoke"
        to = self.route(len(self.calls)) if invoke else self.sync_to
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        forwarded = {
            k: v for k, v in headers.items() if k in ("content-type", "stepline-signature")
        }
        async with httpx.AsyncClient(timeout=30) as http:
            answer = await http.request(
                scope["method"], self.replicas[to], content=body, headers=forwarded
            )
        if invoke:
            delta = InvokeRequest.model_validate(request).history_base is not None
            self.calls.append((to, delta, answer.status_code))
        back = [(k.encode(), v.encode()) for k, v in answer.headers.items()
                if k in ("content-type", "stepline-protocol")]  # fmt: skip
        await send({"type": "http.response.start", "status": answer.status_code, "headers": back})
        await send({"type": "http.response.body", "body": answer.content})


@pytest.fixture
def effects(old_sdk: Path, tmp_path: Path) -> Iterator[Path]:
    """The fleet's app, beside the old SDK; its steps note each execution in ``effects``."""
    (old_sdk / "fleetapp.py").write_text(FLEET_APP)
    yield tmp_path / "effects"


@asynccontextmanager
async def fleet(
    database_url: str, old_sdk: Path, effects: Path, route: Callable[[int], str]
) -> AsyncIterator[tuple[Fleet, Stack, str]]:
    """The fleet app on today's SDK (deployment ``new``) and on the oldest one (``old``) behind
    one URL, registered on an orchestrator and synced on today's: the fleet, the orchestrator
    and the app's slug."""
    env = {"EFFECTS": str(effects)}
    async with (
        app_process(old_sdk, "fleetapp", old=False, env={**env, "STEPLINE_DEPLOYMENT_ID": "new"})
        as new,
        app_process(old_sdk, "fleetapp", old=True, env={**env, "STEPLINE_DEPLOYMENT_ID": "old"})
        as old,
        orchestrator_stack(database_url) as stack,
    ):  # fmt: skip
        lb = Fleet({"new": new, "old": old}, route)
        async with serve(lb) as url:
            async with stack.orchestrator.pool.acquire() as conn:
                from stepline_server.store import apps, keys

                row = await apps.create(
                    conn, keys.DEFAULT_PROJECT, "fleet", url + "/", "secret-fleet"
                )
                assert row is not None
            await stack.client.sync_app(row["slug"])
            shown = await stack.client.get_app(row["slug"])
            assert shown["protocolVersion"] == PROTOCOL_VERSION
            yield lb, stack, row["slug"]


async def run_through(stack: Stack, name: str) -> list[dict[str, Any]]:
    """Start a run of ``stepping`` with input ``name``, see it complete with every step's
    result; its history."""
    run = await stack.client.start_run("stepping", name)
    done = await stack.client.wait_run(run["id"], timeout=60)
    assert done["status"] == "completed", done
    assert done["output"] == {"total": 10}
    return [e async for e in stack.client.iter_run_events(run["id"])]


def answered_by(events: list[dict[str, Any]]) -> set[str]:
    """The deployments whose answers a run's history recorded."""
    return {
        e["deploymentId"]
        for e in events
        if e["type"] == "invocation.ended" and e["data"]["outcome"] != "delivery_failed"
    }


def executions(effects: Path) -> list[str]:
    return sorted(effects.read_text().split()) if effects.exists() else []


async def test_a_rolling_deploy_mixing_protocols_runs_every_step_once(
    database_url: str, old_sdk: Path, effects: Path
) -> None:
    """Replicas of today's SDK and of the oldest protocol behind one URL, the sync answered by
    today's (the app is recorded as speaking today's protocol), invocations going to one twice,
    then to the other twice: every run completes, each step ran once, both replicas answered
    for each run, today's read deltas and the old one never ran an invocation carrying one (one
    it was sent, it refused, and the run was invoked again at once with its whole history)."""
    twice_each = fleet(database_url, old_sdk, effects, lambda n: "new" if n % 4 < 2 else "old")
    async with twice_each as (lb, stack, _):
        for name in ("r1", "r2"):
            events = await run_through(stack, name)
            assert answered_by(events) == {"new", "old"}
            assert not [e for e in events if e["type"] in ("step.failed", "run.failed")]
    assert executions(effects) == [f"r{r}:add-{i}" for r in (1, 2) for i in range(4)]
    assert not [c for c in lb.calls if c[0] == "old" and c[1] and c[2] == 200], lb.calls
    assert {("new", True, 200), ("old", True, 422), ("old", False, 200)} <= set(lb.calls)
    refused = [e for e in events if e.get("data", {}).get("outcome") == "delivery_failed"]
    assert refused and all("refused the history delta" in e["data"]["error"] for e in refused)


async def test_a_rollback_to_the_oldest_protocol_runs_every_step_once(
    database_url: str, old_sdk: Path, effects: Path
) -> None:
    """The app synced on today's SDK, a run's first invocation answered by it, then the
    deployment rolled back to the oldest protocol (no sync yet): the old replicas get whole
    histories and the run completes with each step run once; synced again on the old replica
    (the app is recorded as version 1), the next run completes too."""
    rolled_back = fleet(database_url, old_sdk, effects, lambda n: "new" if n == 0 else "old")
    async with rolled_back as (lb, stack, slug):
        events = await run_through(stack, "r1")
        assert answered_by(events) == {"new", "old"}
        lb.sync_to = "old"
        await stack.client.sync_app(slug)
        assert (await stack.client.get_app(slug))["protocolVersion"] == 1
        assert answered_by(await run_through(stack, "r2")) == {"old"}
    assert executions(effects) == [f"r{r}:add-{i}" for r in (1, 2) for i in range(4)]
    assert not [c for c in lb.calls if c[0] == "old" and c[1] and c[2] == 200], lb.calls
    assert ("old", True, 422) in lb.calls


BEFORE_STATE_SDK = "ebecdf1"  # the last commit whose SDK speaks protocol 3 (no published state)

STATELESS_APP = textwrap.dedent(
    """
    import stepline

    sl = stepline.Stepline("secret-state-rollback")

    @sl.workflow("publishing")
    async def publishing(ctx, input):
        first = await ctx.step("first", lambda: 1)
        go = await ctx.callback("go")
        return {"first": first, "got": await go.wait(), "sdk": stepline.__file__}

    app = sl.asgi()
    """
)

publisher = stepline.Stepline("secret-state-rollback")


@publisher.workflow("publishing")
async def publishing(ctx: stepline.Context, input: object) -> object:
    await ctx.set_state("phase", "first")
    first = await ctx.step("first", lambda: 1)
    go = await ctx.callback("go")
    return {"first": first, "got": await go.wait()}


async def test_a_rollback_before_published_state_completes_a_run_that_published(
    database_url: str, tmp_path: Path
) -> None:
    """A run that published state on today's SDK waits on a callback; the app is rolled back
    to an SDK of protocol 3 (which knows no ``state`` step) and synced: the run's next
    invocation, a delta the old replica did not keep, is read and the history it fetches has no
    state step, and the run completes on the old SDK; the state stays readable."""
    unpack_sdk(BEFORE_STATE_SDK, tmp_path)
    (tmp_path / "statelessapp.py").write_text(STATELESS_APP)
    route = {"to": "new"}
    async with (
        app_process(tmp_path, "statelessapp", old=True) as old,
        serve(publisher.asgi()) as new,
        orchestrator_stack(database_url) as stack,
    ):
        lb = Fleet({"new": new + "/", "old": old}, lambda n: route["to"])
        async with serve(lb) as url:
            slug = await stack.register(publisher, url + "/", "rollback")  # synced on today's
            assert (await stack.client.get_app(slug))["protocolVersion"] == 4
            run = await stack.client.start_run("publishing", None)

            async def go_waiting() -> str | None:
                for step in (await stack.client.get_run(run["id"]))["steps"]:
                    if step["name"] == "go" and step["status"] == "waiting":
                        return str(step["callbackId"])
                return None

            go = await until(go_waiting, "the callback go waiting")
            assert await stack.client.get_state(run["id"], "phase") == "first"
            route["to"] = lb.sync_to = "old"
            await stack.client.sync_app(slug)
            assert (await stack.client.get_app(slug))["protocolVersion"] == 3
            await stack.client.complete_callback(go, "on")
            done = await stack.client.wait_run(run["id"], timeout=30)
            assert done["status"] == "completed", done
            assert done["output"]["first"] == 1 and done["output"]["got"] == "on"
            assert done["output"]["sdk"].startswith(str(tmp_path))
            assert await stack.client.get_state(run["id"], "phase") == "first"
    assert [c for c in lb.calls if c[0] == "old"] and all(
        c[2] == 200 for c in lb.calls if c[0] == "old"
    ), lb.calls
