"""Durable waits end to end: sleeps, callbacks, events, children, parallel steps, cancel, time
limits and retries, with a real orchestrator invoking a real SDK app over HTTP."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest

import stepline
from tests.support import Stack, app_server, hosted, orchestrator_stack

Counts = dict[str, int]


@pytest.fixture(params=["push", "pull"])
def kind(request: pytest.FixtureRequest) -> str:
    """The tests taking it run with the app pushed to (served) and pulled by a worker."""
    return str(request.param)


def bump(counts: Counts, name: str, value: Any = None) -> Any:
    """Count a side effect; return ``value`` (for one-line steps)."""
    counts[name] = counts.get(name, 0) + 1
    return value


async def event_types(stack: Stack, run_id: str) -> list[str]:
    """The run's history as its event types, in order."""
    events = [e async for e in stack.client.iter_run_events(run_id)]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    return [e["type"] for e in events]


def step_events(types_and_steps: list[tuple[str, str | None]], step: str) -> list[str]:
    return [t for t, s in types_and_steps if s == step]


async def history(stack: Stack, run_id: str) -> list[tuple[str, str | None]]:
    """The run's history as (type, stepName) pairs, in order."""
    return [(e["type"], e.get("stepName")) async for e in stack.client.iter_run_events(run_id)]


async def until(probe: Callable[[], Awaitable[Any]], what: str, timeout: float = 15.0) -> Any:
    """Poll ``probe`` until it answers something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def step_in(stack: Stack, run_id: str, name: str, status: str) -> dict[str, Any]:
    """Wait until the run's step ``name`` has ``status``; return the run."""

    async def probe() -> dict[str, Any] | None:
        run = await stack.client.get_run(run_id)
        step = next((s for s in run["steps"] if s["name"] == name), None)
        return run if step is not None and step["status"] == status else None

    result: dict[str, Any] = await until(probe, f"step {name!r} of run {run_id} to be {status}")
    return result


def step_of(run: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in run["steps"] if s["name"] == name)


async def expect_api_error(call: Awaitable[Any], status: int, code: str) -> stepline.ApiError:
    with pytest.raises(stepline.ApiError) as info:
        await call
    assert (info.value.status, info.value.code) == (status, code), info.value
    return info.value


def raw_client(stack: Stack) -> httpx.AsyncClient:
    """A plain HTTP client with the API key, to see status codes."""
    return httpx.AsyncClient(
        base_url=stack.url, headers={"Authorization": f"Bearer {stack.api_key}"}, timeout=10
    )


# -- sleeps ---------------------------------------------------------------------------------


def sleepy_app(counts: Counts) -> stepline.Stepline:
    sl = stepline.Stepline("secret-waits")

    @sl.workflow("nap")
    async def nap(ctx: stepline.Context, input: dict[str, Any]) -> dict[str, Any]:
        def before() -> str:
            bump(counts, f"before:{input['n']}")
            return "rested"

        first = await ctx.step("before", before)
        await ctx.sleep("nap", input.get("seconds", 1))
        second = await ctx.step("after", lambda: bump(counts, f"after:{input['n']}", "up"))
        return {"first": first, "second": second, "n": input["n"]}

    return sl


async def test_sleep_resumes_on_time(database_url: str, kind: str) -> None:
    """A 1 s sleep suspends the run (step sleeping with wakeAt) and resumes on time, once."""
    counts: Counts = {}
    sl = sleepy_app(counts)
    async with orchestrator_stack(database_url) as stack, hosted(stack, sl, kind):
        started = time.monotonic()
        run = await stack.client.start_run("nap", {"n": 1, "seconds": 1})
        sleeping = await step_in(stack, run["id"], "nap", "sleeping")
        assert sleeping["status"] == "running"
        nap = step_of(sleeping, "nap")
        assert nap["kind"] == "sleep" and nap["wakeAt"] is not None
        assert counts == {"before:1": 1}
        done = await stack.client.wait_run(run["id"], timeout=30)
        took = time.monotonic() - started
        assert done["status"] == "completed", done
        assert done["output"] == {"first": "rested", "second": "up", "n": 1}
        assert 1.0 <= took < 5.0, took
        assert counts == {"before:1": 1, "after:1": 1}
        assert [s["status"] for s in done["steps"]] == ["completed"] * 3
        assert await event_types(stack, run["id"]) == [
            "run.started",
            "invocation.started",
            "step.started",
            "step.completed",
            "step.sleeping",
            "invocation.ended",
            "step.completed",
            "invocation.started",
            "step.started",
            "step.completed",
            "invocation.ended",
            "run.completed",
        ]


async def test_a_sleep_claimed_ahead_of_time_never_resumes_early(database_url: str) -> None:
    """With a timer lead longer than the sleep, the run is claimed and begun at once, yet the
    workflow resumes only once its sleep is over: the time it reads after the sleep is past
    the wake time the orchestrator recorded, and the sleep ends at its wake time."""
    sl = stepline.Stepline("secret-waits")

    @sl.workflow("short-nap")
    async def short_nap(ctx: stepline.Context, input: Any) -> str:
        await ctx.sleep("nap", 0.4)
        return (await ctx.now("after")).isoformat()

    async with (
        orchestrator_stack(database_url, timer_lead_seconds=2.0) as stack,
        app_server(sl) as app_url,
    ):
        await stack.register(sl, app_url)
        run = await stack.client.start_run("short-nap", None)
        done = await stack.client.wait_run(run["id"], timeout=30)
        assert done["status"] == "completed", done
        nap = step_of(done, "nap")
        wake_at = datetime.fromisoformat(nap["wakeAt"])
        assert datetime.fromisoformat(done["output"]) >= wake_at
        assert datetime.fromisoformat(nap["endedAt"]) == wake_at


