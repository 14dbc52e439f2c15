"""Published state: the key and value rules, on both sides, and what ctx.set_state sends."""

from __future__ import annotations

from typing import Any

import pytest

import stepline
from stepline import protocol, testing
from stepline._definitions import WorkflowDef
from stepline._engine import Invocation
from stepline.protocol import Action, StepKind, StepUpdate
from stepline_server.engine import state as rules
from stepline_server.engine.steps import plan_updates
from tests.unit.test_sdk_engine import Recorder, request


@pytest.mark.parametrize("key", ["progress", "a", "k" * 128, "order.42:step_2-b", "A.Z"])
def test_good_keys(key: str) -> None:
    """Keys of 1 to 128 letters, digits and . _ : - are keys."""
    assert protocol.state_key_problem(key) is None


@pytest.mark.parametrize("key", ["", "k" * 129, "has space", "a#2", "é", "a/b", 5, None])
def test_bad_keys(key: Any) -> None:
    """Anything else is refused with a message saying what a key is."""
    problem = protocol.state_key_problem(key)
    assert problem is not None and ("1 to 128" in problem or "string" in problem)


def test_step_names_give_back_their_key() -> None:
    """The n-th set of a key has its own step name, and the name gives the key back."""
    names = [protocol.state_step_name("progress", n) for n in (1, 2, 3)]
    assert names == ["$state:progress", "$state:progress#2", "$state:progress#3"]
    assert {protocol.state_key_of(n) for n in names} == {"progress"}


def _set(key: Any, value: Any, name: str = "$state:k") -> StepUpdate:
    return StepUpdate(name=name, kind=StepKind.STATE, action=Action.COMPLETE, output=value, key=key)


def test_orchestrator_refuses_bad_keys_and_large_values() -> None:
    """The orchestrator checks the same rules: a bad key, a value over 64 KiB (an envelope
    over 96 KiB); a value at the limit is recorded."""
    assert rules.refusal(_set("ok", "x" * (64 * 1024 - 2))) is None
    bad = rules.refusal(_set("no good", 1))
    assert bad is not None and bad["code"] == "state_key_invalid"
    large = rules.refusal(_set("big", "x" * 65 * 1024))
    assert large is not None and large["code"] == "state_too_large" and "64 KiB" in large["message"]
    envelope = {"$stepline": "encrypted", "key": "k1", "data": "x" * 80 * 1024}
    assert rules.refusal(_set("sealed", envelope)) is None
    envelope["data"] = "x" * 97 * 1024
    assert rules.refusal(_set("sealed", envelope)) is not None


def test_key_count_limit_counts_distinct_new_keys() -> None:
    """Past the limit only new keys are refused; a key set again is free."""
    assert rules.over_limit(["a", "b", "a"], set(), limit=2) == set()
    assert rules.over_limit(["a", "c", "d", "c"], {"a", "b"}, limit=3) == {"d"}
    assert rules.over_limit(["x"], {"a", "b"}, limit=2) == {"x"}


def test_plan_records_a_state_set_event_and_the_value() -> None:
    """A set is a completed state step with its value and a state.set event naming the key;
    a refused one is a failed step with the code, and no state to keep."""
    plan = plan_updates(
        "00000000-0000-0000-0000-000000000001",
        [_set("p", {"done": 1}, "$state:p"), _set("p", {"done": 2}, "$state:p#2"),
         _set("bad key", 1, "$state:bad key")],
    )  # fmt: skip
    assert [(e["type"], e["data"].get("key")) for e in plan.events] == [
        ("state.set", "p"),
        ("state.set", "p"),
        ("step.failed", "bad key"),
    ]
    assert plan.states == [("p", "$state:p"), ("p", "$state:p#2")]
    assert [(c.status, c.output) for c in plan.changes][:2] == [
        ("completed", {"done": 1}),
        ("completed", {"done": 2}),
    ]
    failed = plan.changes[2]
    assert (
        failed.status == "failed" and failed.error and failed.error["code"] == "state_key_invalid"
    )
    assert plan.needs_transaction
    plan.refuse_states({"p"})
    assert plan.states == [] and plan.events[0]["type"] == "step.failed"
    assert plan.changes[0].error and plan.changes[0].error["code"] == "state_keys_exceeded"


