"""Replaying a recorded history against changed code, running no step, and the verdicts."""

from __future__ import annotations

import asyncio
from typing import Any

import pydantic

import stepline
from stepline import _replay
from stepline._definitions import WorkflowDef
from stepline._engine import Invocation
from stepline.protocol import InvokeRequest, StepRecord
from tests.unit.test_sdk_engine import Recorder, record, request

Counts = dict[str, int]


class Order(pydantic.BaseModel):
    orderId: str


# What version 1 of the workflow recorded: two steps, then a callback the run waits on.
V1 = [
    record("reserve", "run", "completed", 0, output={"id": "r1"}),
    record("charge", "run", "completed", 1, output={"paid": 10}),
    record("approval", "callback", "waiting", 2, callbackId="c1", callbackUrl="https://x/c1"),
]


def step(counts: Counts, name: str, value: Any = None) -> Any:
    counts[name] = counts.get(name, 0) + 1
    return value


async def check(
    fn: Any, steps: list[StepRecord], *, status: str = "running", **kw: Any
) -> tuple[_replay.Replay, _replay.Verdict]:
    timeout = _timeout(kw)
    done = await _replay.replay(definition_of(fn), request(steps, **kw), **timeout)
    return done, _replay.judge(done, status)


def definition_of(fn: Any) -> WorkflowDef:
    """``fn`` registered as workflow ``wf`` of a Stepline, as an app declares it."""
    sl = stepline.Stepline("secret")
    sl.workflow("wf")(fn)
    definition = sl.get("wf")
    assert definition is not None
    return definition


def _timeout(kw: dict[str, Any]) -> dict[str, Any]:
    return {"timeout": kw.pop("timeout")} if "timeout" in kw else {}


async def real_invocation_error(fn: Any, steps: list[StepRecord]) -> str:
    """The error message a real invocation of this history fails the run with."""
    answer = await Invocation(definition_of(fn), request(steps), Recorder()).run()
    assert answer.status == "failed"
    return str(answer.error.message)


def v1(counts: Counts) -> Any:
    async def wf(ctx: stepline.Context, input: Any) -> Any:
        await ctx.step("reserve", step, counts, "reserve", {"id": "r1"})
        await ctx.step("charge", step, counts, "charge", {"paid": 10})
        approval = await ctx.callback("approval")
        await approval.wait()
        return await ctx.step("ship", step, counts, "ship", "shipped")

    return wf


async def test_unchanged_code_is_ok_and_runs_nothing() -> None:
    """The code that recorded the history replays it: ok, waiting on the callback, no step
    function called."""
    counts: Counts = {}
    done, verdict = await check(v1(counts), V1)
    assert verdict.result == "ok" and done.end is _replay.End.WAITING
    assert "replayed 3 of 3" in verdict.summary and "waits on 'approval'" in verdict.summary
    assert counts == {}


async def test_the_first_new_step_stops_the_replay_unrun() -> None:
    """Once the callback is completed, the replay stops at the next step, which never runs."""
    counts: Counts = {}
    steps = [*V1[:2], record("approval", "callback", "completed", 2, output={"ok": True})]
    done, verdict = await check(v1(counts), steps)
    assert verdict.result == "ok" and done.end is _replay.End.NEXT
    assert done.next == [("ship", "run")] and "would run a run step 'ship' next" in verdict.summary
    assert counts == {}


async def test_a_step_whose_kind_changed_differs_as_a_real_invocation_fails() -> None:
    """'charge' recorded as a run step and now a sleep differs, naming the step and both kinds,
    with the message a real invocation fails the run with."""

    async def wf(ctx: stepline.Context, input: Any) -> None:
        await ctx.step("reserve", lambda: None)
        await ctx.sleep("charge", "1h")

    _, verdict = await check(wf, V1)
    assert verdict.result == "differs" and verdict.difference is not None
    d = verdict.difference
    assert (d.step, d.history, d.code) == (
        "charge", "a run step 'charge'", "makes a sleep step 'charge'"
    )  # fmt: skip
    assert d.message == await real_invocation_error(wf, V1)


async def test_a_renamed_step_differs_naming_both_names() -> None:
    """'charge' renamed 'bill': the history has 'charge' next, the code makes 'bill'."""
    counts: Counts = {}

    async def wf(ctx: stepline.Context, input: Any) -> None:
        await ctx.step("reserve", step, counts, "reserve")
        await ctx.step("bill", step, counts, "bill")

    _, verdict = await check(wf, V1)
    assert verdict.result == "differs" and verdict.difference is not None
    d = verdict.difference
    assert d.step == "charge" and d.history == "a run step 'charge' next"
    assert d.code == "makes a new run step 'bill' there"
    assert d.message == await real_invocation_error(wf, V1)
    assert counts == {}