async def test_a_run_claimed_ahead_of_its_sleep_leaves_room_for_others(
    database_url: str,
) -> None:
    """With room for one invocation and a lead longer than the sleep, a run claimed ahead of
    its sleep's end does not hold that room while it waits: another run starts and ends before
    the sleep is over."""
    sl = stepline.Stepline("secret-waits")

    @sl.workflow("long-nap")
    async def long_nap(ctx: stepline.Context, input: Any) -> str:
        await ctx.sleep("nap", 1.5)
        return "rested"

    @sl.workflow("quick")
    async def quick(ctx: stepline.Context, input: Any) -> str:
        return await ctx.step("one", lambda: "done")  # type: ignore[no-any-return]

    async with (
        orchestrator_stack(database_url, timer_lead_seconds=3.0, max_inflight=1) as stack,
        app_server(sl) as app_url,
    ):
        await stack.register(sl, app_url)
        napper = await stack.client.start_run("long-nap", None)
        # Begun ahead of time, the sleep already reads as completed (at its wakeAt).
        await step_in(stack, napper["id"], "nap", "completed")
        other = await stack.client.start_run("quick", None)
        quick_done = await stack.client.wait_run(other["id"], timeout=30)
        assert quick_done["status"] == "completed", quick_done
        nap_done = await stack.client.wait_run(napper["id"], timeout=30)
        assert nap_done["status"] == "completed", nap_done
        wake_at = datetime.fromisoformat(step_of(nap_done, "nap")["wakeAt"])
        assert datetime.fromisoformat(quick_done["endedAt"]) < wake_at
        assert datetime.fromisoformat(nap_done["endedAt"]) >= wake_at


async def test_sleeping_runs_survive_an_orchestrator_restart(database_url: str) -> None:
    """Runs sleeping when the orchestrator stops all complete under a new orchestrator."""
    counts: Counts = {}
    sl = sleepy_app(counts)
    async with app_server(sl) as app_url:
        async with orchestrator_stack(database_url) as stack:
            await stack.register(sl, app_url)
            ids = [
                (await stack.client.start_run("nap", {"n": n, "seconds": 2}))["id"]
                for n in range(3)
            ]
            for run_id in ids:
                await step_in(stack, run_id, "nap", "sleeping")
        assert counts == {f"before:{n}": 1 for n in range(3)}
        async with orchestrator_stack(database_url) as stack:
            done = [await stack.client.wait_run(run_id, timeout=30) for run_id in ids]
            assert [d["status"] for d in done] == ["completed"] * 3, done
            assert [d["output"]["n"] for d in done] == [0, 1, 2]
            for run_id in ids:
                types = await event_types(stack, run_id)
                assert types.count("step.sleeping") == 1
                assert types[-1] == "run.completed"
    assert counts == {f"{k}:{n}": 1 for n in range(3) for k in ("before", "after")}


# -- callbacks ------------------------------------------------------------------------------


def callback_app(counts: Counts, urls: dict[str, str]) -> stepline.Stepline:
    sl = stepline.Stepline("secret-waits")

    @sl.workflow("approve")
    async def approve(ctx: stepline.Context, input: dict[str, Any]) -> Any:
        cb = await ctx.callback("approval", timeout=input["timeout"])

        def notify(url: str) -> str:
            bump(counts, "notify")
            urls[ctx.run_id] = url
            return url

        sent = await ctx.step("notify", notify, cb.url)
        assert sent == cb.url
        try:
            body = await cb.wait()
        except stepline.CallbackTimeout:
            return "timed out"
        return {"approved": body, "callbackId": cb.id}

    return sl


async def test_callback_through_signed_url(database_url: str, kind: str) -> None:
    """A callback completes via its signed URL (no key); twice is 409, a forged URL is 404."""
    counts: Counts = {}
    urls: dict[str, str] = {}
    sl = callback_app(counts, urls)
    async with orchestrator_stack(database_url) as stack, hosted(stack, sl, kind):
        run = await stack.client.start_run("approve", {"timeout": "1m"})
        waiting = await step_in(stack, run["id"], "approval", "waiting")
        assert waiting["status"] == "running"
        cb_id = step_of(waiting, "approval")["callbackId"]
        url = await until(lambda: asyncio.sleep(0, urls.get(run["id"])), "the callback URL")
        # The first invocation has ended (its last result commits with its end), so the
        # history below has one order.
        await step_in(stack, run["id"], "notify", "completed")
        assert cb_id in url and url.startswith(stack.url)
        assert (await stack.client.get_callback(cb_id))["status"] == "pending"

        async with httpx.AsyncClient(timeout=10) as anon:
            forged = url[:-1] + ("A" if url[-1] != "A" else "B")
            answer = await anon.post(forged, json={"ok": "forged"})
            assert answer.status_code == 404, answer.text
            assert answer.json()["error"]["code"] == "not_found"

            answer = await anon.post(url, json={"ok": True, "by": "ann"})
            assert answer.status_code == 200, answer.text
            assert answer.json()["status"] == "completed"

            done = await stack.client.wait_run(run["id"], timeout=30)
            assert done["status"] == "completed", done
            assert done["output"] == {"approved": {"ok": True, "by": "ann"}, "callbackId": cb_id}

            again = await anon.post(url, json={"ok": False})
            assert again.status_code == 409, again.text
            assert again.json()["error"]["code"] == "invalid_state"

        callback = await stack.client.get_callback(cb_id)
        assert callback["status"] == "completed"
        assert callback["body"] == {"ok": True, "by": "ann"}
        assert counts == {"notify": 1}
        pairs = await history(stack, run["id"])
        assert [t for t, _ in pairs] == [
            "run.started",
            "invocation.started",
            "step.waiting",
            "step.started",
            "step.completed",
            "invocation.ended",
            "callback.completed",
            "step.completed",
            "invocation.started",
            "invocation.ended",
            "run.completed",
        ]
        assert step_events(pairs, "approval") == [
            "step.waiting",
            "callback.completed",
            "step.completed",
        ]


