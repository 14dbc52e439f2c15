"""The replay engine on hand-made invocations: what it sends, when, and how it answers."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

import pytest

import stepline
from stepline import protocol
from stepline._definitions import WorkflowDef
from stepline._engine import Invocation
from stepline._errors import error_info
from stepline._transport import StaleInvocation
from stepline.protocol import StepRecord


class Recorder:
    """A progress sender that records every call and answers from a script."""

    def __init__(self, cancel: bool = False, stale: bool = False) -> None:
        self.calls: list[list[protocol.StepUpdate]] = []
        self.seqs: list[int] = []
        self.logs: list[list[str]] = []
        self.cancel, self.stale = cancel, stale

    async def progress(
        self,
        request: protocol.InvokeRequest,
        updates: list[protocol.StepUpdate],
        seq: int = 0,
        *,
        logs: list[protocol.LogLine] | None = None,
        logs_dropped: int = 0,
    ) -> protocol.ProgressResponse:
        self.seqs.append(seq)
        self.logs.append([line.message for line in logs or []])
        self.calls.append(updates)
        if self.stale:
            raise StaleInvocation("another invocation owns the run")
        callbacks = {
            u.name: protocol.CallbackInfo(id=f"cb-{u.name}", url=f"https://x/{u.name}")
            for u in updates
            if u.action is protocol.Action.CALLBACK
        }
        return protocol.ProgressResponse(cancelRequested=self.cancel, callbacks=callbacks)


def request(steps: list[StepRecord] | None = None, **kw: Any) -> protocol.InvokeRequest:
    return protocol.InvokeRequest(
        runId="run-1", workflow="wf", invocationId="inv-1", token="tok",
        apiUrl="http://orchestrator", steps=steps or [], **kw,
    )  # fmt: skip


def record(name: str, kind: str, status: str, position: int, **kw: Any) -> StepRecord:
    return StepRecord.model_validate(
        {"name": name, "kind": kind, "status": status, "position": position, **kw}
    )


def brief(updates: list[protocol.StepUpdate]) -> list[tuple[str, str]]:
    return [(u.action.value, u.name) for u in updates]


async def invoke(fn: Any, req: protocol.InvokeRequest, sender: Recorder, **kw: Any) -> Any:
    return await Invocation(WorkflowDef(name="wf", fn=fn, **kw), req, sender).run()


async def test_each_progress_call_carries_the_previous_result() -> None:
    """One progress call per sequential step, each carrying the previous step's result and
    numbered within the invocation."""

    async def wf(ctx: stepline.Context, input: Any) -> int:
        a = await ctx.step("a", lambda: 1)
        b = await ctx.step("b", lambda: a + 1)
        return await ctx.step("c", lambda: b + 1)

    sender = Recorder()
    answer = await invoke(wf, request(), sender)
    assert [brief(c) for c in sender.calls] == [
        [("start", "a")],
        [("complete", "a"), ("start", "b")],
        [("complete", "b"), ("start", "c")],
    ]
    assert sender.seqs == [1, 2, 3]
    assert answer.status == "completed" and answer.output == 3
    assert brief(answer.updates) == [("complete", "c")]


async def test_log_lines_ride_with_the_next_progress_call_or_the_answer() -> None:
    """A line costs no call of its own: the lines written before a step starts go with that
    step's progress call, the last ones with the answer."""

    async def wf(ctx: stepline.Context, input: Any) -> int:
        ctx.log.info("before a")
        a = await ctx.step("a", lambda: 1)
        ctx.log.info("before b")
        b = await ctx.step("b", lambda: a + 1)
        ctx.log.info("at the end")
        return b

    sender = Recorder()
    answer = await invoke(wf, request(), sender)
    assert sender.seqs == [1, 2]
    assert sender.logs == [["before a"], ["before b"]]
    assert [line.message for line in answer.logs] == ["at the end"]


async def test_replayed_steps_send_nothing() -> None:
    """Recorded steps replay without progress calls; only the new step is started."""
    ran: list[str] = []

    async def wf(ctx: stepline.Context, input: Any) -> list[Any]:
        a = await ctx.step("a", ran.append, "a")
        b = await ctx.step("b", ran.append, "b")
        return [a, b]

    steps = [record("a", "run", "completed", 0, output="A")]
    sender = Recorder()
    answer = await invoke(wf, request(steps), sender)
    assert ran == ["b"]
    assert [brief(c) for c in sender.calls] == [[("start", "b")]]
    assert answer.output == ["A", None]