async def test_swapped_steps_differ() -> None:
    """'charge' met before 'reserve', recorded the other way round, differs naming both."""

    async def wf(ctx: stepline.Context, input: Any) -> None:
        await ctx.step("charge", lambda: None)
        await ctx.step("reserve", lambda: None)

    _, verdict = await check(wf, V1)
    assert verdict.result == "differs" and verdict.difference is not None
    d = verdict.difference
    assert d.step == "reserve"
    assert d.history == "'reserve' recorded before 'charge'"
    assert d.code == "meets 'charge' before 'reserve'"
    assert d.message == await real_invocation_error(wf, V1)


async def test_a_removed_step_the_run_had_passed_warns() -> None:
    """'charge' removed, the run past it: warn naming it, and the replay goes on to the wait."""

    async def wf(ctx: stepline.Context, input: Any) -> None:
        await ctx.step("reserve", lambda: None)
        approval = await ctx.callback("approval")
        await approval.wait()
        await ctx.step("ship", lambda: None)

    done, verdict = await check(wf, V1)
    assert verdict.result == "warn" and verdict.unreached == ["charge"]
    assert done.end is _replay.End.WAITING and "waits on 'approval'" in verdict.summary


async def test_code_that_returns_before_recorded_steps_warns() -> None:
    """Recorded steps the code no longer reaches because it returns earlier: warn."""

    async def wf(ctx: stepline.Context, input: Any) -> str:
        await ctx.step("reserve", lambda: None)
        return "done"

    done, verdict = await check(wf, V1)
    assert verdict.result == "warn" and verdict.unreached == ["charge", "approval"]
    assert done.end is _replay.End.RETURNED


async def test_a_step_used_twice_differs() -> None:
    """Two steps of one name fail a real run: the check says differs."""

    async def wf(ctx: stepline.Context, input: Any) -> None:
        await ctx.step("reserve", lambda: None)
        await ctx.step("reserve", lambda: None)

    _, verdict = await check(wf, V1)
    assert verdict.result == "differs" and verdict.difference is not None
    assert verdict.difference.step == "reserve" and "twice" in verdict.difference.code


async def test_code_that_raises_on_a_recorded_result_differs() -> None:
    """Code that reads a field v1's result lacks raises before reaching recorded steps: the
    history has 'charge' next, the code raises KeyError."""

    async def wf(ctx: stepline.Context, input: Any) -> None:
        reserved = await ctx.step("reserve", lambda: None)
        amount = reserved["amount"]
        await ctx.step("charge", lambda: amount)

    _, verdict = await check(wf, V1)
    assert verdict.result == "differs" and verdict.difference is not None
    assert verdict.difference.step == "charge"
    assert verdict.difference.code.startswith("raises KeyError")


async def test_code_that_raises_after_the_history_warns_unless_the_run_failed() -> None:
    """A raise after every recorded step is a warning for a running run and ok for a failed
    one (the recorded run failed the same way)."""

    async def wf(ctx: stepline.Context, input: Any) -> None:
        await ctx.step("reserve", lambda: None)
        raise stepline.TerminalError("no stock")

    steps = V1[:1]
    done, verdict = await check(wf, steps)
    assert done.end is _replay.End.RAISED and verdict.result == "warn"
    assert "raises TerminalError: no stock" in verdict.summary
    assert (await check(wf, steps, status="failed"))[1].result == "ok"


async def test_an_input_the_code_now_refuses_differs() -> None:
    """A typed workflow whose model no longer accepts the run's input would fail the run."""

    async def wf(ctx: stepline.Context, input: Order) -> None:
        await ctx.step("reserve", lambda: None)

    done = await _replay.replay(definition_of(wf), request(V1, input={"id": 3}))
    verdict = _replay.judge(done, "running", {"id": 3})
    assert verdict.result == "differs" and "refuses" in verdict.summary


async def test_waits_answer_their_recorded_results_and_start_nothing() -> None:
    """Sleeps, values, callbacks, events and children answer what the history has: the code
    returns what it would, and no step, child or callback is made."""
    counts: Counts = {}

    async def wf(ctx: stepline.Context, input: Any) -> Any:
        await ctx.sleep("nap", "1d")
        token = await ctx.uuid("token")
        cb = await ctx.callback("approval")
        body = await cb.wait()
        kyc = await ctx.wait_for_event("kyc", event="kyc.done")
        child = await ctx.invoke("bill", "billing", {"n": 1})
        await ctx.step("mail", step, counts, "mail")
        return [token, body, kyc, child]

    steps = [
        record("nap", "sleep", "completed", 0),
        record("token", "value", "completed", 1, output="u-1"),
        record("approval", "callback", "completed", 2, output={"ok": 1}, callbackId="c"),
        record("kyc", "event", "completed", 3, output={"level": 2}),
        record("bill", "invoke", "completed", 4, output=7, childRunId="k"),
        record("mail", "run", "completed", 5, output=None),
    ]
    invocation = _replay._ReplayInvocation(definition_of(wf), request(steps))
    answer = await invocation.run()
    assert answer.output == ["u-1", {"ok": 1}, {"level": 2}, 7] and answer.updates == []
    done, verdict = await check(wf, steps)
    assert verdict.result == "ok" and done.end is _replay.End.RETURNED and counts == {}