async def test_callback_with_api_key_and_timeout(database_url: str, kind: str) -> None:
    """A callback completes via POST /v1/callbacks/{id}; another times out: CallbackTimeout."""
    counts: Counts = {}
    urls: dict[str, str] = {}
    sl = callback_app(counts, urls)
    async with orchestrator_stack(database_url) as stack, hosted(stack, sl, kind):
        keyed = await stack.client.start_run("approve", {"timeout": "1m"})
        late = await stack.client.start_run("approve", {"timeout": "1s"})
        waiting = await step_in(stack, keyed["id"], "approval", "waiting")
        cb_id = step_of(waiting, "approval")["callbackId"]
        await until(lambda: asyncio.sleep(0, keyed["id"] in urls), "the callback URL")

        answer = await stack.client.complete_callback(cb_id, {"decision": "yes"})
        assert answer["status"] == "completed" and answer["body"] == {"decision": "yes"}
        done = await stack.client.wait_run(keyed["id"], timeout=30)
        assert done["status"] == "completed", done
        assert done["output"] == {"approved": {"decision": "yes"}, "callbackId": cb_id}
        await expect_api_error(
            stack.client.complete_callback(cb_id, {"decision": "no"}), 409, "invalid_state"
        )
        assert (await stack.client.get_callback(cb_id))["body"] == {"decision": "yes"}

        timed = await stack.client.wait_run(late["id"], timeout=30)
        assert timed["status"] == "completed", timed
        assert timed["output"] == "timed out"
        late_cb = step_of(timed, "approval")
        assert late_cb["status"] == "failed"
        assert late_cb["error"]["code"] == "callback_timeout"
        assert (await stack.client.get_callback(late_cb["callbackId"]))["status"] == "timedOut"
        await expect_api_error(
            stack.client.complete_callback(late_cb["callbackId"], {}), 409, "invalid_state"
        )
        assert counts == {"notify": 2}
        pairs = await history(stack, late["id"])
        assert step_events(pairs, "approval") == ["step.waiting", "step.failed"]
        assert [t for t, _ in pairs][-1] == "run.completed"


# -- events ---------------------------------------------------------------------------------


def event_app(counts: Counts) -> stepline.Stepline:
    sl = stepline.Stepline("secret-waits")

    @sl.workflow("kyc")
    async def kyc(ctx: stepline.Context, input: dict[str, Any]) -> Any:
        await ctx.step("begin", lambda: bump(counts, f"begin:{input['userId']}"))
        data = await ctx.wait_for_event(
            "kyc", event="kyc.approved", match={"userId": input["userId"]},
            timeout=input["timeout"],
        )  # fmt: skip
        bump(counts, f"seen:{input['userId']}:{data is not None}")
        return {"data": data}

    return sl


async def test_event_resumes_only_the_matching_run(database_url: str, kind: str) -> None:
    """An event with match resumes only the run whose match fields equal its data."""
    counts: Counts = {}
    sl = event_app(counts)
    async with orchestrator_stack(database_url) as stack, hosted(stack, sl, kind):
        u1 = await stack.client.start_run("kyc", {"userId": "u1", "timeout": "30s"})
        u2 = await stack.client.start_run("kyc", {"userId": "u2", "timeout": "2s"})
        await step_in(stack, u1["id"], "kyc", "waiting")
        await step_in(stack, u2["id"], "kyc", "waiting")

        sent = await stack.client.send_event("kyc.approved", {"userId": "u1", "level": 2})
        assert sent["matchedRuns"] == 1
        one = await stack.client.wait_run(u1["id"], timeout=30)
        assert one["status"] == "completed", one
        assert one["output"] == {"data": {"userId": "u1", "level": 2}}
        two = await stack.client.wait_run(u2["id"], timeout=30)
        assert two["status"] == "completed", two
        assert two["output"] == {"data": None}
        assert counts["begin:u1"] == 1 and counts["begin:u2"] == 1

        pairs = await history(stack, u1["id"])
        assert step_events(pairs, "kyc") == ["step.waiting", "event.received", "step.completed"]
        assert [t for t, _ in pairs][-1] == "run.completed"
        pairs = await history(stack, u2["id"])
        assert step_events(pairs, "kyc") == ["step.waiting", "step.completed"]
        assert "event.received" not in [t for t, _ in pairs]


