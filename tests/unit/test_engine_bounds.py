"""The engine's small rules at their real values and edges: key roles, run state checks, the
delivery window and its failure, ids and their bit layout, input schemas, pull polls, run
timing, the run log cap and addresses."""

from __future__ import annotations

import random
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from stepline_server.engine import access, egress, history, ids, inputs, logs, pull, timing
from stepline_server.engine import runs as rules
from stepline_server.engine.steps import callback_id

NOW = datetime(2026, 12, 1, tzinfo=UTC)
LEGACY = uuid.UUID("6f1f3c1e-3b1a-4d5e-9f51-5a3d1f0b7c42")


# Roles


def test_each_role_allows_what_those_below_it_allow() -> None:
    assert [r for r in access.ROLE_RANK if access.allows(r, "write")] == ["write", "admin", "owner"]
    assert access.allows("read", "read") and not access.allows("read", "write")
    assert access.allows("owner", "owner") and not access.allows("admin", "owner")
    assert not access.allows("guest", "read")  # an unknown role allows nothing
    assert [r for r in access.ROLE_RANK if access.manages_project(r)] == ["owner"]


def test_who_may_grant_and_who_is_protected() -> None:
    """An admin grants any role up to admin, an owner any; read and write keys none; an
    unknown role is granted by nobody."""
    grants = {r: [g for g in access.ROLE_RANK if access.may_grant(r, g)] for r in access.ROLE_RANK}
    assert grants == {
        "read": [], "write": [],
        "admin": ["read", "write", "admin"], "owner": ["read", "write", "admin", "owner"],
    }  # fmt: skip
    assert not access.may_grant("owner", "root")
    assert access.protected_from("admin") == ("owner",)
    assert access.protected_from("owner") == ()
    assert access.protected_from("write") == ("read", "write", "admin", "owner")


def test_reads_need_read_and_anything_else_write() -> None:
    assert [access.needed_for(m) for m in ("GET", "head", "POST", "delete", "PATCH")] == [
        "read", "read", "write", "write", "write",
    ]  # fmt: skip


# Run states


def test_a_cancel_changes_a_running_run_and_refuses_an_ended_one() -> None:
    assert rules.check_cancel("running") is True
    assert rules.check_cancel("cancelling") is False
    for status in rules.ENDED:
        with pytest.raises(rules.RuleError, match=rf"already ended \({status}\)") as caught:
            rules.check_cancel(status)
        assert caught.value.code == "invalid_state"
    assert rules.RuleError("m", "other").code == "other" and str(rules.RuleError("m")) == "m"


def test_only_a_run_never_invoked_is_cancelled_at_once() -> None:
    assert rules.cancels_at_once(None, None)
    assert not rules.cancels_at_once(NOW, None)
    assert not rules.cancels_at_once(None, "lease")
    assert not rules.cancels_at_once(NOW, "lease")


def test_which_runs_may_be_retried() -> None:
    """Failed, cancelled and timed-out runs (with or without a step); a completed one only
    from a step; an active one never."""
    for status in ("failed", "cancelled", "timedOut"):
        rules.check_retry(status)
        rules.check_retry(status, "s")
    rules.check_retry("completed", "s")
    with pytest.raises(rules.RuleError) as caught:
        rules.check_retry("completed")
    assert str(caught.value) == (
        "a completed run can only be retried from a step (fromStep): its steps from there on"
        " run again"
    )
    assert caught.value.code == "invalid_state"
    for status in ("running", "cancelling"):
        for step in (None, "s"):
            with pytest.raises(rules.RuleError) as refused:
                rules.check_retry(status, step)
            assert str(refused.value) == (
                "only a failed, cancelled or timed-out run can be retried (a completed one from"
                f" a step); this run is {status}"
            )
    assert rules.singleton_taken("r1") == (
        "run r1 of the same workflow holds this run's singleton key and has not ended; retry"
        " this run once it has"
    )


# Delivery


def _failure(**kw: object) -> rules.DeliveryFailure:
    args: dict[str, object] = {
        "failures_so_far": 0, "failing_since": NOW, "now": NOW, "window_seconds": 3600.0,
        "reason": "refused", "http_status": None,
    }  # fmt: skip
    args.update(kw)
    return rules.on_delivery_failure(**args)  # type: ignore[arg-type]


def test_delivery_backoff_jitters_by_default() -> None:
    """Without ``jitter`` given, the delay is jittered: 80% to 100% of the backoff, varying."""
    random.seed(3)
    seen = {_failure(failures_so_far=4).delay_ms for _ in range(50)}
    assert len(seen) > 10 and min(seen) >= 12_800 and max(seen) <= 16_000