async def test_sleep_suspends_with_the_wait_in_the_answer() -> None:
    """A new sleep needs no progress call: the answer is suspended and carries the sleep."""

    async def wf(ctx: stepline.Context, input: Any) -> None:
        await ctx.now("t")
        await ctx.sleep("nap", "90s")

    sender = Recorder()
    before = time.time()
    answer = await invoke(wf, request(), sender)
    after = time.time()
    assert sender.calls == []
    assert answer.status == "suspended"
    assert brief(answer.updates) == [("complete", "t"), ("sleep", "nap")]
    assert answer.updates[1].delay_ms == 90_000
    # It says when the workflow reached the sleep, for the delay to count from there.
    reached = answer.updates[1].at_ms
    assert reached is not None and before * 1000 - 1 <= reached <= after * 1000 + 1


async def test_retry_uses_backoff_or_retry_after() -> None:
    """A failed attempt is reported as retry with the policy's delay, or retry_after's."""

    def fails() -> None:
        raise stepline.RetryableError("later", retry_after="5m")

    async def wf(ctx: stepline.Context, input: Any) -> None:
        await ctx.step("a", fails)

    retries = stepline.Retries(attempts=4, initial_delay="2s", factor=3)
    steps = [record("a", "run", "retrying", 0, attempt=2)]
    answer = await invoke(wf, request(steps), Recorder(), retries=retries)
    assert answer.status == "suspended"
    (update,) = answer.updates
    assert (update.action, update.attempt, update.delay_ms) == ("retry", 3, 300_000)
    assert retries.delay_ms(1) == 2000 and retries.delay_ms(3) == 18_000
    assert stepline.Retries(max_delay="5s").delay_ms(10) == 5000


async def test_a_retrying_step_not_yet_due_blocks_its_branch_while_another_proceeds() -> None:
    """A retrying record marked blocked is not attempted again (nothing is sent for it) while
    a step in another gather branch runs; the invocation then suspends."""
    ran: list[str] = []

    def later() -> str:
        ran.append("later")
        return "done"

    async def wf(ctx: stepline.Context, input: Any) -> list[Any]:
        return list(await asyncio.gather(ctx.step("later", later), ctx.step("now", ran.append, 1)))

    steps = [record("later", "run", "retrying", 0, attempt=1, blocked=True, wakeAt="2100-01-01")]
    sender = Recorder()
    answer = await invoke(wf, request(steps), sender, retries=stepline.Retries(attempts=5))
    assert ran == [1]
    assert answer.status == "suspended"
    assert [brief(c) for c in sender.calls] == [[("start", "now")]]
    assert brief(answer.updates) == [("complete", "now")]


async def test_a_retrying_step_that_is_due_runs_its_next_attempt() -> None:
    """A retrying record not marked blocked starts its next attempt."""

    async def wf(ctx: stepline.Context, input: Any) -> str:
        return await ctx.step("a", lambda: "ok")

    steps = [record("a", "run", "retrying", 0, attempt=1)]
    sender = Recorder()
    answer = await invoke(wf, request(steps), sender)
    assert [(u.action, u.attempt) for u in sender.calls[0]] == [("start", 2)]
    assert answer.status == "completed" and answer.output == "ok"


async def test_a_try_with_no_recorded_outcome_runs_again_as_the_same_attempt() -> None:
    """A step recorded running on its last attempt lost its outcome (its invocation went away
    mid-step): a delivery failure, not a used attempt. It runs again as that attempt."""
    ran: list[int] = []

    async def wf(ctx: stepline.Context, input: Any) -> str:
        await ctx.step("a", ran.append, 1)
        return "done"

    steps = [record("a", "run", "running", 0, attempt=3)]
    sender = Recorder()
    answer = await invoke(wf, request(steps), sender, retries=stepline.Retries(attempts=3))
    assert ran == [1]
    assert [(u.action, u.attempt) for u in sender.calls[0]] == [("start", 3)]
    assert answer.status == "completed" and answer.output == "done"
    assert [(u.action, u.attempt) for u in answer.updates] == [("complete", 3)]