async def test_one_event_resumes_every_wait_for_it(database_url: str) -> None:
    """An event resumes every run waiting for it, and every wait for it within a run: two
    runs, one of them waiting twice in parallel. The answer counts runs, each history numbers
    its events without a gap, and the event's id is the one it was stored under."""
    sl = stepline.Stepline("secret-waits")

    @sl.workflow("gate")
    async def gate(ctx: stepline.Context, input: int) -> Any:
        waits = [
            ctx.wait_for_event(f"open-{i}", event="gate.open", timeout="30s") for i in range(input)
        ]
        return await asyncio.gather(*waits)

    async with orchestrator_stack(database_url) as stack, app_server(sl) as app_url:
        await stack.register(sl, app_url)
        twice = await stack.client.start_run("gate", 2)
        once = await stack.client.start_run("gate", 1)
        await step_in(stack, twice["id"], "open-1", "waiting")
        await step_in(stack, once["id"], "open-0", "waiting")

        sent = await stack.client.send_event("gate.open", {"at": 1})
        assert sent["matchedRuns"] == 2
        done = [await stack.client.wait_run(r["id"], timeout=30) for r in (twice, once)]
        assert [d["output"] for d in done] == [[{"at": 1}, {"at": 1}], [{"at": 1}]]
        pairs = await history(stack, twice["id"])
        for name in ("open-0", "open-1"):
            assert step_events(pairs, name) == ["step.waiting", "event.received", "step.completed"]
        await event_types(stack, twice["id"])  # numbered 1, 2, 3, ... without a gap
        async with stack.orchestrator.pool.acquire() as conn:
            stored = await conn.fetchval("SELECT id::text FROM events WHERE name = 'gate.open'")
        assert stored == sent["id"]


async def test_an_event_matches_by_equal_fields_and_any_data_matches_no_fields(
    database_url: str,
) -> None:
    """A wait with no match fields takes an event whatever its data (null, a string); a wait
    whose match field is a list takes only an event whose field is that very list, not one
    whose list merely contains it."""
    sl = stepline.Stepline("secret-waits")

    @sl.workflow("listen")
    async def listen(ctx: stepline.Context, input: dict[str, Any]) -> Any:
        return await ctx.wait_for_event(
            "heard", event=input["event"], match=input.get("match"), timeout="30s"
        )

    async with orchestrator_stack(database_url) as stack, app_server(sl) as app_url:
        await stack.register(sl, app_url)
        any_ping = await stack.client.start_run("listen", {"event": "ping"})
        any_word = await stack.client.start_run("listen", {"event": "word"})
        tagged = await stack.client.start_run(
            "listen", {"event": "tagged", "match": {"tags": ["a"]}}
        )
        for run in (any_ping, any_word, tagged):
            await step_in(stack, run["id"], "heard", "waiting")

        assert (await stack.client.send_event("ping", None))["matchedRuns"] == 1
        assert (await stack.client.send_event("word", "hello"))["matchedRuns"] == 1
        wider = await stack.client.send_event("tagged", {"tags": ["a", "b"]})
        assert wider["matchedRuns"] == 0
        exact = await stack.client.send_event("tagged", {"tags": ["a"], "by": "me"})
        assert exact["matchedRuns"] == 1

        outputs = [
            (await stack.client.wait_run(r["id"], timeout=30))["output"]
            for r in (any_ping, any_word, tagged)
        ]
        assert outputs == [None, "hello", {"tags": ["a"], "by": "me"}]


async def test_event_sent_before_the_wait_does_not_count(database_url: str) -> None:
    """An event sent before a run began waiting does not resume it: it times out with None."""
    counts: Counts = {}
    sl = event_app(counts)
    async with orchestrator_stack(database_url) as stack, app_server(sl) as app_url:
        await stack.register(sl, app_url)
        early = await stack.client.send_event("kyc.approved", {"userId": "u3"})
        assert early["matchedRuns"] == 0
        run = await stack.client.start_run("kyc", {"userId": "u3", "timeout": "1s"})
        done = await stack.client.wait_run(run["id"], timeout=30)
        assert done["status"] == "completed", done
        assert done["output"] == {"data": None}
        assert counts == {"begin:u3": 1, "seen:u3:False": 1}
        assert "event.received" not in await event_types(stack, run["id"])


# -- child workflows ------------------------------------------------------------------------


def family_app(counts: Counts) -> stepline.Stepline:
    sl = stepline.Stepline("secret-waits")

    @sl.workflow("parent-wf")
    async def parent(ctx: stepline.Context, input: dict[str, Any]) -> Any:
        await ctx.step("prepare", lambda: bump(counts, "prepare"))
        try:
            result = await ctx.invoke("child", "child-wf", {"x": input["x"]})
        except stepline.ChildWorkflowFailed as exc:
            bump(counts, "caught")
            return {"failed": exc.message}
        return {"child": result}

    @sl.workflow("child-wf")
    async def child(ctx: stepline.Context, input: dict[str, Any]) -> Any:
        def double() -> int:
            bump(counts, "double")
            if input["x"] < 0:
                raise stepline.TerminalError("negative input")
            return int(input["x"]) * 2

        return {"doubled": await ctx.step("double", double)}

    return sl


async def test_child_output_reaches_the_parent(database_url: str, kind: str) -> None:
    """A child run's output is what ctx.invoke returns; child and parent point at each other."""
    counts: Counts = {}
    sl = family_app(counts)
    async with orchestrator_stack(database_url) as stack, hosted(stack, sl, kind):
        run = await stack.client.start_run("parent-wf", {"x": 21})
        done = await stack.client.wait_run(run["id"], timeout=30)
        assert done["status"] == "completed", done
        assert done["output"] == {"child": {"doubled": 42}}
        step = step_of(done, "child")
        assert step["kind"] == "invoke" and step["status"] == "completed"
        child = await stack.client.get_run(step["childRunId"])
        assert child["status"] == "completed" and child["workflow"] == "child-wf"
        assert child["parentRunId"] == run["id"]
        assert child["input"] == {"x": 21} and child["output"] == {"doubled": 42}
        assert counts == {"prepare": 1, "double": 1}
        pairs = await history(stack, run["id"])
        assert step_events(pairs, "child") == ["step.waiting", "step.completed"]
        assert [t for t, _ in pairs][-1] == "run.completed"
        assert await event_types(stack, child["id"]) == [
            "run.started",
            "invocation.started",
            "step.started",
            "step.completed",
            "invocation.ended",
            "run.completed",
        ]


