"""Patches: what ``ctx.patched`` answers from a run's recorded history, the marker it records,
``ctx.deprecate_patch``, replay-check, ``stepline.testing``, parked executions and deltas."""

from __future__ import annotations

from typing import Any

import pytest

import stepline
from stepline import _replay, protocol, testing
from stepline._engine import Invocation
from stepline._history import HistoryCache
from stepline.protocol import StepRecord
from stepline_server.engine.steps import InvalidUpdate, plan_updates
from tests.unit.test_replay_check import definition_of
from tests.unit.test_sdk_engine import Recorder, brief, record, request

MARKER = "$patch:fix-tax"


def tax(amount: int, rate: int) -> int:
    return amount * rate // 100


async def patched_wf(ctx: stepline.Context, input: Any) -> Any:
    """Version 2: the tax step changed behind the patch ``fix-tax``."""
    base = await ctx.step("base", lambda: 100)
    if ctx.patched("fix-tax"):
        taxed = await ctx.step("tax-v2", tax, base, 20)
    else:
        taxed = await ctx.step("tax", tax, base, 10)
    await ctx.sleep("nap", "1s")
    return {"taxed": taxed, "again": ctx.patched("fix-tax")}


def following(steps: list[StepRecord]) -> protocol.InvokeRequest:
    """The run's second invocation, carrying ``steps`` as what changed since the first."""
    return request(steps).model_copy(update={"invocation_id": "inv-2", "history_base": "inv-1"})


def marker(position: int) -> StepRecord:
    return record(MARKER, "value", "completed", position, output=True)


# A run of version 1 (no patch) that went past the patch point and sleeps.
OLD = [
    record("base", "run", "completed", 0, output=100),
    record("tax", "run", "completed", 1, output=10),
    record("nap", "sleep", "sleeping", 2),
]
# A run of version 2 that recorded the marker, sleeping.
NEW = [
    record("base", "run", "completed", 0, output=100),
    marker(1),
    record("tax-v2", "run", "completed", 2, output=20),
    record("nap", "sleep", "sleeping", 3),
]


def woken(steps: list[StepRecord]) -> list[StepRecord]:
    done = {"status": protocol.StepStatus.COMPLETED}
    return [s.model_copy(update=done) if s.name == "nap" else s for s in steps]


async def test_a_new_run_takes_the_patch_and_records_its_marker_once() -> None:
    """First time through, ``patched`` is True, the marker goes out before the next step with
    ``patch`` set, and a second call answers the same without another marker."""
    sender = Recorder()
    answer = await Invocation(definition_of(patched_wf), request(), sender).run()
    sent = [u for call in sender.calls for u in call] + answer.updates
    markers = [u for u in sent if u.name == MARKER]
    assert len(markers) == 1
    only = markers[0]
    assert (only.kind, only.action, only.patch) == ("value", "complete", "fix-tax")
    assert brief(sender.calls[0]) == [("start", "base")]
    assert brief(sender.calls[1])[:2] == [("complete", "base"), ("complete", MARKER)]
    assert ("start", "tax-v2") in brief(sender.calls[1])


async def test_a_run_from_before_the_patch_takes_the_old_code_on_every_replay() -> None:
    """A history with a step beyond the patch point and no marker: False, the old step
    replays, nothing is recorded, and after the sleep the run ends on the old branch."""
    sender = Recorder()
    answer = await Invocation(definition_of(patched_wf), request(OLD), sender).run()
    assert answer.status == "suspended"
    assert sender.calls == [] and answer.updates == []
    answer = await Invocation(definition_of(patched_wf), request(woken(OLD)), sender).run()
    assert answer.status == "completed"
    assert answer.output == {"taxed": 10, "again": False}
    assert sender.calls == [] and answer.updates == []


async def test_a_run_with_the_marker_takes_the_patch_on_replay() -> None:
    sender = Recorder()
    answer = await Invocation(definition_of(patched_wf), request(woken(NEW)), sender).run()
    assert answer.status == "completed"
    assert answer.output == {"taxed": 20, "again": True}
    assert sender.calls == [] and answer.updates == []


async def test_a_run_that_stopped_before_the_patch_point_takes_the_patch() -> None:
    """Old code recorded only ``base`` (the marker's place is free): the patch applies."""
    steps = [record("base", "run", "completed", 0, output=100)]
    sender = Recorder()
    answer = await Invocation(definition_of(patched_wf), request(steps), sender).run()
    assert answer.status == "suspended"
    assert brief(sender.calls[0]) == [("complete", MARKER), ("start", "tax-v2")]


async def test_deprecate_patch_replays_a_run_with_the_marker_and_records_nothing() -> None:
    async def wf(ctx: stepline.Context, input: Any) -> Any:
        await ctx.step("base", lambda: 100)
        ctx.deprecate_patch("fix-tax")
        taxed = await ctx.step("tax-v2", tax, 100, 20)
        await ctx.sleep("nap", "1s")
        return taxed

    for steps in (woken(NEW), []):
        sender = Recorder()
        answer = await Invocation(definition_of(wf), request(steps), sender).run()
        if steps:
            assert (answer.status, answer.output) == ("completed", 20)
        sent = [u for call in sender.calls for u in call] + answer.updates
        assert MARKER not in [u.name for u in sent]