async def test_a_retrying_step_waits_or_would_run_again() -> None:
    """A step retrying later waits; one whose retry is due would run again next (unrun)."""
    counts: Counts = {}

    async def wf(ctx: stepline.Context, input: Any) -> None:
        await ctx.step("flaky", step, counts, "flaky")

    later = [record("flaky", "run", "retrying", 0, attempt=1, blocked=True)]
    due = [record("flaky", "run", "retrying", 0, attempt=1)]
    assert (await check(wf, later))[0].end is _replay.End.WAITING
    done, verdict = await check(wf, due)
    assert done.end is _replay.End.NEXT and done.next == [("flaky", "run")]
    assert verdict.result == "ok" and counts == {}


async def test_a_cancelling_run_replays_its_cleanup_path() -> None:
    """A run whose cancellation was requested gets Cancelled as its next invocation would: the
    cleanup step is what would run next."""

    async def wf(ctx: stepline.Context, input: Any) -> None:
        try:
            await ctx.sleep("nap", "1d")
        except stepline.Cancelled:
            await ctx.step("cleanup", lambda: None)
            raise

    done, verdict = await check(wf, [record("nap", "sleep", "sleeping", 0)], cancelRequested=True)
    assert done.end is _replay.End.NEXT and done.next == [("cleanup", "run")]
    assert verdict.result == "ok"


async def test_a_workflow_awaiting_something_else_forever_warns() -> None:
    """A replay that does not end in its time (the code awaits something outside ctx) warns."""

    async def wf(ctx: stepline.Context, input: Any) -> None:
        await ctx.step("reserve", lambda: None)
        await asyncio.Event().wait()

    done, verdict = await check(wf, V1[:1], timeout=0.3)
    assert done.end is _replay.End.TIMEOUT and verdict.result == "warn"


async def test_parallel_branches_replay_without_a_difference() -> None:
    """Steps of gathered branches, recorded interleaved, replay ok."""

    async def wf(ctx: stepline.Context, input: Any) -> Any:
        async def branch(name: str) -> Any:
            first = await ctx.step(f"{name}1", lambda: None)
            await ctx.sleep(f"{name}-nap", "1h")
            return first

        return await asyncio.gather(branch("a"), branch("b"))

    steps = [
        record("a1", "run", "completed", 0, output=1),
        record("b1", "run", "completed", 1, output=2),
        record("a-nap", "sleep", "completed", 2),
        record("b-nap", "sleep", "sleeping", 3),
    ]
    done, verdict = await check(wf, steps)
    assert verdict.result == "ok" and done.end is _replay.End.WAITING
    assert "waits on 'b-nap'" in verdict.summary


def test_the_replay_route_answer_becomes_an_invocation() -> None:
    """``GET /v1/runs/{id}/replay``'s answer reads as an invocation carrying those steps."""
    history = {
        "runId": "r1",
        "workflow": "wf",
        "status": "running",
        "input": {"a": 1},
        "cancelRequested": False,
        "version": 1,
        "deploymentId": None,
        "steps": [
            {"name": "a", "kind": "run", "status": "completed", "position": 0, "attempt": 1,
             "output": 3, "error": None, "wakeAt": None, "callbackId": None,
             "callbackUrl": None, "childRunId": None, "timedOut": False, "blocked": False},
        ],
    }  # fmt: skip
    req = _replay.request_of(history)
    assert isinstance(req, InvokeRequest)
    assert (req.run_id, req.input, [s.output for s in req.steps]) == ("r1", {"a": 1}, [3])


async def test_a_removed_branch_while_another_waits_warns_of_what_may_fail() -> None:
    """A gathered branch's recorded step gone while the other branch sleeps: warn, saying a new
    step before it would fail the run (the engine cannot tell a rename from a removal there)."""

    async def wf(ctx: stepline.Context, input: Any) -> None:
        await ctx.sleep("nap", "1h")
        await ctx.step("after", lambda: None)

    steps = [record("nap", "sleep", "sleeping", 0), record("side", "run", "completed", 1)]
    done, verdict = await check(wf, steps)
    assert done.end is _replay.End.WAITING and verdict.result == "warn"
    assert verdict.unreached == ["side"] and "would fail the run" in verdict.summary


async def test_ctx_log_is_silent_in_a_replay_check(caplog: Any) -> None:
    """A replay check keeps no log line and writes none to the app's log, even for code it
    runs past the recorded steps."""
    import logging

    counts: Counts = {}

    async def wf(ctx: stepline.Context, input: Any) -> Any:
        ctx.log.info("before")
        await ctx.step("reserve", step, counts, "reserve", {"id": "r1"})
        await ctx.step("charge", step, counts, "charge", {"paid": 10})
        approval = await ctx.callback("approval")
        ctx.log.warning("past every recorded step")
        await approval.wait()

    with caplog.at_level(logging.DEBUG, logger="stepline.run"):
        _, verdict = await check(wf, V1)
    assert verdict.result == "ok" and counts == {}
    assert [r for r in caplog.records if r.name == "stepline.run"] == []
