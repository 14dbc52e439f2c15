"""The replay engine end to end through stepline.testing's in-memory orchestrator."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from datetime import UTC, datetime
from typing import Any

import pydantic

import stepline
from stepline import testing


def make() -> stepline.Stepline:
    return stepline.Stepline("test-secret")


async def test_three_steps_complete_in_one_invocation() -> None:
    """Three sequential steps run once each and the run completes with the workflow's output."""
    sl = make()

    def add(a: int, b: int) -> int:
        return a + b

    async def double(x: int) -> int:
        return x * 2

    @sl.workflow("three")
    async def three(ctx: stepline.Context, input: dict[str, int]) -> dict[str, int]:
        a = await ctx.step("add", add, input["x"], 1)
        b = await ctx.step("double", double, a)
        c = await ctx.step("tuple", lambda: (b, "t"))
        return {"a": a, "b": b, "c": c}

    result = await testing.run(sl, "three", {"x": 2})
    assert result.status == "completed"
    assert result.output == {"a": 3, "b": 6, "c": [6, "t"]}
    assert result.step_calls == {"add": 1, "double": 1, "tuple": 1}
    assert result.invocations == 1
    assert [s.status for s in result.steps.values()] == ["completed"] * 3


async def test_step_failing_twice_then_succeeding_is_retried() -> None:
    """A step that fails twice runs three times (side effects counted) and the run completes."""
    sl = make()
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("down")
        return "up"

    @sl.workflow("flaky", retries=stepline.Retries(attempts=3, initial_delay="1s"))
    async def wf(ctx: stepline.Context, input: Any) -> str:
        return await ctx.step("call", flaky)

    result = await testing.run(sl, "flaky")
    assert result.status == "completed"
    assert result.output == "up"
    assert len(calls) == 3
    assert result.step_calls["call"] == 3
    assert result.steps["call"].attempt == 3


async def test_attempts_spent_fail_the_step_and_the_run() -> None:
    """When every attempt fails the step fails with the last error and so does the run."""
    sl = make()

    def broken() -> None:
        raise KeyError("nope")

    @sl.workflow("broken", retries=2)
    async def wf(ctx: stepline.Context, input: Any) -> None:
        await ctx.step("call", broken)

    result = await testing.run(sl, "broken")
    assert result.status == "failed"
    assert result.step_calls["call"] == 2
    assert result.error is not None and result.error.type == "KeyError"


async def test_terminal_error_is_not_retried() -> None:
    """A TerminalError fails the step at once; StepFailed carries its type, message and code."""
    sl = make()
    seen: list[stepline.StepFailed] = []

    def refuse() -> None:
        raise stepline.TerminalError("card declined", code="card_declined")

    @sl.workflow("terminal", retries=5)
    async def wf(ctx: stepline.Context, input: Any) -> None:
        try:
            await ctx.step("charge", refuse)
        except stepline.StepFailed as exc:
            seen.append(exc)
            raise

    result = await testing.run(sl, "terminal")
    assert result.status == "failed"
    assert result.step_calls["charge"] == 1
    assert result.error is not None
    assert (result.error.type, result.error.code) == ("TerminalError", "card_declined")
    assert seen[0].step == "charge" and seen[0].error_message == "card declined"


async def test_renamed_step_is_nondeterminism() -> None:
    """A step renamed between executions fails the run with a nondeterminism error naming both."""
    sl = make()
    names = {"first": "charge"}

    def rename() -> int:
        names["first"] = "charge-card"  # the "new deployment" seen by the next replay
        return 1

    @sl.workflow("renamed")
    async def wf(ctx: stepline.Context, input: Any) -> str:
        await ctx.step(names["first"], rename)
        await ctx.sleep("nap", "1h")
        return "done"

    result = await testing.run(sl, "renamed")
    assert result.status == "failed"
    assert result.error is not None and result.error.code == "nondeterminism"
    assert "'charge-card'" in result.error.message and "'charge'" in result.error.message
    assert result.step_calls["charge"] == 1 and "charge-card" not in result.step_calls