async def test_failing_child_raises_in_the_parent(database_url: str, kind: str) -> None:
    """A child failing with TerminalError raises ChildWorkflowFailed in the parent."""
    counts: Counts = {}
    sl = family_app(counts)
    async with orchestrator_stack(database_url) as stack, hosted(stack, sl, kind):
        run = await stack.client.start_run("parent-wf", {"x": -1})
        done = await stack.client.wait_run(run["id"], timeout=30)
        assert done["status"] == "completed", done
        assert "negative input" in done["output"]["failed"]
        step = step_of(done, "child")
        assert step["status"] == "failed"
        assert step["error"]["type"] == "ChildWorkflowFailed"
        child = await stack.client.get_run(step["childRunId"])
        assert child["status"] == "failed" and child["parentRunId"] == run["id"]
        assert counts == {"prepare": 1, "double": 1, "caught": 1}
        pairs = await history(stack, run["id"])
        assert step_events(pairs, "child") == ["step.waiting", "step.failed"]
        assert [t for t, _ in pairs][-1] == "run.completed"


# -- parallel -------------------------------------------------------------------------------


async def test_gather_of_steps_and_a_sleep(database_url: str, kind: str) -> None:
    """asyncio.gather of three steps and a sleep completes, each step run once."""
    counts: Counts = {}
    sl = stepline.Stepline("secret-waits")

    @sl.workflow("fan-out")
    async def fan_out(ctx: stepline.Context, input: Any) -> Any:
        async def work(name: str) -> str:
            bump(counts, name)
            await asyncio.sleep(0.05)
            return name.upper()

        a, b, c, _ = await asyncio.gather(
            ctx.step("a", work, "a"),
            ctx.step("b", work, "b"),
            ctx.step("c", work, "c"),
            ctx.sleep("pause", 1),
        )
        return [a, b, c]

    async with orchestrator_stack(database_url) as stack, hosted(stack, sl, kind):
        started = time.monotonic()
        run = await stack.client.start_run("fan-out", None)
        done = await stack.client.wait_run(run["id"], timeout=30)
        assert done["status"] == "completed", done
        assert done["output"] == ["A", "B", "C"]
        assert time.monotonic() - started >= 1.0
        assert counts == {"a": 1, "b": 1, "c": 1}
        assert {s["name"]: s["status"] for s in done["steps"]} == {
            "a": "completed",
            "b": "completed",
            "c": "completed",
            "pause": "completed",
        }
        pairs = await history(stack, run["id"])
        types = [t for t, _ in pairs]
        assert types.count("step.started") == 3 and types.count("step.sleeping") == 1
        assert types.count("invocation.started") == 2
        for name in "abc":
            assert step_events(pairs, name) == ["step.started", "step.completed"]
        assert step_events(pairs, "pause") == ["step.sleeping", "step.completed"]
        assert types[-1] == "run.completed"


# -- cancel ---------------------------------------------------------------------------------


async def test_cancel_runs_cleanup_once(database_url: str, kind: str) -> None:
    """A cancelled sleeping run goes cancelling then cancelled; its cleanup step runs once."""
    counts: Counts = {}
    sl = stepline.Stepline("secret-waits")

    @sl.workflow("long-wait")
    async def long_wait(ctx: stepline.Context, input: Any) -> Any:
        await ctx.step("prepare", lambda: bump(counts, "prepare"))
        try:
            await ctx.sleep("long", "1h")
        except stepline.Cancelled:
            await ctx.step("cleanup", lambda: bump(counts, "cleanup"))
            raise
        bump(counts, "woke")
        return "woke"

    async with orchestrator_stack(database_url) as stack, hosted(stack, sl, kind):
        run = await stack.client.start_run("long-wait", None)
        await step_in(stack, run["id"], "long", "sleeping")
        async with raw_client(stack) as http:
            answer = await http.post(f"/v1/runs/{run['id']}/cancel")
            assert answer.status_code == 202, answer.text
            assert answer.json()["status"] == "cancelling"
            done = await stack.client.wait_run(run["id"], timeout=30)
            assert done["status"] == "cancelled", done
            assert counts == {"prepare": 1, "cleanup": 1}
            assert {s["name"]: s["status"] for s in done["steps"]} == {
                "prepare": "completed",
                "long": "cancelled",
                "cleanup": "completed",
            }
            again = await http.post(f"/v1/runs/{run['id']}/cancel")
            assert again.status_code == 409, again.text
            assert again.json()["error"]["code"] == "invalid_state"
        await expect_api_error(stack.client.cancel_run(run["id"]), 409, "invalid_state")
        pairs = await history(stack, run["id"])
        types = [t for t, _ in pairs]
        assert types.index("run.cancelling") < types.index("run.cancelled") == len(types) - 1
        assert step_events(pairs, "long") == ["step.sleeping", "step.cancelled"]
        assert step_events(pairs, "cleanup") == ["step.started", "step.completed"]
        assert types.index("run.cancelling") < pairs.index(("step.started", "cleanup"))


# -- time limit -----------------------------------------------------------------------------