async def test_a_retrying_step_past_fewer_attempts_fails_with_its_last_error() -> None:
    """A step that failed its 3rd attempt under a workflow now allowing 3 attempts (lowered
    since it was recorded) is not run a 4th time: it fails with the error it had."""
    ran: list[int] = []

    async def wf(ctx: stepline.Context, input: Any) -> None:
        await ctx.step("a", ran.append, 1)

    error = {"type": "ValueError", "message": "boom", "code": "step_failed"}
    steps = [record("a", "run", "retrying", 0, attempt=3, error=error)]
    sender = Recorder()
    answer = await invoke(wf, request(steps), sender, retries=stepline.Retries(attempts=3))
    assert ran == [] and sender.calls == []
    assert answer.status == "failed"
    assert [(u.action, u.attempt, u.error.message) for u in answer.updates] == [("fail", 3, "boom")]


async def test_kind_mismatch_is_nondeterminism() -> None:
    """A recorded run step met as a sleep fails the run with code nondeterminism."""

    async def wf(ctx: stepline.Context, input: Any) -> None:
        await ctx.sleep("a", 1)

    steps = [record("a", "run", "completed", 0, output=1)]
    sender = Recorder()
    answer = await invoke(wf, request(steps), sender)
    assert answer.status == "failed" and answer.error.code == "nondeterminism"
    assert "'a'" in answer.error.message and sender.calls == []


async def test_new_step_before_recorded_one_is_nondeterminism() -> None:
    """A new step while recorded steps are unreached fails before anything is sent or run."""
    ran: list[int] = []

    async def wf(ctx: stepline.Context, input: Any) -> None:
        await ctx.step("a", ran.append, 1)
        await ctx.step("x", ran.append, 2)

    steps = [record("a", "run", "completed", 0), record("b", "run", "completed", 1)]
    sender = Recorder()
    answer = await invoke(wf, request(steps), sender)
    assert answer.status == "failed" and answer.error.code == "nondeterminism"
    assert "'x'" in answer.error.message and "'b'" in answer.error.message
    assert ran == [] and sender.calls == [] and answer.updates == []


async def test_a_removed_step_the_run_had_passed_is_skipped() -> None:
    """A recorded step the code no longer makes, with a later recorded step reached, is not
    nondeterminism: the later steps replay and the new step after them runs."""
    ran: list[str] = []

    async def wf(ctx: stepline.Context, input: Any) -> str:
        await ctx.step("a", ran.append, "a")
        await ctx.sleep("nap", 1)
        return await ctx.step("d", lambda: "d")

    steps = [
        record("a", "run", "completed", 0),
        record("b", "run", "completed", 1, output="b"),
        record("nap", "sleep", "completed", 2),
    ]
    sender = Recorder()
    answer = await invoke(wf, request(steps), sender)
    assert answer.status == "completed" and answer.output == "d"
    assert ran == [] and [brief(c) for c in sender.calls] == [[("start", "d")]]


async def test_a_removed_step_at_the_end_of_the_history_is_nondeterminism() -> None:
    """A new step where the history has a step the code no longer makes (nothing recorded
    after it was reached) is taken as a rename: nondeterminism, nothing run."""

    async def wf(ctx: stepline.Context, input: Any) -> str:
        await ctx.step("a", lambda: "a")
        return await ctx.step("d", lambda: "d")

    steps = [
        record("a", "run", "completed", 0),
        record("b", "run", "completed", 1),
        record("c", "run", "completed", 2),
    ]
    sender = Recorder()
    answer = await invoke(wf, request(steps), sender)
    assert answer.status == "failed" and answer.error.code == "nondeterminism"
    assert "'d'" in answer.error.message and "'b'" in answer.error.message
    assert sender.calls == []