async def test_a_marker_the_code_no_longer_asks_about_is_never_expected() -> None:
    """Code that dropped the ``patched`` call altogether still replays a run with the marker
    last, and goes on with a new step (no nondeterminism)."""
    steps = [record("base", "run", "completed", 0, output=100), marker(1)]

    async def wf(ctx: stepline.Context, input: Any) -> Any:
        await ctx.step("base", lambda: 100)
        return await ctx.step("tax-v2", tax, 100, 20)

    answer = await Invocation(definition_of(wf), request(steps), Recorder()).run()
    assert (answer.status, answer.output) == ("completed", 20)


async def test_patch_ids_and_reserved_step_names_are_checked() -> None:
    async def bad_id(ctx: stepline.Context, input: Any) -> Any:
        return ctx.patched("")

    async def bad_name(ctx: stepline.Context, input: Any) -> Any:
        return await ctx.now(MARKER)

    for fn in (bad_id, bad_name):
        answer = await Invocation(definition_of(fn), request(), Recorder()).run()
        assert answer.status == "failed"
        assert answer.error is not None and answer.error.type == "ValueError"


async def test_testing_runs_a_workflow_as_a_new_run_or_one_from_before_the_patch() -> None:
    sl = stepline.Stepline("secret")
    sl.workflow("wf")(patched_wf)
    new = await testing.run(sl, "wf")
    assert (new.status, new.output, new.patches) == ("completed", {"taxed": 20, "again": True},
                                                     ["fix-tax"])  # fmt: skip
    assert new.steps[MARKER].kind == "value"
    old = await testing.run(sl, "wf", unpatched=["fix-tax"])
    assert (old.status, old.output, old.patches) == ("completed", {"taxed": 10, "again": False},
                                                     [])  # fmt: skip
    assert old.step_calls == {"base": 1, "tax": 1}


async def test_replay_check_is_ok_for_both_branches_and_says_which() -> None:
    for steps, which in ((OLD, "old code"), (NEW, "new code")):
        done = await _replay.replay(definition_of(patched_wf), request(steps))
        verdict = _replay.judge(done, "running")
        assert verdict.result == "ok", verdict.summary
        assert f"patch 'fix-tax': {which}" in verdict.summary
    # At the frontier (the run stopped before the patch point) the replay goes past the marker
    # it would record to the step that would run next.
    done = await _replay.replay(definition_of(patched_wf), request(OLD[:1]))
    assert done.next == [("tax-v2", "run")]
    assert _replay.judge(done, "running").result == "ok"
    # A renamed step on the patched branch still differs.
    renamed = [*NEW[:2], record("tax-v3", "run", "completed", 2, output=20)]
    done = await _replay.replay(definition_of(patched_wf), request(renamed))
    assert _replay.judge(done, "running").result == "differs"


async def test_a_parked_execution_takes_in_its_own_marker() -> None:
    """The next invocation brings the marker the parked one recorded: it goes on, no replay."""
    sender = Recorder()
    first = Invocation(definition_of(patched_wf), request(), sender, may_park=True)
    answer = await first.run()
    assert answer.status == "suspended" and first.parked
    changed = [
        record("base", "run", "completed", 0, output=100),
        marker(1),
        record("tax-v2", "run", "completed", 2, output=20),
        record("nap", "sleep", "completed", 3),
    ]
    second = following(changed)
    ending = first.resumable(second, changed)
    assert ending is not None
    answer = await first.resume(second, ending)
    assert (answer.status, answer.output) == ("completed", {"taxed": 20, "again": True})


async def test_a_delta_that_adds_the_marker_is_laid_over_the_kept_history() -> None:
    cache = HistoryCache()

    async def fetch(req: protocol.InvokeRequest) -> list[StepRecord]:
        raise AssertionError("the base is kept")

    await cache.complete(request(NEW[:1]), fetch)
    whole = await cache.complete(following(NEW[1:]), fetch)
    sender = Recorder()
    answer = await Invocation(definition_of(patched_wf), whole, sender).run()
    assert answer.status == "suspended"
    assert sender.calls == [] and answer.updates == []


def test_the_orchestrator_records_patch_recorded_for_a_marker() -> None:
    update = protocol.StepUpdate(
        name=MARKER, kind="value", action="complete", output=True, patch="fix-tax"
    )
    plan = plan_updates("00000000-0000-0000-0000-000000000001", [update])
    assert plan.events == [
        {"type": "patch.recorded", "step_name": MARKER, "data": {"patch": "fix-tax"}}
    ]
    assert [(c.name, c.kind, c.status) for c in plan.changes] == [(MARKER, "value", "completed")]
    for bad in (
        update.model_copy(update={"name": "$patch:other"}),
        update.model_copy(update={"kind": protocol.StepKind.RUN, "action": protocol.Action.START}),
    ):
        with pytest.raises(InvalidUpdate):
            plan_updates("00000000-0000-0000-0000-000000000001", [bad])


def test_an_orchestrator_that_does_not_know_patches_reads_a_plain_value_step() -> None:
    """What an older orchestrator parses (unknown fields ignored) is a completed value step."""
    wire = protocol.dump(
        protocol.StepUpdate(name=MARKER, kind="value", action="complete", output=True,
                            patch="fix-tax")
    )  # fmt: skip
    assert wire["patch"] == "fix-tax"
    del wire["patch"]
    plain = protocol.StepUpdate.model_validate(wire)
    assert plan_updates("00000000-0000-0000-0000-000000000001", [plain]).events[0]["type"] == (
        "step.completed"
    )