async def test_time_limit_ends_the_run_timed_out(database_url: str) -> None:
    """A workflow with timeout="1s" that sleeps 5 s ends timedOut, about a second in."""
    counts: Counts = {}
    sl = stepline.Stepline("secret-waits")

    @sl.workflow("too-slow", timeout="1s")
    async def too_slow(ctx: stepline.Context, input: Any) -> Any:
        await ctx.step("begin", lambda: bump(counts, "begin"))
        await ctx.sleep("long", 5)
        bump(counts, "after")
        return "done"

    async with orchestrator_stack(database_url) as stack, app_server(sl) as app_url:
        await stack.register(sl, app_url)
        started = time.monotonic()
        run = await stack.client.start_run("too-slow", None)
        done = await stack.client.wait_run(run["id"], timeout=30)
        assert done["status"] == "timedOut", done
        assert time.monotonic() - started < 4.5
        assert done["error"]["code"] == "timed_out"
        assert counts == {"begin": 1}
        assert step_of(done, "long")["status"] == "cancelled"
        pairs = await history(stack, run["id"])
        assert step_events(pairs, "long") == ["step.sleeping", "step.cancelled"]
        assert [t for t, _ in pairs][-1] == "run.timedOut"


# -- retry ----------------------------------------------------------------------------------


async def test_retry_from_a_step_after_a_code_fix(database_url: str, kind: str) -> None:
    """A run failed at step b runs again from b on fixed code; step a ran once in total."""
    counts: Counts = {}
    fixed = {"b": False}
    sl = stepline.Stepline("secret-waits")

    @sl.workflow("fixable")
    async def fixable(ctx: stepline.Context, input: Any) -> Any:
        def a() -> int:
            bump(counts, "a")
            return 1

        def b(v: int) -> int:
            bump(counts, "b")
            if not fixed["b"]:
                raise stepline.TerminalError("bug in b")
            return v + 10

        x = await ctx.step("a", a)
        y = await ctx.step("b", b, x)
        z = await ctx.step("c", lambda: bump(counts, "c", y * 2))
        return {"z": z}

    async with orchestrator_stack(database_url) as stack, hosted(stack, sl, kind):
        run = await stack.client.start_run("fixable", None)
        failed = await stack.client.wait_run(run["id"], timeout=30)
        assert failed["status"] == "failed", failed
        assert "bug in b" in failed["error"]["message"]
        assert counts == {"a": 1, "b": 1}

        fixed["b"] = True
        async with raw_client(stack) as http:
            answer = await http.post(f"/v1/runs/{run['id']}/retry", json={"fromStep": "b"})
            assert answer.status_code == 202, answer.text
            assert answer.json()["status"] == "running"
            done = await stack.client.wait_run(run["id"], timeout=30)
            assert done["status"] == "completed", done
            assert done["output"] == {"z": 22}
            assert counts == {"a": 1, "b": 2, "c": 1}
            again = await http.post(f"/v1/runs/{run['id']}/retry", json={})
            assert again.status_code == 409, again.text
            assert again.json()["error"]["code"] == "invalid_state"
        await expect_api_error(stack.client.retry_run(run["id"]), 409, "invalid_state")
        pairs = await history(stack, run["id"])
        types = [t for t, _ in pairs]
        assert types.count("run.failed") == 1 and types[-1] == "run.completed"
        assert types.index("run.failed") < types.index("run.retried")
        assert step_events(pairs, "a") == ["step.started", "step.completed"]
        assert step_events(pairs, "b") == [
            "step.started",
            "step.failed",
            "step.started",
            "step.completed",
        ]


# -- beyond the basics ----------------------------------------------------------------------


async def test_timers_fire_once_with_two_orchestrators(database_url: str) -> None:
    """Two orchestrators on one database: every sleeping run resumes exactly once."""
    counts: Counts = {}
    sl = sleepy_app(counts)
    async with (
        app_server(sl) as app_url,
        orchestrator_stack(database_url) as one,
        orchestrator_stack(database_url) as two,
    ):
        await one.register(sl, app_url)
        ids = [
            (await (one if n % 2 else two).client.start_run("nap", {"n": n, "seconds": 1}))["id"]
            for n in range(6)
        ]
        done = [await one.client.wait_run(run_id, timeout=30) for run_id in ids]
        assert [d["status"] for d in done] == ["completed"] * 6, done
        for run_id in ids:
            types = await event_types(one, run_id)
            assert types.count("invocation.started") == 2
            assert types.count("run.completed") == 1
    assert counts == {f"{k}:{n}": 1 for n in range(6) for k in ("before", "after")}


async def test_gather_resumes_when_any_branch_can_move(database_url: str, kind: str) -> None:
    """Branches of a gather block on a sleep and a callback; each moves on when it can."""
    counts: Counts = {}
    urls: dict[str, str] = {}
    sl = stepline.Stepline("secret-waits")

    @sl.workflow("two-branches")
    async def two_branches(ctx: stepline.Context, input: Any) -> Any:
        async def timer_branch() -> str:
            await ctx.sleep("short", timedelta(seconds=1))
            return await ctx.step("after-sleep", lambda: bump(counts, "after-sleep", "slept"))

        async def callback_branch() -> Any:
            cb = await ctx.callback("answer")
            await ctx.step("publish", lambda: urls.setdefault("url", cb.url))
            body = await cb.wait()
            await ctx.step("after-callback", lambda: bump(counts, "after-callback"))
            return body

        return list(await asyncio.gather(timer_branch(), callback_branch()))

    async with orchestrator_stack(database_url) as stack, hosted(stack, sl, kind):
        run = await stack.client.start_run("two-branches", None)
        moved = await step_in(stack, run["id"], "after-sleep", "completed")
        assert moved["status"] == "running"
        assert step_of(moved, "answer")["status"] == "waiting"
        assert counts == {"after-sleep": 1}
        await stack.client.complete_callback(urls["url"], {"v": 1})
        done = await stack.client.wait_run(run["id"], timeout=30)
        assert done["status"] == "completed", done
        assert done["output"] == ["slept", {"v": 1}]
        assert counts == {"after-sleep": 1, "after-callback": 1}
        pairs = await history(stack, run["id"])
        assert [t for t, _ in pairs].count("invocation.started") == 3
        assert pairs.index(("step.completed", "after-sleep")) < pairs.index(
            ("callback.completed", "answer")
        )


