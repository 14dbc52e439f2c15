"""Run logs in the SDK, through ``stepline.testing`` (the same replay engine as the handler):
``ctx.log`` and the ``logging`` records of step executions are kept once across replays, never
mixed between concurrent runs, and capped as the orchestrator caps them."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

import stepline
from stepline import protocol, testing

log = logging.getLogger("tests.sdk_logs")
log.setLevel(logging.DEBUG)


def _messages(result: testing.RunResult) -> list[tuple[str, str, str | None]]:
    return [(line.level.value, line.message, line.step_name) for line in result.logs]


async def test_workflow_lines_are_kept_once_over_sleeps_and_steps() -> None:
    """Lines between steps and after sleeps come once each, though the code ran again in
    every invocation."""
    sl = stepline.Stepline("whsec_t")

    @sl.workflow("w")
    async def w(ctx: stepline.Context, input: None) -> None:
        ctx.log.info("start")
        await ctx.step("one", lambda: 1)
        ctx.log.debug("after one")
        await ctx.sleep("nap", "1s")
        ctx.log.warning("after the nap", n=1)
        await ctx.step("two", lambda: 2)
        await ctx.sleep("nap2", "1s")
        ctx.log.error("end")

    result = await testing.run(sl, "w")
    assert result.status == "completed" and result.invocations == 3
    assert _messages(result) == [
        ("info", "start", None),
        ("debug", "after one", None),
        ("warning", "after the nap", None),
        ("error", "end", None),
    ]
    assert result.logs[2].fields == {"n": 1}


async def test_logging_records_of_a_step_name_it_sync_and_async() -> None:
    """Records of any logger emitted while a step runs (in its thread for a sync function)
    are kept with the step's name, the logger and the extra fields; records outside steps and
    the SDK's own are not."""
    sl = stepline.Stepline("whsec_t")

    def sync_step() -> int:
        log.info("in a thread %s", "yes", extra={"k": "v"})
        return 1

    async def async_step() -> int:
        log.warning("in the loop")
        return 2

    @sl.workflow("w")
    async def w(ctx: stepline.Context, input: None) -> None:
        log.info("outside any step: not kept")
        await ctx.step("sync", sync_step)
        await ctx.step("async", async_step)
        logging.getLogger("stepline").warning("the SDK's own: not kept")

    result = await testing.run(sl, "w")
    assert _messages(result) == [
        ("info", "in a thread yes", "sync"),
        ("warning", "in the loop", "async"),
    ]
    assert result.logs[0].fields == {"logger": "tests.sdk_logs", "k": "v"}


async def test_a_retried_step_keeps_the_lines_of_each_attempt() -> None:
    """Each attempt of a step is an execution of its own: its records are kept each time."""
    sl = stepline.Stepline("whsec_t")
    tries: list[int] = []

    def flaky() -> str:
        tries.append(1)
        log.info("attempt %d", len(tries))
        if len(tries) < 2:
            raise RuntimeError("again")
        return "ok"

    @sl.workflow("w", retries=stepline.Retries(attempts=3, initial_delay="1ms"))
    async def w(ctx: stepline.Context, input: None) -> str:
        ctx.log.info("before")
        out: str = await ctx.step("flaky", flaky)
        ctx.log.info("after")
        return out

    result = await testing.run(sl, "w")
    assert result.status == "completed"
    assert [line.message for line in result.logs] == ["before", "attempt 1", "attempt 2", "after"]


async def test_parallel_branches_keep_their_new_lines() -> None:
    """Lines a branch writes after a new step of its own are kept once, whatever the other
    branches replay."""
    sl = stepline.Stepline("whsec_t")

    async def branch(ctx: stepline.Context, name: str) -> None:
        await ctx.step(f"{name}-1", lambda: name)
        ctx.log.info(f"{name} after its first step")
        await ctx.sleep(f"{name}-nap", "1s")
        await ctx.step(f"{name}-2", lambda: name)
        ctx.log.info(f"{name} after its second step")

    @sl.workflow("w")
    async def w(ctx: stepline.Context, input: None) -> None:
        await asyncio.gather(branch(ctx, "a"), branch(ctx, "b"))
        ctx.log.info("joined")

    result = await testing.run(sl, "w")
    messages = sorted(line.message for line in result.logs)
    assert messages == sorted(
        [
            "a after its first step",
            "b after its first step",
            "a after its second step",
            "b after its second step",
            "joined",
        ]
    )


async def test_concurrent_runs_never_mix_their_lines() -> None:
    """Two runs executing steps at once in one process each keep only their own records."""
    sl = stepline.Stepline("whsec_t")
    both = asyncio.Barrier(2)

    async def step(who: str) -> str:
        await both.wait()  # both steps are executing now
        log.info("from %s", who)
        await both.wait()
        return who

    @sl.workflow("w")
    async def w(ctx: stepline.Context, input: dict[str, Any]) -> str:
        out: str = await ctx.step("s", step, input["who"])
        return out

    a, b = await asyncio.gather(
        testing.run(sl, "w", {"who": "a"}, run_id="a"),
        testing.run(sl, "w", {"who": "b"}, run_id="b"),
    )
    assert [line.message for line in a.logs] == ["from a"]
    assert [line.message for line in b.logs] == ["from b"]