async def test_recorded_steps_met_in_another_order_are_nondeterminism() -> None:
    """Code that meets recorded steps B then A, recorded A then B, fails the run naming both,
    and runs nothing."""
    ran: list[str] = []

    async def wf(ctx: stepline.Context, input: Any) -> None:
        await ctx.step("b", ran.append, "b")
        await ctx.step("a", ran.append, "a")
        await ctx.step("c", ran.append, "c")

    steps = [record("a", "run", "completed", 0), record("b", "run", "completed", 1)]
    sender = Recorder()
    answer = await invoke(wf, request(steps), sender)
    assert answer.status == "failed" and answer.error.code == "nondeterminism"
    assert "'a'" in answer.error.message and "'b'" in answer.error.message
    assert "another order than recorded" in answer.error.message
    assert "not replay-safe" in answer.error.message
    assert ran == [] and sender.calls == [] and answer.updates == []


async def test_cancel_reported_by_progress_reaches_a_blocked_branch() -> None:
    """When a progress reply requests cancellation, a branch blocked on a sleep gets Cancelled."""
    cleaned: list[str] = []

    async def wf(ctx: stepline.Context, input: Any) -> None:
        try:
            await asyncio.gather(ctx.step("a", lambda: 1), ctx.sleep("nap", "1d"))
        except stepline.Cancelled:
            await ctx.step("cleanup", cleaned.append, "done")
            raise

    answer = await invoke(wf, request(), Recorder(cancel=True))
    assert answer.status == "cancelled"
    assert cleaned == ["done"]


async def test_cancel_reported_by_a_step_start_stops_that_step() -> None:
    """A cancel learnt from a step's start call raises Cancelled there; the step never runs."""
    ran: list[str] = []

    async def wf(ctx: stepline.Context, input: Any) -> None:
        try:
            await ctx.step("next", ran.append, "next")
        except stepline.Cancelled:
            await ctx.step("cleanup", ran.append, "cleanup")
            raise

    sender = Recorder(cancel=True)
    answer = await invoke(wf, request(), sender)
    assert answer.status == "cancelled"
    assert ran == ["cleanup"]
    assert [brief(c) for c in sender.calls] == [[("start", "next")], [("start", "cleanup")]]


async def test_cancel_requested_at_start_spares_finished_replays() -> None:
    """With cancelRequested, finished records replay; the first new op raises Cancelled once."""

    async def wf(ctx: stepline.Context, input: Any) -> str:
        a = await ctx.step("a", lambda: 0)
        try:
            await ctx.step("b", lambda: 1)
        except stepline.Cancelled:
            return f"cancelled after {a}"
        return "not cancelled"

    steps = [record("a", "run", "completed", 0, output="A")]
    answer = await invoke(wf, request(steps, cancelRequested=True), Recorder())
    assert answer.status == "cancelled"


async def test_callback_gets_its_id_from_a_progress_call() -> None:
    """ctx.callback costs one progress call whose reply gives the id and URL."""

    async def wf(ctx: stepline.Context, input: Any) -> Any:
        cb = await ctx.callback("approval", timeout="1h")
        assert (cb.id, cb.url) == ("cb-approval", "https://x/approval")
        return await cb.wait()

    sender = Recorder()
    answer = await invoke(wf, request(), sender)
    assert [brief(c) for c in sender.calls] == [[("callback", "approval")]]
    assert sender.calls[0][0].timeout_ms == 3_600_000
    assert answer.status == "suspended" and answer.updates == []


async def test_stale_progress_answers_stale() -> None:
    """A 409 on a progress call stops the workflow and answers stale."""
    ran: list[int] = []

    async def wf(ctx: stepline.Context, input: Any) -> None:
        await ctx.step("a", ran.append, 1)

    answer = await invoke(wf, request(), Recorder(stale=True))
    assert answer.status == "stale" and ran == []


async def test_workflow_awaiting_other_things_is_not_suspended_early() -> None:
    """Awaiting a plain asyncio.sleep between ops does not make the engine suspend the run."""

    async def wf(ctx: stepline.Context, input: Any) -> str:
        await asyncio.sleep(0.02)
        return await ctx.step("a", lambda: "ok")

    answer = await invoke(wf, request(), Recorder())
    assert answer.status == "completed" and answer.output == "ok"


