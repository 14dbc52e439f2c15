"""Debounce and batch rules: keys, when a gathering fires, what sync and a start refuse, and
what the SDK refuses when the workflow is declared."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import stepline
from stepline_server.engine import gathering, holds

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def _debounce(
    period: int = 5000, max_wait: int | None = 60000, key: str | None = "userId"
) -> gathering.Spec:
    spec = gathering.spec_of({"debounce": {"periodMs": period, "maxWaitMs": max_wait, "key": key}})
    assert spec is not None
    return spec


def test_a_debounce_fires_its_period_after_the_last_start_capped_by_max_wait() -> None:
    spec = _debounce()
    assert gathering.fire_at(spec, T0, T0) == T0 + timedelta(seconds=5)
    later = T0 + timedelta(seconds=4)
    assert gathering.fire_at(spec, T0, later) == later + timedelta(seconds=5)
    near_cap = T0 + timedelta(seconds=58)
    assert gathering.fire_at(spec, T0, near_cap) == T0 + timedelta(minutes=1)
    uncapped = _debounce(max_wait=None)
    far = T0 + timedelta(hours=2)
    assert gathering.fire_at(uncapped, T0, far) == far + timedelta(seconds=5)


def test_a_batch_fires_its_wait_after_the_first_event_or_when_full() -> None:
    spec = gathering.spec_of({"batch": {"size": 3, "waitMs": 2000}, "onEvent": "e"})
    assert spec is not None and spec.kind == gathering.BATCH
    assert gathering.fire_at(spec, T0, T0 + timedelta(seconds=1)) == T0 + timedelta(seconds=2)
    assert [gathering.is_full(spec, n) for n in (1, 2, 3, 4)] == [False, False, True, True]
    assert not gathering.is_full(_debounce(), 10_000)
    assert gathering.is_due(T0, T0) and not gathering.is_due(T0 + timedelta(0, 0, 1), T0)


def test_keys_are_the_field_value_as_canonical_json() -> None:
    spec = _debounce()
    assert gathering.key_of(spec, {"userId": "u1", "x": 1}) == '"u1"'
    assert gathering.key_of(spec, {"userId": 7}) == "7"
    assert gathering.key_of(spec, {"userId": {"b": 1, "a": 2}}) == '{"a":2,"b":1}'
    assert gathering.key_of(spec, {"other": 1}) == "null" == gathering.key_of(spec, [1])
    assert gathering.key_of(_debounce(key=None), {"userId": "u1"}) == gathering.WHOLE_WORKFLOW
    long = gathering.key_of(spec, {"userId": "x" * 2000})
    assert long.startswith("sha256:") and len(long) < gathering.MAX_KEY_CHARS


def test_no_gathering_without_the_options() -> None:
    assert gathering.spec_of(None) is None
    assert gathering.spec_of({"concurrency": 2}) is None


def test_sync_refuses_what_cannot_work_and_names_the_fields() -> None:
    ok = {"debounce": {"periodMs": 5000, "maxWaitMs": 60000, "key": "userId"}}
    assert gathering.option_problems(ok) == {}
    assert gathering.option_problems({"onEvent": "e", "batch": {"size": 1, "waitMs": 1}}) == {}
    assert set(gathering.option_problems({"debounce": {"periodMs": 0}})) == {"debounce.periodMs"}
    assert set(gathering.option_problems({"debounce": {"periodMs": 5000, "maxWaitMs": 1000}})) == {
        "debounce.maxWaitMs"
    }
    bad_batch = {"batch": {"size": 0, "waitMs": -1, "key": ""}}
    assert set(gathering.option_problems(bad_batch)) == {
        "batch.size",
        "batch.waitMs",
        "batch.key",
        "batch",
    }
    both = {"onEvent": "e", "debounce": {"periodMs": 1}, "batch": {"size": 1, "waitMs": 1}}
    assert set(gathering.option_problems(both)) == {"debounce"}
    single = {"singletonKey": "u", "debounce": {"periodMs": 1}}
    assert set(gathering.option_problems(single)) == {"singletonKey"}
    assert set(gathering.option_problems({"debounce": {"periodMs": True}})) == {"debounce.periodMs"}


def test_a_debounced_start_refuses_a_run_key() -> None:
    assert set(gathering.start_problems(_debounce(), "k-1")) == {"runKey"}
    assert gathering.start_problems(_debounce(), None) == {}


def test_a_gathering_run_is_held_by_its_gathering_until_it_fires() -> None:
    state = holds.RunState(
        ended=False, paused=False, leased=False, held=False, undelivered=False,
        rate_limited=False, started=False, ready_at=None, gathers="debounce",
    )  # fmt: skip
    assert holds.held_by(state, T0) == holds.HeldBy.DEBOUNCE
    due = holds.RunState(**{**state.__dict__, "ready_at": T0})
    assert holds.held_by(due, T0) is None


def test_the_sdk_refuses_bad_debounces_and_batches() -> None:
    with pytest.raises(ValueError, match="not a duration"):
        stepline.Debounce(period="soon")
    with pytest.raises(ValueError, match="at least the period"):
        stepline.Debounce(period="5s", max_wait="1s")
    with pytest.raises(ValueError, match="at least 1 ms"):
        stepline.Debounce(period=0)
    with pytest.raises(ValueError, match="at least 1"):
        stepline.Batch(size=0)
    with pytest.raises(TypeError):
        stepline.Batch(size=2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least 1 ms"):
        stepline.Batch(size=2, wait="0s")
    sl = stepline.Stepline("s")

    async def fn(ctx: stepline.Context, input: object) -> None:
        return None

    with pytest.raises(ValueError, match="on_event"):
        sl.workflow("b", batch=stepline.Batch(size=2))(fn)
    with pytest.raises(ValueError, match="not both"):
        sl.workflow(
            "c", on_event="e", batch=stepline.Batch(size=2), debounce=stepline.Debounce("1s")
        )(fn)
    with pytest.raises(ValueError, match="singleton_key"):
        sl.workflow("d", singleton_key="u", debounce=stepline.Debounce("1s"))(fn)
    sl.workflow("ok", debounce=stepline.Debounce("1s", key="userId", max_wait="1m"))(fn)
    described = sl.describe().workflows[0].model_dump(by_alias=True, exclude_none=True)
    assert described["debounce"] == {"periodMs": 1000, "key": "userId", "maxWaitMs": 60000}
    assert gathering.option_problems(described) == {}
