"""Long runs without I/O: large results by reference in the invoke body, the history limit,
ids that count the generation, and continue_as_new in the in-memory runner."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

import stepline
import stepline.testing
from stepline.protocol import (
    INLINE_RESULT_BYTES,
    Action,
    InvokeRequest,
    StepKind,
    StepUpdate,
)
from stepline_server.engine import history, ids
from stepline_server.engine.steps import plan_updates
from stepline_server.invoke.body import invoke_body
from stepline_server.invoke.urls import CallbackSigner
from tests.claims import claim

SIGNER = CallbackSigner(["secret"])


def _row(name: str, position: int, output: Any, output_bytes: int | None) -> dict[str, Any]:
    return {
        "name": name, "kind": "run", "status": "completed", "position": position, "attempt": 1,
        "output": output, "output_bytes": output_bytes, "output_digest": "ab" * 16,
        "error": None, "wake_at": None, "callback_id": None, "callback_status": None,
        "child_run_id": None,
    }  # fmt: skip


def test_a_result_the_store_did_not_read_goes_by_reference() -> None:
    """Over the inline limit the step carries outputRef (size, md5 digest) and no output; a
    small result, and a JSON null, stay inline; the SDK's model reads both."""
    run = {
        "id": uuid.uuid4(), "workflow": "wf", "input": None, "invocation_id": uuid.uuid4(),
        "lease_token": "tok", "cancel_requested": False, "generation": 3,
    }  # fmt: skip
    steps = [
        _row("big", 1, None, INLINE_RESULT_BYTES + 1),
        _row("small", 2, {"a": 1}, 8),
        _row("null", 3, None, 4),
    ]
    body = invoke_body(claim(run), steps, attempt=1, api_url="http://o.test", signer=SIGNER)
    big, small, null = body["steps"]
    assert big["outputRef"] == {"size": INLINE_RESULT_BYTES + 1, "digest": "md5:" + "ab" * 16}
    assert "output" not in big
    assert small["output"] == {"a": 1} and "outputRef" not in small
    assert "output" not in null and "outputRef" not in null
    assert body["generation"] == 3
    request = InvokeRequest.model_validate(body)
    assert request.steps[0].output_ref is not None
    assert request.steps[0].output_ref.size == INLINE_RESULT_BYTES + 1
    assert request.generation == 3


LIMITS = history.Limits(steps=10, bytes=1000)


@pytest.mark.parametrize(
    ("steps", "size", "outcome"),
    [
        (8, 800, "ok"),
        (9, 0, "warning"),
        (0, 801, "warning"),
        (10, 1000, "warning"),
        (11, 0, "error"),
        (1, 1001, "error"),
    ],
)
def test_history_limit(steps: int, size: int, outcome: str) -> None:
    """Past either limit the run fails with history_limit_exceeded; past 80 % it warns."""
    verdict = history.check(history.Size(steps, size), LIMITS)
    got = "error" if verdict.error else "warning" if verdict.warning else "ok"
    assert got == outcome
    if verdict.error:
        assert verdict.error["code"] == "history_limit_exceeded"
        assert "continue_as_new" in verdict.error["message"]


def test_history_size_counts_steps_and_result_bytes() -> None:
    rows = [{"output_bytes": 10}, {"output_bytes": None}, {"output_bytes": 5}]
    assert history.size_of(rows) == history.Size(3, 15)


@pytest.mark.parametrize("run_uuid", [uuid.uuid4(), ids.new_id()], ids=["random", "time-ordered"])
def test_callback_and_child_ids_count_the_generation(run_uuid: uuid.UUID) -> None:
    """The first generation keeps the ids it always had; each later one has its own."""
    updates = [
        StepUpdate(name="cb", kind=StepKind.CALLBACK, action=Action.CALLBACK),
        StepUpdate(name="kid", kind=StepKind.INVOKE, action=Action.INVOKE, workflow="w"),
    ]
    run_id = str(run_uuid)
    ids = {
        g: (plan.callbacks[0][0], plan.children[0].id)
        for g in (1, 2, 3)
        if (plan := plan_updates(run_id, updates, generation=g))
    }
    assert ids[1] == (
        plan_updates(run_id, updates).callbacks[0][0],
        plan_updates(run_id, updates).children[0].id,
    )
    assert len({*ids[1], *ids[2], *ids[3]}) == 6


async def test_continue_as_new_in_memory() -> None:
    """Each generation starts with the new input and an empty history; the last returns."""
    sl = stepline.Stepline("secret")
    calls: list[int] = []

    @sl.workflow("count")
    async def count(ctx: stepline.Context, input: dict[str, int]) -> dict[str, int]:
        i = input["i"]
        seen = await ctx.step("add", lambda: calls.append(i) or i)
        await ctx.sleep("nap", "10ms")
        if i + 1 < input["n"]:
            ctx.continue_as_new({"i": i + 1, "n": input["n"], "total": input["total"] + seen})
        return {"total": input["total"] + seen, "generation": ctx.generation}

    result = await stepline.testing.run(sl, "count", {"i": 0, "n": 4, "total": 0})
    assert result.status == "completed", result.error
    assert result.output == {"total": 0 + 1 + 2 + 3, "generation": 4}
    assert calls == [0, 1, 2, 3]
    assert sorted(result.steps) == ["add", "nap"]


async def test_continue_as_new_input_over_the_limit_fails_the_run() -> None:
    sl = stepline.Stepline("secret")

    @sl.workflow("huge")
    async def huge(ctx: stepline.Context, input: Any) -> None:
        ctx.continue_as_new("x" * (1024 * 1024 + 1))

    result = await stepline.testing.run(sl, "huge", None)
    assert result.status == "failed"
    assert result.error is not None and "1 MiB" in result.error.message
