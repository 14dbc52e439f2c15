"""Error objects as the SDK records them: ``{code, message, type, traceback}`` with ``code``
always a string, and a traceback that begins at the user's own frames."""

from __future__ import annotations

import stepline
from stepline import testing
from stepline_server.engine import error_codes


def _charge() -> None:
    raise ValueError("card declined")


async def test_a_failed_step_and_its_run_have_a_code_and_the_users_frames() -> None:
    """A step whose function raised keeps code ``step_failed``, its exception's type and
    message, and a traceback of this file's frames, none of the SDK's or asyncio's."""
    sl = stepline.Stepline("whsec_t")

    @sl.workflow("checkout", retries=stepline.Retries(attempts=1))
    async def checkout(ctx: stepline.Context, input: None) -> None:
        await ctx.step("charge", _charge)

    result = await testing.run(sl, "checkout")
    assert result.status == "failed"
    step_error = result.steps["charge"].error
    assert step_error is not None
    assert (step_error.code, step_error.type, step_error.message) == (
        "step_failed",
        "ValueError",
        "card declined",
    )
    tb = step_error.traceback or ""
    assert tb.startswith("Traceback (most recent call last):\n")
    assert "test_error_objects.py" in tb and "_charge" in tb
    assert "stepline/_engine.py" not in tb and "asyncio" not in tb and "concurrent" not in tb
    assert tb.endswith("ValueError: card declined\n")
    assert result.error is not None and result.error.code == "step_failed"


async def test_a_workflow_that_raises_fails_with_workflow_failed() -> None:
    """An exception raised by the workflow function itself (not a step) is ``workflow_failed``;
    its traceback starts at the workflow's own frame."""
    sl = stepline.Stepline("whsec_t")

    @sl.workflow("w")
    async def w(ctx: stepline.Context, input: None) -> None:
        raise KeyError("missing")

    result = await testing.run(sl, "w")
    assert result.error is not None
    assert (result.error.code, result.error.type) == ("workflow_failed", "KeyError")
    lines = (result.error.traceback or "").splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert "test_error_objects.py" in lines[1] and "in w" in lines[1]


async def test_terminal_and_coded_errors_keep_their_codes() -> None:
    """``TerminalError`` is ``terminal`` (or the code it was given)."""
    sl = stepline.Stepline("whsec_t")

    @sl.workflow("plain")
    async def plain(ctx: stepline.Context, input: None) -> None:
        raise stepline.TerminalError("no")

    @sl.workflow("coded")
    async def coded(ctx: stepline.Context, input: None) -> None:
        raise stepline.TerminalError("no", code="out_of_stock")

    first = await testing.run(sl, "plain")
    second = await testing.run(sl, "coded")
    assert first.error is not None and first.error.code == "terminal"
    assert second.error is not None and second.error.code == "out_of_stock"


def test_the_orchestrator_gives_every_error_a_code() -> None:
    """An error an older app sent without a code reads with the default one; one with a code
    keeps it; what is not an error object is left alone."""
    assert error_codes.with_code({"type": "E", "message": "m"}, "step_failed") == {
        "type": "E",
        "message": "m",
        "code": "step_failed",
    }
    kept = {"type": "E", "message": "m", "code": "terminal"}
    assert error_codes.with_code(kept, "workflow_failed") is kept
    assert error_codes.with_code({"code": None}, "workflow_failed")["code"] == "workflow_failed"
    assert error_codes.with_code(None, "step_failed") is None