async def test_suspended_signal_is_not_swallowed_by_except_exception() -> None:
    """A ctx call after the execution ended raises _Suspended, which except Exception misses."""
    from stepline._errors import _Suspended

    holder: dict[str, stepline.Context] = {}

    async def wf(ctx: stepline.Context, input: Any) -> None:
        holder["ctx"] = ctx
        await ctx.sleep("nap", 5)

    answer = await invoke(wf, request(), Recorder())
    assert answer.status == "suspended"
    with pytest.raises(_Suspended, match="must not be caught"):
        await holder["ctx"].step("late", lambda: 1)


def charge_card_declined() -> None:
    raise RuntimeError("card declined")


async def test_a_failed_attempt_carries_its_traceback_and_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A step attempt that raises reports a retry whose error has the Python traceback (naming
    the raising function), and logs a warning with step, attempt, run id and the traceback."""

    async def wf(ctx: stepline.Context, input: Any) -> None:
        await ctx.step("charge", charge_card_declined)

    with caplog.at_level(logging.WARNING, logger="stepline"):
        answer = await invoke(wf, request(), Recorder())
    assert answer.status == "suspended"
    (retry,) = answer.updates
    assert retry.action == "retry" and retry.error is not None
    assert retry.error.traceback is not None
    assert "charge_card_declined" in retry.error.traceback
    assert retry.error.traceback.rstrip().endswith("RuntimeError: card declined")
    (logged,) = [r for r in caplog.records if r.name == "stepline"]
    assert logged.levelno == logging.WARNING and logged.exc_info is not None
    assert (logged.step, logged.attempt, logged.run_id) == ("charge", 1, "run-1")
    assert "charge_card_declined" in caplog.text


async def test_a_failed_step_and_workflow_carry_tracebacks_and_the_failure_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A last attempt's fail update and the run's error carry the step's traceback; the failed
    workflow is logged as an error with its traceback."""

    async def wf(ctx: stepline.Context, input: Any) -> None:
        await ctx.step("charge", charge_card_declined)

    steps = [record("charge", "run", "retrying", 0, attempt=1)]
    with caplog.at_level(logging.WARNING, logger="stepline"):
        answer = await invoke(wf, request(steps), Recorder(), retries=stepline.Retries(attempts=2))
    assert answer.status == "failed"
    fail = answer.updates[-1]
    assert fail.action == "fail" and fail.error is not None and fail.error.traceback
    assert "charge_card_declined" in fail.error.traceback
    assert answer.error is not None and answer.error.traceback == fail.error.traceback
    levels = [(r.levelno, r.getMessage().split(":")[0]) for r in caplog.records]
    assert levels == [
        (logging.WARNING, "step_attempt_failed"),
        (logging.ERROR, "workflow_failed"),
    ]
    assert caplog.records[1].exc_info is not None
    assert caplog.records[1].run_id == "run-1"


async def test_logged_failures_show_the_users_frames_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The tracebacks of step_attempt_failed and workflow_failed, as the app's log (and the
    dev console) prints them, hold the user's frames, not the SDK's or asyncio's, as the
    recorded ones do."""

    async def checkout(ctx: stepline.Context, input: Any) -> None:
        await ctx.step("charge", charge_card_declined)

    sdk = os.path.dirname(os.path.abspath(stepline.__file__))
    with caplog.at_level(logging.WARNING, logger="stepline"):
        answer = await invoke(checkout, request(), Recorder(), retries=stepline.Retries(1))
    assert answer.status == "failed"
    printed = {r.getMessage().split(":")[0]: logging.Formatter().format(r) for r in caplog.records}
    assert set(printed) == {"step_attempt_failed", "workflow_failed"}
    assert "in charge_card_declined" in printed["step_attempt_failed"]
    assert "in checkout" in printed["workflow_failed"]
    for text in printed.values():
        assert "Traceback" in text and sdk not in text and "asyncio" not in text, text


def test_a_long_traceback_is_cut_to_16_kib_keeping_its_end() -> None:
    """error_info keeps at most 16 KiB of traceback, its end (the raise site and message)."""
    try:
        raise ValueError("é" * 20_000 + " the end")
    except ValueError as exc:
        info = error_info(exc)
    assert info.traceback is not None
    assert len(info.traceback.encode()) <= 16 * 1024
    assert info.traceback.startswith("[traceback cut")
    assert info.traceback.endswith(" the end\n")
    short = error_info(KeyError("k"))
    assert short.traceback == "KeyError: 'k'\n"