def test_a_spent_delivery_window_fails_the_run_and_names_it() -> None:
    decision = _failure(
        failures_so_far=5, failing_since=NOW - timedelta(hours=2), window_seconds=7200.0,
        http_status=502,
    )  # fmt: skip
    assert decision == rules.DeliveryFailure(
        False,
        0,
        {
            "type": "AppUnreachable",
            "code": "app_unreachable",
            "message": "the app could not be invoked for 2h: refused (after 6 attempts)",
            "httpStatus": 502,
        },
    )
    assert decision.retry is False and decision.delay_ms == 0
    bare = _failure(window_seconds=0.0)
    assert bare.error is not None and "httpStatus" not in bare.error
    spans = {90.0: "90s", 120.0: "2m", 5400.0: "90m", 86400.0: "1d", 172800.0: "2d", 0.5: "0.5s"}
    for seconds, text in spans.items():
        message = _failure(failing_since=NOW - timedelta(days=3), window_seconds=seconds).error
        assert message is not None and f"invoked for {text}:" in message["message"], text


def test_the_last_try_is_made_when_the_window_ends() -> None:
    """A delay past the end of the window is cut to it."""
    decision = _failure(
        failures_so_far=10, failing_since=NOW - timedelta(seconds=3597), jitter=False
    )
    assert decision == rules.DeliveryFailure(True, 3000)


def test_a_workflows_delivery_window_is_its_own_or_the_default() -> None:
    assert rules.delivery_window({"deliveryWindowMs": 0}, 60.0) == 0.0
    assert rules.delivery_window({"deliveryWindowMs": 500}, 60.0) == 0.5
    for raw in (-1, True, "5", None):
        assert rules.delivery_window({"deliveryWindowMs": raw}, 60.0) == 60.0
    assert rules.delivery_window(None, 60.0) == 60.0


def test_a_child_failure_reaches_the_parent_as_a_child_error() -> None:
    assert rules.child_outcome("c1", "failed", None, {"code": "x", "message": "no"}) == (
        "failed",
        None,
        {
            "type": "ChildWorkflowFailed",
            "code": "x",
            "message": "child run c1 ended failed: no",
            "childRunId": "c1",
            "childStatus": "failed",
        },
    )
    _, output, error = rules.child_outcome("c2", "cancelled", "ignored", {})
    assert output is None and error is not None
    assert error["message"] == "child run c2 ended cancelled: the child run ended cancelled"
    assert error["code"] == "child_cancelled"


# Ids


def test_a_derived_id_is_the_same_on_every_version() -> None:
    """Derived ids never change (a replay derives the ids it derived before): these values
    are pinned bit for bit, the time prefix of the source first, version 8, the variant."""
    source = uuid.UUID("0193a5d2-7c00-7000-8000-000000000000")
    derived = ids.derived_id(source, "callback:x", LEGACY)
    assert str(derived) == "0193a5d2-7c00-86de-a2b4-5b7d33829f4d"
    assert ids.time_prefix(derived) == ids.time_prefix(source)
    assert derived.version == 8 and derived.variant == uuid.RFC_4122
    assert ids.derived_id(uuid.UUID(int=5), "callback:x", LEGACY) == uuid.uuid5(
        LEGACY, "callback:x"
    )
    at = ids.derived_id(NOW, "tick", LEGACY)
    assert ids.time_prefix(at) == int(NOW.timestamp() * 1000)
    assert str(at) == "01a22ee6-b000-86a7-b831-68c20af1231f"
    run = "0193a5d2-7c00-7000-8000-000000000000"
    assert callback_id(run, "cb") == "0193a5d2-7c00-8541-ab99-142df40458cd"


def test_a_new_id_is_a_uuid7_of_now_with_random_bits() -> None:
    before = time.time_ns() // 1_000_000
    fresh = ids.new_id()
    after = time.time_ns() // 1_000_000
    assert before <= ids.time_prefix(fresh) <= after
    assert fresh.version == 7 and fresh.variant == uuid.RFC_4122 and ids.is_time_ordered(fresh)
    stamped = ids.new_id(0x0123456789AB)
    assert str(stamped).startswith("01234567-89ab-7")
    assert ids.new_id(1 << 48).int >> 80 == 0  # 48 bits of milliseconds
    tails = {ids.new_id(5).int & ((1 << 76) - 1) for _ in range(20)}
    assert len(tails) == 20


# Inputs