async def test_cancel_reaches_a_waiting_child(database_url: str, kind: str) -> None:
    """Cancelling a parent waiting on a child cancels the child too; both end cancelled."""
    counts: Counts = {}
    sl = stepline.Stepline("secret-waits")

    @sl.workflow("holder")
    async def holder(ctx: stepline.Context, input: Any) -> Any:
        try:
            return await ctx.invoke("kid", "sleeper", None)
        finally:
            await ctx.step("tidy", lambda: bump(counts, "tidy-parent"))

    @sl.workflow("sleeper")
    async def sleeper(ctx: stepline.Context, input: Any) -> Any:
        try:
            await ctx.sleep("long", "1h")
        except stepline.Cancelled:
            await ctx.step("tidy", lambda: bump(counts, "tidy-child"))
            raise
        return "woke"

    async with orchestrator_stack(database_url) as stack, hosted(stack, sl, kind):
        run = await stack.client.start_run("holder", None)
        waiting = await step_in(stack, run["id"], "kid", "waiting")
        child_id = step_of(waiting, "kid")["childRunId"]
        await step_in(stack, child_id, "long", "sleeping")
        answer = await stack.client.cancel_run(run["id"])
        assert answer["status"] == "cancelling"
        done = await stack.client.wait_run(run["id"], timeout=30)
        child = await stack.client.wait_run(child_id, timeout=30)
        assert done["status"] == "cancelled", done
        assert child["status"] == "cancelled", child
        assert counts == {"tidy-parent": 1, "tidy-child": 1}
        assert (await event_types(stack, child_id))[-1] == "run.cancelled"
        pairs = await history(stack, run["id"])
        assert step_events(pairs, "kid") == ["step.waiting", "step.cancelled"]


async def test_one_event_resumes_every_waiting_run(database_url: str) -> None:
    """One event resumes every run waiting for it whose match fields equal its data."""
    counts: Counts = {}
    sl = event_app(counts)
    async with orchestrator_stack(database_url) as stack, app_server(sl) as app_url:
        await stack.register(sl, app_url)
        runs = [
            await stack.client.start_run("kyc", {"userId": "u7", "timeout": "30s"})
            for _ in range(3)
        ]
        for run in runs:
            await step_in(stack, run["id"], "kyc", "waiting")
        sent = await stack.client.send_event("kyc.approved", {"userId": "u7", "ok": True})
        assert sent["matchedRuns"] == 3
        done = [await stack.client.wait_run(r["id"], timeout=30) for r in runs]
        assert [d["output"] for d in done] == [{"data": {"userId": "u7", "ok": True}}] * 3
        assert counts == {"begin:u7": 3, "seen:u7:True": 3}
        again = await stack.client.send_event("kyc.approved", {"userId": "u7"})
        assert again["matchedRuns"] == 0


async def test_cancel_during_a_step_stops_at_the_next_boundary(
    database_url: str, kind: str
) -> None:
    """A cancel while a step runs: that step finishes, the next one never runs, cleanup does."""
    counts: Counts = {}
    started = asyncio.Event()
    sl = stepline.Stepline("secret-waits")

    @sl.workflow("busy")
    async def busy(ctx: stepline.Context, input: Any) -> Any:
        async def slow() -> str:
            bump(counts, "slow")
            started.set()
            await asyncio.sleep(1)
            return "done"

        try:
            await ctx.step("slow", slow)
            await ctx.step("next", lambda: bump(counts, "next"))
        except stepline.Cancelled:
            await ctx.step("cleanup", lambda: bump(counts, "cleanup"))
            raise
        return "finished"

    async with orchestrator_stack(database_url) as stack, hosted(stack, sl, kind):
        run = await stack.client.start_run("busy", None)
        await asyncio.wait_for(started.wait(), 15)
        answer = await stack.client.cancel_run(run["id"])
        assert answer["status"] == "cancelling"
        done = await stack.client.wait_run(run["id"], timeout=30)
        assert done["status"] == "cancelled", done
        assert counts == {"slow": 1, "cleanup": 1}
        assert step_of(done, "slow")["status"] == "completed"
        pairs = await history(stack, run["id"])
        assert step_events(pairs, "next") == ["step.started", "step.cancelled"]
        assert step_events(pairs, "cleanup") == ["step.started", "step.completed"]
        assert [t for t, _ in pairs][-1] == "run.cancelled"