async def test_gather_of_steps_and_a_sleep() -> None:
    """Parallel steps and a sleep in asyncio.gather all finish before the workflow goes on."""
    sl = make()
    running = {"now": 0, "max": 0}

    async def work(value: int) -> int:
        running["now"] += 1
        running["max"] = max(running["max"], running["now"])
        await asyncio.sleep(0.01)
        running["now"] -= 1
        return value

    @sl.workflow("parallel")
    async def wf(ctx: stepline.Context, input: Any) -> list[Any]:
        a, b, _ = await asyncio.gather(
            ctx.step("a", work, 1), ctx.step("b", work, 2), ctx.sleep("nap", "1h")
        )
        c = await ctx.step("c", work, a + b)
        return [a, b, c]

    result = await testing.run(sl, "parallel")
    assert result.status == "completed"
    assert result.output == [1, 2, 3]
    assert running["max"] == 2
    assert result.step_calls == {"a": 1, "b": 1, "c": 1}
    assert result.invocations == 2
    assert result.steps["nap"].status == "completed"


async def test_cancellation_raises_cancelled_and_cleanup_runs() -> None:
    """After a cancel request the next new op raises Cancelled; a cleanup step still runs."""
    sl = make()
    seen: list[str] = []

    @sl.workflow("cancellable")
    async def wf(ctx: stepline.Context, input: Any) -> str:
        await ctx.step("a", lambda: "a")
        try:
            await ctx.step("b", lambda: "b")
            await ctx.sleep("nap", "1d")
            await ctx.step("c", lambda: "c")
        except stepline.Cancelled:
            seen.append("cancelled")
            await ctx.step("cleanup", lambda: "cleaned")
            raise
        return "finished"

    result = await testing.run(sl, "cancellable", cancel_after="a")
    assert result.status == "cancelled"
    assert seen == ["cancelled"]
    assert result.steps["cleanup"].status == "completed"
    assert result.steps["b"].status == "cancelled"  # its start learnt of the cancel: not run
    assert "nap" not in result.steps and "c" not in result.steps


async def test_cancellation_while_sleeping_is_raised_on_replay() -> None:
    """A run cancelled while it sleeps gets Cancelled from the sleep on the next invocation."""
    sl = make()

    @sl.workflow("sleeper")
    async def wf(ctx: stepline.Context, input: Any) -> str:
        await ctx.sleep("nap", "1d")
        await ctx.step("wake", lambda: 1)
        await ctx.sleep("nap2", "1d")
        return "never"

    result = await testing.run(sl, "sleeper", cancel_after="wake")
    assert result.status == "cancelled"
    assert result.steps["nap2"].status == "cancelled"


async def test_callback_completed_and_timed_out() -> None:
    """Callback.wait() returns the POSTed body, or raises CallbackTimeout when none came."""
    sl = make()
    urls: list[str] = []

    @sl.workflow("approve")
    async def wf(ctx: stepline.Context, input: Any) -> Any:
        cb = await ctx.callback("approval", timeout="7d")
        await ctx.step("ask", urls.append, cb.url)
        try:
            return await cb.wait()
        except stepline.CallbackTimeout as exc:
            return f"timed out: {exc.step}"

    approved = await testing.run(sl, "approve", callbacks={"approval": {"ok": True}})
    assert approved.status == "completed" and approved.output == {"ok": True}
    assert urls and urls[0].startswith("memory://")
    timed_out = await testing.run(sl, "approve")
    assert timed_out.output == "timed out: approval"