def test_input_problems_name_each_field_once_in_path_order() -> None:
    schema = {
        "type": "object",
        "properties": {
            "orderId": {"type": "string"},
            "items": {"type": "array", "items": {"type": "integer", "minimum": 1}},
        },
        "required": ["orderId"],
    }
    assert inputs.input_problems(schema, {"orderId": "o1", "items": [1, 2]}) == {}
    problems = inputs.input_problems(schema, {"items": [0, "x"], "extra": 1})
    assert problems == {
        "input": "'orderId' is a required property",
        "input.items.0": "0 is less than the minimum of 1",
        "input.items.1": "'x' is not of type 'integer'",
    }
    assert list(problems) == ["input", "input.items.0", "input.items.1"]
    two = {"type": "string", "minLength": 3, "pattern": "^a"}
    assert inputs.input_problems(two, "b") == {"input": "'b' is too short"}
    assert inputs.input_problems(None, 5) == {}
    assert inputs.input_problems({"type": "nonsense"}, 5) == {}  # a broken schema checks nothing
    assert inputs.input_problems({"minLength": "3"}, "") == {}


# Pull


def test_a_poll_waits_30s_by_default_at_most_a_minute_and_takes_1_to_100() -> None:
    assert pull.poll_params(None, None) == (30.0, 1)
    assert pull.poll_params("5s", "100") == (5.0, 100)
    assert pull.poll_params("0", "1") == (0.0, 1)
    assert pull.poll_params("10m", None) == (60.0, 1)
    for wait in ("-1s", "soon"):  # a negative duration is not one
        says = f"not a duration: '{wait}'"

        with pytest.raises(pull.BadParam, match=says) as caught:
            pull.poll_params(wait, None)
        assert caught.value.field == "wait"
    for limit in ("0", "101", "x", "-1"):
        with pytest.raises(pull.BadParam, match="limit must be a whole number from 1 to 100") as c:
            pull.poll_params(None, limit)
        assert c.value.field == "limit"


def test_a_worker_is_named_by_its_header_else_its_address() -> None:
    assert pull.worker_name(" w\x001 ", ("10.0.0.1", 5)) == "w1"
    assert pull.worker_name("n" * 150, None) == "n" * 100
    assert pull.worker_name("\x00", ("10.0.0.1", 5)) == "a worker at 10.0.0.1"
    assert pull.worker_name(None, None) == "a worker"
    assert pull.registration_problem("push", None) == (
        "url", "a push app needs the URL of its handler (or register it with kind 'pull')"
    )  # fmt: skip
    assert pull.registration_problem("pull", "http://x") == (
        "url", "a pull app has no URL: its workers poll the orchestrator"
    )  # fmt: skip
    assert pull.registration_problem("pull", None) is None
    assert pull.registration_problem("push", "http://x") is None


# Timing, logs, addresses


def test_timing_counts_whole_milliseconds() -> None:
    at = NOW + timedelta(microseconds=1500)
    got = timing.timing(NOW, at, at, None, NOW)
    assert got == timing.Timing(1, 1, None) and isinstance(got.start_lag_ms, int)


def test_the_run_log_keeps_a_line_that_fills_the_byte_cap_exactly() -> None:
    assert logs.kept(0, 0, 0, [logs.MAX_BYTES]) == 1
    assert logs.kept(0, 0, 0, [logs.MAX_BYTES + 1]) == 0
    assert logs.kept(0, 1, 0, [5, logs.MAX_BYTES]) == 1


def test_an_address_drops_its_zone_whatever_follows() -> None:
    assert str(egress.as_address("[fe80::1%eth0%x]")) == "fe80::1"
    assert egress.as_address("example.com") is None
    assert egress.as_address("X10.0.0.1X") is None  # only brackets are taken off


def test_a_history_past_its_limit_fails_the_run_and_near_it_warns() -> None:
    """Over either limit the run fails with history_limit_exceeded; past 80% of either it
    warns; at 80% exactly and below, nothing."""
    limits = history.Limits(steps=10, bytes=1000)
    assert history.Limits() == history.Limits(steps=10_000, bytes=64 * 1024 * 1024)
    assert history.check(history.Size(11, 0), limits) == history.Verdict(
        error={
            "type": "HistoryLimitExceeded",
            "code": "history_limit_exceeded",
            "message": (
                "the run's history holds 11 steps and 0 bytes of results, over the limit of 10"
                " steps or 1000 bytes; use ctx.continue_as_new to start a long-running loop"
                " over with a fresh history"
            ),
        }
    )
    assert history.check(history.Size(0, 1001), limits).error is not None
    assert history.check(history.Size(10, 1000), limits).error is None
    assert history.check(history.Size(9, 0), limits) == history.Verdict(
        warning=(
            "the run's history holds 9 of 10 steps and 0 of 1000 bytes: past the limit it"
            " fails with history_limit_exceeded; use ctx.continue_as_new"
        )
    )
    assert history.check(history.Size(0, 801), limits).warning is not None
    assert history.check(history.Size(8, 800), limits) == history.Verdict()