sl = stepline.Stepline("state-rules")


@sl.workflow("publish")
async def publish(ctx: stepline.Context, input: Any) -> Any:
    await ctx.set_state("progress", {"done": 1})
    await ctx.set_state("progress", {"done": 2})
    problems = {}
    for key, value in [("bad key", 1), ("big", "x" * 65 * 1024), ("fn", print)]:
        try:
            await ctx.set_state(key, value)
        except stepline.StateError as exc:
            problems[key] = exc.code
    return problems


async def test_sdk_records_each_set_and_refuses_before_sending() -> None:
    """Each set is its own recorded step; the last one is the key's value; a bad key, a
    65 KiB value and a value that is not JSON raise StateError and record nothing."""
    result = await testing.run(sl, "publish")
    assert result.status == "completed"
    assert result.output == {
        "bad key": "state_key_invalid",
        "big": "state_too_large",
        "fn": "state_not_json",
    }
    assert result.state == {"progress": {"done": 2}}
    assert [n for n in result.steps if n.startswith("$state:")] == [
        "$state:progress",
        "$state:progress#2",
    ]


@sl.workflow("many")
async def many(ctx: stepline.Context, input: Any) -> Any:
    for n in range(protocol.MAX_STATE_KEYS):
        await ctx.set_state(f"k{n}", n)
    await ctx.set_state("k0", "again")  # a key set again is not a new one
    try:
        await ctx.set_state("one-too-many", 1)
    except stepline.StateError as exc:
        return exc.code
    return None


async def test_sdk_refuses_a_key_past_the_limit() -> None:
    """The 101st distinct key raises StateError (state_keys_exceeded) before it is sent."""
    result = await testing.run(sl, "many")
    assert result.output == "state_keys_exceeded"
    assert len(result.state) == protocol.MAX_STATE_KEYS and result.state["k0"] == "again"


async def test_an_orchestrator_without_state_makes_set_state_fail_clearly() -> None:
    """Invoked by an orchestrator that declares no protocol version (before state), set_state
    raises StateError (state_not_supported) and nothing is sent."""

    async def wf(ctx: stepline.Context, input: Any) -> Any:
        await ctx.set_state("progress", 1)

    sender = Recorder()
    answer = await Invocation(WorkflowDef(name="wf", fn=wf), request(), sender).run()
    assert answer.status == "failed" and answer.error is not None
    assert answer.error.code == "state_not_supported"
    assert "upgrade the orchestrator" in answer.error.message
    assert answer.updates == [] and sender.calls == []
    # the same workflow under an orchestrator of this protocol sends the set
    ok = await Invocation(
        WorkflowDef(name="wf", fn=wf),
        request(protocolVersion=protocol.PROTOCOL_VERSION),
        Recorder(),
    ).run()
    assert ok.status == "completed"
    assert [(u.kind, u.key, u.output) for u in ok.updates] == [("state", "progress", 1)]


async def test_replay_sends_no_set_again() -> None:
    """A set already recorded is passed on replay: the invocation sends nothing for it."""

    async def wf(ctx: stepline.Context, input: Any) -> Any:
        await ctx.set_state("progress", 1)
        return "done"

    recorded = protocol.StepRecord(
        name="$state:progress", kind="state", status="completed", position=0, output=1
    )
    answer = await Invocation(
        WorkflowDef(name="wf", fn=wf),
        request([recorded], protocolVersion=protocol.PROTOCOL_VERSION),
        Recorder(),
    ).run()
    assert answer.status == "completed" and answer.updates == []
