"""docs/context.md documents every public call of the workflow context, with an example."""

from __future__ import annotations

import re
from pathlib import Path

from stepline import Callback, Context

DOC = Path(__file__).resolve().parents[2] / "docs" / "context.md"

ENGINE_ONLY = {
    "close", "fail_run", "forget_done", "inject_cancel", "next_invocation", "passed",
    "patch_answers", "pending_sleeps", "reached", "request_cancel", "take_fresh", "unreached",
}  # fmt: skip
"""Public names the replay engine calls; a workflow has no use for them."""

ATTRIBUTES = {"attempt", "generation", "log", "run_id", "workflow"}


def test_every_public_context_call_is_documented_with_an_example() -> None:
    """Each public method and property of Context (but the engine's), and each attribute a
    workflow reads, is named as ``ctx.NAME`` in docs/context.md, and appears in one of its
    examples; so is ``Callback.wait``."""
    text = DOC.read_text()
    examples = "\n".join(re.findall(r"```python\n(.*?)```", text, re.S))
    public = {name for name in vars(Context) if not name.startswith("_")} - ENGINE_ONLY
    assert {"step", "sleep", "wait_for_event", "invoke"} <= public
    for name in sorted(public | ATTRIBUTES):
        assert f"ctx.{name}" in text, f"ctx.{name} is not in docs/context.md"
        assert f"ctx.{name}" in examples, f"no example in docs/context.md uses ctx.{name}"
    assert "wait" in vars(Callback) and ".wait()" in examples