async def test_event_data_or_none_after_timeout() -> None:
    """wait_for_event returns the matching event's data, or None when it timed out."""
    sl = make()

    @sl.workflow("kyc")
    async def wf(ctx: stepline.Context, input: dict[str, str]) -> Any:
        return await ctx.wait_for_event(
            "kyc", event="kyc.approved", match={"userId": input["userId"]}, timeout="7d"
        )

    data = {"userId": "u1", "level": 2}
    got = await testing.run(sl, "kyc", {"userId": "u1"}, events={"kyc.approved": data})
    assert got.output == data
    none = await testing.run(sl, "kyc", {"userId": "u1"})
    assert none.status == "completed" and none.output is None
    other = await testing.run(sl, "kyc", {"userId": "u2"}, events={"kyc.approved": data})
    assert other.output is None


async def test_test_events_are_keyed_by_event_name_or_by_step_name() -> None:
    """testing.run(events=...) takes the event's name or the waiting step's name as the key;
    with both, the step's entry wins (two waits for one event may get different data)."""
    sl = make()

    @sl.workflow("two-waits")
    async def wf(ctx: stepline.Context, input: Any) -> Any:
        first = await ctx.wait_for_event("first", event="paid", timeout="1d")
        second = await ctx.wait_for_event("second", event="paid", timeout="1d")
        return [first, second]

    by_event = await testing.run(sl, "two-waits", events={"paid": {"n": 1}})
    assert by_event.output == [{"n": 1}, {"n": 1}]
    by_step = await testing.run(sl, "two-waits", events={"second": {"n": 2}})
    assert by_step.output == [None, {"n": 2}]
    both = await testing.run(sl, "two-waits", events={"paid": {"n": 1}, "first": {"n": 0}})
    assert both.output == [{"n": 0}, {"n": 1}]


async def test_child_workflow_output_and_failure() -> None:
    """ctx.invoke returns a child's output, and raises ChildWorkflowFailed when it fails."""
    sl = make()

    @sl.workflow("double")
    async def double(ctx: stepline.Context, input: dict[str, int]) -> int:
        if input["x"] < 0:
            raise stepline.TerminalError("negative", code="negative")
        return await ctx.step("mul", lambda: input["x"] * 2)

    @sl.workflow("parent")
    async def parent(ctx: stepline.Context, input: dict[str, int]) -> Any:
        try:
            return await ctx.invoke("child", "double", {"x": input["x"]})
        except stepline.ChildWorkflowFailed as exc:
            return {"failed": exc.error.code, "child": exc.child_run_id}

    ok = await testing.run(sl, "parent", {"x": 21})
    assert ok.output == 42
    bad = await testing.run(sl, "parent", {"x": -1})
    assert bad.output == {"failed": "negative", "child": "test-parent/child"}


async def test_now_and_uuid_are_stable_across_replays() -> None:
    """ctx.now and ctx.uuid return the recorded value on every replay."""
    sl = make()
    seen: list[tuple[Any, str]] = []

    @sl.workflow("values")
    async def wf(ctx: stepline.Context, input: Any) -> list[str]:
        now = await ctx.now("t")
        token = await ctx.uuid("token")
        seen.append((now, token))
        await ctx.sleep("nap", "1s")
        return [now.isoformat(), token]

    result = await testing.run(sl, "values")
    assert result.invocations == 2 and len(seen) == 2
    assert seen[0] == seen[1]
    assert seen[0][0].tzinfo is not None
    assert result.output == [seen[0][0].isoformat(), seen[0][1]]


async def test_duplicate_step_name_fails_the_run() -> None:
    """Two ops with one name in a run fail it with code duplicate_step, even if caught."""
    sl = make()

    @sl.workflow("dup")
    async def wf(ctx: stepline.Context, input: Any) -> str:
        await ctx.step("x", lambda: 1)
        with contextlib.suppress(ValueError):
            await ctx.step("x", lambda: 2)
        return "swallowed"

    result = await testing.run(sl, "dup")
    assert result.status == "failed"
    assert result.error is not None and result.error.code == "duplicate_step"