async def test_retry_of_a_run_cancelled_while_waiting_on_a_callback(database_url: str) -> None:
    """A run cancelled while it waits on a callback, retried, waits anew and completes."""
    counts: Counts = {}
    urls: dict[str, str] = {}
    sl = callback_app(counts, urls)
    async with orchestrator_stack(database_url) as stack, app_server(sl) as app_url:
        await stack.register(sl, app_url)
        run = await stack.client.start_run("approve", {"timeout": "1m"})
        waiting = await step_in(stack, run["id"], "approval", "waiting")
        cb_id = step_of(waiting, "approval")["callbackId"]
        await until(lambda: asyncio.sleep(0, run["id"] in urls), "the callback URL")
        await stack.client.cancel_run(run["id"])
        cancelled = await stack.client.wait_run(run["id"], timeout=30)
        assert cancelled["status"] == "cancelled", cancelled
        assert (await stack.client.get_callback(cb_id))["status"] == "cancelled"

        retried = await stack.client.retry_run(run["id"])
        assert retried["status"] == "running"
        again = await step_in(stack, run["id"], "approval", "waiting")
        assert step_of(again, "approval")["callbackId"] == cb_id
        assert (await stack.client.get_callback(cb_id))["status"] == "pending"
        await stack.client.complete_callback(urls[run["id"]], {"second": "try"})
        done = await stack.client.wait_run(run["id"], timeout=30)
        assert done["status"] == "completed", done
        assert done["output"] == {"approved": {"second": "try"}, "callbackId": cb_id}
        assert counts == {"notify": 2}  # recorded after the cancelled wait: it ran again
        types = await event_types(stack, run["id"])
        assert types.index("run.cancelled") < types.index("run.retried")
        assert types[-1] == "run.completed"


async def test_retry_of_a_parent_runs_its_failed_child_again(database_url: str) -> None:
    """A parent failed by its child's bug, retried after the fix, runs the child again."""
    counts: Counts = {}
    fixed = {"child": False}
    sl = stepline.Stepline("secret-waits")

    @sl.workflow("outer")
    async def outer(ctx: stepline.Context, input: Any) -> Any:
        await ctx.step("prepare", lambda: bump(counts, "prepare"))
        return await ctx.invoke("inner", "inner-wf", {"x": 5})

    @sl.workflow("inner-wf")
    async def inner(ctx: stepline.Context, input: dict[str, Any]) -> Any:
        await ctx.step("first", lambda: bump(counts, "first"))

        def buggy() -> int:
            bump(counts, "buggy")
            if not fixed["child"]:
                raise stepline.TerminalError("bug in the child")
            return int(input["x"]) + 1

        return await ctx.step("buggy", buggy)

    async with orchestrator_stack(database_url) as stack, app_server(sl) as app_url:
        await stack.register(sl, app_url)
        run = await stack.client.start_run("outer", None)
        failed = await stack.client.wait_run(run["id"], timeout=30)
        assert failed["status"] == "failed", failed
        assert failed["error"]["type"] == "ChildWorkflowFailed"
        child_id = step_of(failed, "inner")["childRunId"]
        assert (await stack.client.get_run(child_id))["status"] == "failed"

        fixed["child"] = True
        await stack.client.retry_run(run["id"])
        done = await stack.client.wait_run(run["id"], timeout=30)
        assert done["status"] == "completed", done
        assert done["output"] == 6
        assert step_of(done, "inner")["childRunId"] == child_id
        child = await stack.client.get_run(child_id)
        assert child["status"] == "completed" and child["output"] == 6
        assert counts == {"prepare": 1, "first": 1, "buggy": 2}
        child_types = await event_types(stack, child_id)
        # the same child run again (not a new one): it failed, was retried, and started again
        assert child_types.count("run.started") == 2
        assert child_types.index("run.failed") < child_types.index("run.retried")
        assert child_types[child_types.index("run.retried") + 1] == "run.started"
        assert child_types[-1] == "run.completed"


async def test_event_racing_its_wait_is_not_lost(database_url: str) -> None:
    """A step sets off an event that arrives before the wait after it is recorded: the wait
    still receives it (events since the wait's preceding step count)."""
    sl = stepline.Stepline("secret-waits")

    @sl.workflow("self-notify")
    async def self_notify(ctx: stepline.Context, input: dict[str, Any]) -> Any:
        async def trigger() -> int:
            async with stepline.AsyncClient(input["url"], api_key=input["key"]) as client:
                sent = await client.send_event("order.paid", {"order": input["order"]})
            return int(sent["matchedRuns"])

        matched = await ctx.step("trigger", trigger)
        data = await ctx.wait_for_event(
            "paid", event="order.paid", match={"order": input["order"]}, timeout="5s"
        )
        return {"matchedWhenSent": matched, "data": data}

    async with orchestrator_stack(database_url) as stack, app_server(sl) as app_url:
        await stack.register(sl, app_url)
        run = await stack.client.start_run(
            "self-notify", {"url": stack.url, "key": stack.api_key, "order": "o-1"}
        )
        done = await stack.client.wait_run(run["id"], timeout=30)
        assert done["status"] == "completed", done
        assert done["output"] == {"matchedWhenSent": 0, "data": {"order": "o-1"}}
        assert "event.received" in await event_types(stack, run["id"])


async def test_sleep_until_wakes_at_the_given_time(database_url: str) -> None:
    """`sleep_until` records a wake time equal to the one asked for and resumes after it."""
    sl = stepline.Stepline("secret-waits")

    @sl.workflow("until")
    async def until_wf(ctx: stepline.Context, input: Any) -> str:
        start = await ctx.now("start")
        await ctx.sleep_until("alarm", start + timedelta(seconds=1))
        return (await ctx.now("woke")).isoformat()

    async with orchestrator_stack(database_url) as stack, app_server(sl) as app_url:
        await stack.register(sl, app_url)
        run = await stack.client.start_run("until", None)
        sleeping = await step_in(stack, run["id"], "alarm", "sleeping")
        start = datetime.fromisoformat(step_of(sleeping, "start")["output"])
        wake_at = datetime.fromisoformat(step_of(sleeping, "alarm")["wakeAt"])
        assert abs((wake_at - start).total_seconds() - 1.0) < 0.2
        done = await stack.client.wait_run(run["id"], timeout=30)
        assert done["status"] == "completed", done
        assert datetime.fromisoformat(done["output"]) >= wake_at
