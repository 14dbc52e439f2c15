"""Pull apps end to end: workers poll a real orchestrator over HTTP and run its workflows."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import stepline
from tests.apps import pull_app
from tests.receiver import Receiver
from tests.support import Stack, orchestrator_stack, worker


def make_app(counts: dict[str, int], gate: asyncio.Event | None = None) -> stepline.Stepline:
    sl = stepline.Stepline("secret-pull")
    running = {"now": 0}

    @sl.workflow("double")
    async def double(ctx: stepline.Context, input: int) -> int:
        async def work() -> int:
            counts[f"w{input}"] = counts.get(f"w{input}", 0) + 1
            if gate is not None and not gate.is_set():
                running["now"] += 1
                if running["now"] >= 3:
                    gate.set()  # three invocations run at once
                await gate.wait()
            return input * 2

        return await ctx.step("work", work)  # type: ignore[no-any-return]

    @sl.workflow("short", timeout="1s")
    async def short(ctx: stepline.Context, input: Any) -> str:
        return str(await ctx.step("only", lambda: "ok"))

    return sl


def raw(stack: Stack, token: str | None = None) -> httpx.AsyncClient:
    """A plain HTTP client with the API key (or ``token``), to see status codes."""
    auth = {"Authorization": f"Bearer {token or stack.api_key}"}
    return httpx.AsyncClient(base_url=stack.url, headers=auth, timeout=10)


async def test_a_pull_app_runs_a_workflow(database_url: str) -> None:
    """A pull app registered without URL, synced by its worker, runs a run to completion; the
    app shows its kind and when a worker last polled."""
    counts: dict[str, int] = {}
    sl = make_app(counts)
    async with orchestrator_stack(database_url) as stack:
        slug = await stack.register_pull("pulled")
        async with worker(stack, sl, slug):
            run = await stack.client.start_run("double", 21)
            done = await stack.client.wait_run(run["id"], timeout=20)
        assert done["status"] == "completed", done
        assert done["output"] == 42
        assert done["waitingForWorker"] is False
        assert counts == {"w21": 1}
        app = await stack.client.get_app(slug)
        assert app["kind"] == "pull" and app["url"] is None and app["lastPolledAt"]
        listed = (await stack.client.list_apps())["apps"]
        assert [(a["name"], a["kind"]) for a in listed] == [("pulled", "pull")]


async def test_three_workers_share_the_load(database_url: str) -> None:
    """Three workers of one app, one invocation at a time each: the first three runs only
    finish once three invocations run at once (so each worker holds one); twelve runs all
    complete, each invoked once, by one worker."""
    counts: dict[str, int] = {}
    gate = asyncio.Event()
    sl = make_app(counts, gate)
    async with orchestrator_stack(database_url) as stack:
        slug = await stack.register_pull()
        async with (
            worker(stack, sl, slug, concurrency=1) as w1,
            worker(stack, sl, slug, concurrency=1) as w2,
            worker(stack, sl, slug, concurrency=1) as w3,
        ):
            runs = [await stack.client.start_run("double", i) for i in range(12)]
            done = [await stack.client.wait_run(r["id"], timeout=30) for r in runs]
        assert [d["output"] for d in done] == [i * 2 for i in range(12)]
        assert counts == {f"w{i}": 1 for i in range(12)}
        assert min(w.invoked for w in (w1, w2, w3)) >= 1
        assert sum(w.invoked for w in (w1, w2, w3)) == 12
        for run in runs:
            types = [e["type"] async for e in stack.client.iter_run_events(run["id"])]
            assert types.count("invocation.started") == 1


async def test_a_run_waits_for_a_worker_past_the_delivery_window(database_url: str) -> None:
    """With no worker polling, a pull run stays running and says it waits for a worker, even
    long past the delivery window; a worker that comes later runs it."""
    counts: dict[str, int] = {}
    sl = make_app(counts)
    async with orchestrator_stack(database_url, delivery_window_seconds=0.2) as stack:
        slug = await stack.register_pull()
        async with worker(stack, sl, slug):
            pass  # synced, then gone
        run = await stack.client.start_run("double", 5)
        await asyncio.sleep(1.0)  # five delivery windows with no worker
        waiting = await stack.client.get_run(run["id"])
        assert waiting["status"] == "running" and waiting["waitingForWorker"] is True
        assert counts == {}
        async with worker(stack, sl, slug):
            done = await stack.client.wait_run(run["id"], timeout=20)
        assert done["status"] == "completed" and done["output"] == 10


async def test_a_run_nobody_polls_for_still_times_out(database_url: str) -> None:
    """A pull run past its time limit with no worker polling ends timedOut."""
    sl = make_app({})
    async with orchestrator_stack(database_url) as stack:
        slug = await stack.register_pull()
        async with worker(stack, sl, slug):
            pass
        run = await stack.client.start_run("short", None)
        done = await stack.client.wait_run(run["id"], timeout=20)
        assert done["status"] == "timedOut", done


def _worker_process(stack: Stack, slug: str, **env: str) -> subprocess.Popen[bytes]:
    """`stepline worker tests.apps.pull_app:sl` for ``slug``, in its own process group."""
    return subprocess.Popen(
        [
            *(str(Path(sys.executable).parent / "stepline"), "worker"),
            *("tests.apps.pull_app:sl", "--app", slug, "--url", stack.url),
            *("--concurrency", "2"),
        ],
        env={**os.environ, "STEPLINE_API_KEY": stack.api_key, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


async def _until_synced(stack: Stack, slug: str, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(400):  # the worker syncs the app as it starts
        if (await stack.client.get_app(slug))["syncedAt"]:
            return
        assert proc.poll() is None, "the worker process exited"
        await asyncio.sleep(0.05)
    raise AssertionError("the worker never synced the app")


async def _until_written(path: Path, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(400):
        if path.read_text():
            return
        assert proc.poll() is None, "the worker process exited"
        await asyncio.sleep(0.05)
    raise AssertionError("the step never ran")


async def test_a_worker_stopped_with_sigterm_finishes_its_invocation(
    database_url: str, tmp_path: Path
) -> None:
    """SIGTERM while a step runs: the worker polls no more, lets the step finish and answers,
    then exits 0; the run completed in that one invocation (nothing was taken over)."""
    count_file = tmp_path / "steps"
    count_file.touch()
    async with orchestrator_stack(database_url) as stack:
        slug = await stack.register_pull()
        proc = _worker_process(stack, slug)
        try:
            await _until_synced(stack, slug, proc)
            input = {"countFile": str(count_file), "seconds": 1.0}
            run = await stack.client.start_run("slow-step", input)
            await _until_written(count_file, proc)
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(proc.wait, 30) == 0
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        done = await stack.client.get_run(run["id"])
        assert done["status"] == "completed" and done["output"] == "finished", done
        types = [e["type"] async for e in stack.client.iter_run_events(run["id"])]
        assert types.count("invocation.started") == 1
        assert count_file.read_text() == f"work {proc.pid}\n"


@pytest.mark.slow
async def test_a_worker_killed_mid_step_loses_its_run_to_another(
    database_url: str, tmp_path: Path
) -> None:
    """A `stepline worker` process killed with SIGKILL in the middle of a step: its lease runs
    out, another worker takes the run over, runs the step again and the run completes."""
    count_file = tmp_path / "steps"
    count_file.touch()
    async with orchestrator_stack(database_url) as stack:
        slug = await stack.register_pull()
        proc = _worker_process(stack, slug, PULL_APP_HANG="1")
        try:
            await _until_synced(stack, slug, proc)
            run = await stack.client.start_run("hang-once", {"countFile": str(count_file)})
            await _until_written(count_file, proc)
            assert count_file.read_text() == f"work {proc.pid}\n"
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        async with worker(stack, pull_app.sl, slug):
            done = await stack.client.wait_run(run["id"], timeout=30)
        assert done["status"] == "completed", done
        assert done["output"] == "done after"
        assert count_file.read_text().splitlines() == [f"work {proc.pid}", f"work {os.getpid()}"]
        types = [e["type"] async for e in stack.client.iter_run_events(run["id"])]
        assert types.count("invocation.started") == 3  # killed, taken over, after the sleep


@contextlib.asynccontextmanager
async def _workers_kept_up(*stacks: Stack, slug: str) -> AsyncIterator[list[int]]:
    """`stepline worker` processes for ``slug``, one at a time, each started again when the
    last exits (as a process supervisor would; at most 30), each polling the next of
    ``stacks`` in turn; yields their pids."""
    pids: list[int] = []
    current: list[subprocess.Popen[bytes]] = []

    async def keep_up() -> None:
        for started in range(30):
            proc = _worker_process(stacks[started % len(stacks)], slug)
            current[:] = [proc]
            pids.append(proc.pid)
            await asyncio.to_thread(proc.wait)

    task = asyncio.create_task(keep_up())
    try:
        yield pids
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        for proc in current:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


async def _doomed_run(stack: Stack, slug: str, count_file: Path) -> dict[str, Any]:
    """Once a worker synced pull app ``slug``, a run of ``exit-in-step`` (whose step ends
    its worker's process every time), waited for until it ends."""
    for _ in range(400):
        if (await stack.client.get_app(slug))["syncedAt"]:
            break
        await asyncio.sleep(0.05)
    run = await stack.client.start_run("exit-in-step", {"countFile": str(count_file)})
    return await stack.client.wait_run(run["id"], timeout=60)


@pytest.mark.slow
async def test_a_step_that_kills_its_worker_every_time_ends_the_run_app_unreachable(
    database_url: str, tmp_path: Path
) -> None:
    """A step that ends its worker's process every time it runs, with workers started again
    each time: each try lost with its worker is a delivery failure (its invocation ended
    delivery_failed, saying the worker was lost), the step runs as attempt 1 every time, and
    once the workflow's delivery window (4 s) is spent the run fails app_unreachable and the
    app.unreachable alert is sent, as for a push app that cannot be reached."""
    count_file = tmp_path / "steps"
    count_file.touch()
    async with (
        orchestrator_stack(database_url, lease_seconds=1.0) as stack,
        Receiver().running() as rx,
    ):
        slug = await stack.register_pull()
        await stack.client.create_alert(
            "ops", ["app.unreachable"], {"type": "webhook", "url": rx.url}
        )
        async with _workers_kept_up(stack, slug=slug) as pids:
            done = await _doomed_run(stack, slug, count_file)
        assert done["status"] == "failed", done
        assert done["error"]["code"] == "app_unreachable", done
        assert "worker" in done["error"]["message"], done
        async with raw(stack) as http:
            answer = await http.get(f"/v1/runs/{done['id']}/invocations")
        invocations = answer.json()["invocations"]
        outcomes = [i["outcome"] for i in invocations]
        assert len(outcomes) >= 2 and outcomes == ["delivery_failed"] * (len(outcomes) - 1) + [
            "failed"
        ], invocations
        assert all("worker" in i["response"] for i in invocations), invocations
        assert [i["attempt"] for i in invocations] == list(range(1, len(invocations) + 1))
        assert done["deliveryFailures"] == len(invocations) - 1
        tries = count_file.read_text().splitlines()
        assert len(tries) == len(invocations)
        assert {line.split()[1] for line in tries} <= {str(pid) for pid in pids}
        events = [e async for e in stack.client.iter_run_events(done["id"])]
        started = [e["data"]["attempt"] for e in events if e["type"] == "step.started"]
        assert started == [1] * len(invocations)
        await rx.until(1)
        assert [r.json["type"] for r in rx.received] == ["app.unreachable"]


async def test_bad_registrations_and_polls_are_refused(database_url: str) -> None:
    """A pull app with a URL, a push app without one, a URL given to a pull app, a poll of a
    push app, bad poll parameters and a pull sync without a description are clear JSON errors
    that change nothing."""
    async with orchestrator_stack(database_url) as stack, raw(stack) as http:
        for body, field in (
            ({"name": "a", "kind": "pull", "url": "http://127.0.0.1:9/"}, "url"),
            ({"name": "a"}, "url"),
            ({"name": "a", "kind": "poll"}, "kind"),
        ):
            answer = await http.post("/v1/apps", json=body)
            assert answer.status_code == 422, answer.text
            assert answer.json()["error"]["code"] == "validation_failed"
            assert field in str(answer.json()["error"]["details"])
        assert (await http.get("/v1/apps")).json()["apps"] == []
        slug = await stack.register_pull("p")
        answer = await http.patch(f"/v1/apps/{slug}", json={"url": "http://127.0.0.1:9/"})
        assert answer.status_code == 422 and "url" in answer.text
        assert (await http.get(f"/v1/apps/{slug}")).json()["url"] is None
        for query in ("wait=soon", "wait=-1", "limit=0", "limit=101", "limit=x"):
            answer = await http.post(f"/v1/apps/{slug}/poll?{query}")
            assert answer.status_code == 422, (query, answer.text)
            assert answer.json()["error"]["code"] == "validation_failed"
        assert (await http.post(f"/v1/apps/{slug}/poll?wait=0")).status_code == 204
        answer = await http.post(f"/v1/apps/{slug}/sync")
        assert answer.status_code == 422 and "description" in answer.text
        answer = await http.post(f"/v1/apps/{slug}/sync", json={"workflows": [{"name": "a b"}]})
        assert answer.status_code == 422, answer.text
        answer = await http.post(f"/v1/apps/{slug}/sync", content=b"{nope")
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_json"
        assert (await http.get("/v1/workflows")).json()["workflows"] == []
        push = await stack.client.create_app("pushed", "http://127.0.0.1:9/")
        answer = await http.post(f"/v1/apps/{push['slug']}/poll?wait=0")
        assert answer.status_code == 409 and answer.json()["error"]["code"] == "invalid_state"
        assert (await http.post("/v1/apps/nope/poll")).status_code == 404


async def test_answers_and_heartbeats_need_the_invocations_token(database_url: str) -> None:
    """An answer or heartbeat with a made-up token is 401; with the token of an invocation
    that lost its lease, 409 stale_invocation, and the run goes on unchanged."""
    sl = make_app({})
    async with orchestrator_stack(database_url) as stack, raw(stack) as http:
        slug = await stack.register_pull()
        async with worker(stack, sl, slug):
            pass
        run = await stack.client.start_run("double", 1)
        polled = (await http.post(f"/v1/apps/{slug}/poll?wait=5s")).json()
        body = polled["invocations"][0]
        assert body["runId"] == run["id"] and polled["leaseSeconds"] > 0
        invocation, token = body["invocationId"], body["token"]
        answer_url = f"/v1/invocations/{invocation}/answer"
        beat_url = f"/v1/invocations/{invocation}/heartbeat"
        async with raw(stack, "made-up") as forged:
            for url in (answer_url, beat_url):
                answer = await forged.post(url, json={"runId": run["id"], "status": "completed"})
                assert answer.status_code == 401, answer.text
        async with raw(stack, token) as holder:
            beat = await holder.post(beat_url, json={"runId": run["id"]})
            assert beat.status_code == 200 and beat.json()["cancelRequested"] is False
            answer = await holder.post(answer_url, json={"runId": run["id"], "status": "nope"})
            assert answer.status_code == 422, answer.text
            answer = await holder.post(answer_url, json={"runId": "x", "status": "completed"})
            assert answer.status_code == 422, answer.text
            answer = await holder.post(answer_url, json={"runId": str(uuid.uuid4())})
            assert answer.status_code == 422, answer.text
            answer = await holder.post(
                answer_url, json={"runId": run["id"], "status": "completed", "output": 7}
            )
            assert answer.status_code == 200 and answer.json() == {"recorded": True}
            again = await holder.post(
                answer_url, json={"runId": run["id"], "status": "completed", "output": 8}
            )
            assert again.status_code == 409
            assert again.json()["error"]["code"] == "stale_invocation"
            beat = await holder.post(beat_url, json={"runId": run["id"]})
            assert beat.status_code == 409
        done = await stack.client.get_run(run["id"])
        assert done["status"] == "completed" and done["output"] == 7


def test_the_worker_command_refuses_bad_usage() -> None:
    """`stepline worker` without a key, with a target that is not MODULE:ATTR or not a
    Stepline exits with a message, before any request."""
    env = {k: v for k, v in os.environ.items() if k != "STEPLINE_API_KEY"}
    stepline_cmd = str(Path(sys.executable).parent / "stepline")
    for args, code, words in (
        (["tests.apps.pull_app:sl", "--app", "a"], 2, "API key"),
        (["tests.apps.pull_app", "--app", "a", "--api-key", "k"], 1, "MODULE:ATTR"),
        (["tests.apps.pull_app:os", "--app", "a", "--api-key", "k"], 1, "not a stepline"),
        (["tests.apps.pull_app:sl", "--app", "a", "--api-key", "k", "--concurrency", "0"], 2, "1"),
    ):
        done = subprocess.run(
            [stepline_cmd, "worker", *args], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == code, (args, done.stderr)
        assert words in done.stderr, done.stderr


@pytest.mark.slow
async def test_a_worker_that_dies_every_time_counts_when_another_orchestrator_takes_over(
    database_url: str, tmp_path: Path
) -> None:
    """Two orchestrators, and workers that poll each in turn and die in the step every time:
    each lapsed lease is taken over by the orchestrator that did not give it, which counts the
    try as the worker's loss (the one that gave it was serving all along), so the run ends
    app_unreachable once its delivery window (4 s) is spent, every invocation but the last
    delivery_failed, as with one orchestrator."""
    count_file = tmp_path / "steps"
    count_file.touch()
    async with (
        orchestrator_stack(database_url, lease_seconds=1.0) as first,
        orchestrator_stack(database_url, lease_seconds=1.0) as second,
    ):
        slug = await first.register_pull()
        async with _workers_kept_up(first, second, slug=slug) as pids:
            done = await _doomed_run(first, slug, count_file)
        assert done["status"] == "failed", done
        assert done["error"]["code"] == "app_unreachable", done
        async with raw(first) as http:
            answer = await http.get(f"/v1/runs/{done['id']}/invocations")
        invocations = answer.json()["invocations"]
        outcomes = [i["outcome"] for i in invocations]
        assert len(outcomes) >= 2 and outcomes == ["delivery_failed"] * (len(outcomes) - 1) + [
            "failed"
        ], invocations
        assert [i["attempt"] for i in invocations] == list(range(1, len(invocations) + 1))
        assert done["deliveryFailures"] == len(invocations) - 1
        tries = count_file.read_text().splitlines()
        assert len(tries) == len(invocations)
        # Each try ran in another worker, the workers polling each orchestrator in turn.
        assert len({line.split()[1] for line in tries} & {str(pid) for pid in pids}) >= 2