async def test_unserialisable_or_huge_step_results_fail_terminally() -> None:
    """A step result that is not JSON, or over 1 MiB, fails the step without retries."""
    sl = make()

    @sl.workflow("bad-result", retries=5)
    async def wf(ctx: stepline.Context, input: str) -> Any:
        if input == "set":
            return await ctx.step("r", lambda: {1, 2})
        return await ctx.step("r", lambda: "x" * (1024 * 1024 + 1))

    not_json = await testing.run(sl, "bad-result", "set")
    assert not_json.status == "failed" and not_json.step_calls["r"] == 1
    assert not_json.error is not None and "JSON" in not_json.error.message
    assert "type set" in not_json.error.message
    huge = await testing.run(sl, "bad-result", "huge")
    assert huge.error is not None and huge.error.code == "payload_too_large"


async def test_a_step_returning_a_datetime_or_uuid_gives_their_strings() -> None:
    """A datetime result becomes its ISO 8601 string and a UUID its string, on the first run
    as on replay."""
    sl = make()
    when = datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)
    ident = uuid.UUID("12345678-1234-5678-1234-567812345678")

    @sl.workflow("dates")
    async def wf(ctx: stepline.Context, input: Any) -> list[Any]:
        at = await ctx.step("at", lambda: when)
        await ctx.sleep("nap", "1s")  # a second invocation replays "at"
        return [at, await ctx.step("id", lambda: ident)]

    result = await testing.run(sl, "dates")
    assert result.status == "completed" and result.invocations == 2
    assert result.output == ["2024-05-06T07:08:09+00:00", str(ident)]


async def test_a_replayed_gather_is_not_taken_for_reordered_steps() -> None:
    """Branches of a gather, recorded interleaved (a1, b1, a2), replay without a nondeterminism
    error, though one branch meets a2 before the other meets b1."""
    sl = make()

    @sl.workflow("branches")
    async def wf(ctx: stepline.Context, input: Any) -> list[Any]:
        async def left() -> list[int]:
            return [await ctx.step("a1", lambda: 1), await ctx.step("a2", lambda: 2)]

        both = await asyncio.gather(left(), ctx.step("b1", lambda: 3))
        await ctx.sleep("nap", "1s")  # the next invocation replays the gather
        return [*both, await ctx.step("after", lambda: 4)]

    result = await testing.run(sl, "branches")
    assert result.status == "completed", result.error
    assert result.output == [[1, 2], 3, 4]
    assert result.invocations == 2
    assert [s.name for s in sorted(result.steps.values(), key=lambda s: s.position)] == [
        "a1", "b1", "a2", "nap", "after",
    ]  # fmt: skip
    assert result.step_calls == {"a1": 1, "a2": 1, "b1": 1, "after": 1}


class Refused(Exception):
    """A validator's own exception class (pydantic lets it through, unlike ValueError)."""


class KnownOrder(pydantic.BaseModel):
    orderId: str

    @pydantic.field_validator("orderId")
    @classmethod
    def known(cls, value: str) -> str:
        if value.startswith("x"):
            raise Refused(f"no such order {value}")
        return value


async def test_input_the_model_refuses_fails_the_run_whatever_the_exception() -> None:
    """A validator of the input model raising its own exception fails the run at once with
    validation_failed naming it, as a ValidationError does; the workflow never runs."""
    sl = make()
    ran: list[str] = []

    @sl.workflow("ship")
    async def ship(ctx: stepline.Context, input: KnownOrder) -> str:
        ran.append(input.orderId)
        return input.orderId

    refused = await testing.run(sl, "ship", {"orderId": "x1"})
    assert refused.status == "failed" and refused.error is not None
    assert refused.error.code == "validation_failed" and refused.error.type == "Refused"
    assert "no such order x1" in refused.error.message and "KnownOrder" in refused.error.message
    invalid = await testing.run(sl, "ship", {"orderId": 7})
    assert invalid.status == "failed" and invalid.error is not None
    assert invalid.error.code == "validation_failed"
    assert ran == []