async def test_an_invocation_sends_no_more_than_a_run_keeps() -> None:
    """Past 1,000 lines the newest are dropped and counted; a long message is cut."""
    sl = stepline.Stepline("whsec_t")

    @sl.workflow("w")
    async def w(ctx: stepline.Context, input: None) -> None:
        ctx.log.info("x" * (protocol.MAX_LOG_MESSAGE + 10))
        for i in range(1100):
            ctx.log.info(f"line {i}")

    result = await testing.run(sl, "w")
    assert len(result.logs) == protocol.MAX_RUN_LOG_LINES
    assert result.logs_dropped == 101
    assert len(result.logs[0].message) == protocol.MAX_LOG_MESSAGE
    assert result.logs[0].message.endswith("(cut)")
    assert result.logs[-1].message == "line 998"


async def test_fields_json_cannot_hold_are_kept_as_their_repr() -> None:
    """A field that is not JSON is kept as its repr; NUL characters are replaced."""
    sl = stepline.Stepline("whsec_t")

    @sl.workflow("w")
    async def w(ctx: stepline.Context, input: None) -> None:
        ctx.log.info("nul\x00here", thing={1, 2}, ok=3)

    result = await testing.run(sl, "w")
    line = result.logs[0]
    assert line.message == "nul\ufffdhere"
    assert line.fields == {"thing": "{1, 2}", "ok": 3}


async def test_python_last_resort_still_prints_while_steps_capture(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An app that configured no logging still sees warnings on stderr (Python's last resort)
    while the capture handler is on the root logger during a step."""
    sl = stepline.Stepline("whsec_t")
    quiet = logging.getLogger("tests.sdk_logs.unconfigured")

    def step() -> int:
        quiet.warning("printed and kept")
        return 1

    @sl.workflow("w")
    async def w(ctx: stepline.Context, input: None) -> None:
        await ctx.step("s", step)

    root = logging.getLogger()
    saved, root.handlers = root.handlers, []
    try:
        result = await testing.run(sl, "w")
    finally:
        root.handlers = saved
    assert [line.message for line in result.logs] == ["printed and kept"]
    assert "printed and kept" in capsys.readouterr().err


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


async def test_info_records_in_steps_are_kept_whatever_the_root_level() -> None:
    """With the root logger at WARNING, a step's INFO records (of a logger with no level of
    its own) are kept on the run, DEBUG ones are not, and a logger's own level still applies;
    the app's root handler gets only what it got before, and the root's level is as it was
    once no step runs."""
    sl = stepline.Stepline("whsec_t")
    plain = logging.getLogger("tests.root_level.plain")
    strict = logging.getLogger("tests.root_level.strict")
    strict.setLevel(logging.ERROR)

    def step() -> int:
        plain.debug("not kept: debug")
        plain.info("kept: info")
        strict.warning("not kept: below its logger's level")
        plain.warning("kept and printed")
        return 1

    @sl.workflow("w")
    async def w(ctx: stepline.Context, input: None) -> None:
        await ctx.step("s", step)
        plain.info("outside a step: neither kept nor printed")

    root = logging.getLogger()
    app_handler = _Collect()
    saved_level, saved_handlers = root.level, root.handlers
    root.setLevel(logging.WARNING)
    root.handlers = [app_handler]
    try:
        result = await testing.run(sl, "w")
        assert root.level == logging.WARNING and root.handlers == [app_handler]
    finally:
        root.setLevel(saved_level)
        root.handlers = saved_handlers
    assert [line.message for line in result.logs] == ["kept: info", "kept and printed"]
    assert app_handler.messages == ["kept and printed"]
    assert app_handler.filters == []


async def test_kept_lines_also_go_to_the_apps_logging_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``ctx.log`` lines show in the app's own log (logger ``stepline.run``, with the run id
    and fields) as often as they are kept: once, not on every replay; they are not captured a
    second time into the run."""
    sl = stepline.Stepline("whsec_t")

    @sl.workflow("w")
    async def w(ctx: stepline.Context, input: None) -> None:
        ctx.log.info("hello", n=1)
        await ctx.sleep("nap", "1s")
        await ctx.step("s", lambda: ctx.log.warning("inside"))

    with caplog.at_level(logging.DEBUG, logger="stepline.run"):
        result = await testing.run(sl, "w", run_id="r-1")
    assert result.invocations == 2
    assert [line.message for line in result.logs] == ["hello", "inside"]
    records = [r for r in caplog.records if r.name == "stepline.run"]
    assert [r.getMessage() for r in records] == ["hello", "inside"]
    assert records[0].run_id == "r-1" and records[0].fields == {"n": 1}  # type: ignore[attr-defined]
    assert records[1].step == "s"  # type: ignore[attr-defined]


async def test_a_line_between_callback_and_wait_is_kept_once() -> None:
    """A line written after ``ctx.callback()`` and before ``.wait()`` ran in the invocation
    that made the callback; the invocation after its completion replays it and keeps it no
    second time, while the lines after the wait are kept (once)."""
    sl = stepline.Stepline("whsec_t")

    @sl.workflow("w")
    async def w(ctx: stepline.Context, input: None) -> Any:
        approval = await ctx.callback("approval")
        ctx.log.info("asked", url=approval.url)
        await ctx.step("ask", lambda: "mailed")
        ctx.log.info("mailed")
        decision = await approval.wait()
        ctx.log.info("decided", decision=decision)
        return decision

    result = await testing.run(sl, "w", callbacks={"approval": {"ok": True}})
    assert result.status == "completed" and result.invocations >= 2
    assert [line.message for line in result.logs] == ["asked", "mailed", "decided"]
