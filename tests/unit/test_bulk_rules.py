"""The bulk action rules: which runs an action takes, what a filter means, how it paces."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta, timezone

import pytest

from stepline_server.engine import bulk


def test_an_action_takes_the_filter_statuses_it_can_act_on() -> None:
    """Cancel takes running runs, retry failed, cancelled and timed-out ones; a filter status
    the action cannot act on leaves nothing."""
    none = dict(run_key=None, trigger=None, created_after=None, created_before=None)
    assert bulk.select(bulk.Action.CANCEL, status=None, **none).statuses == ("running",)
    retry = bulk.select(bulk.Action.RETRY, status=None, **none).statuses
    assert retry == ("cancelled", "failed", "timedOut")
    some = bulk.select(bulk.Action.RETRY, status=["failed", "running"], **none)
    assert some.statuses == ("failed",)
    assert bulk.select(bulk.Action.CANCEL, status="completed", **none).statuses == ()


def test_run_key_prefix_and_exact() -> None:
    """``runKey`` ending with ``*`` is a prefix; otherwise an exact key; anything else is
    refused naming the field."""
    assert bulk.run_key_of("signup-*") == (None, "signup-")
    assert bulk.run_key_of("*") == (None, "")
    assert bulk.run_key_of("signup-1") == ("signup-1", None)
    for bad in ("a*b*", "sp ace", "a/b*"):
        with pytest.raises(bulk.FilterError) as exc:
            bulk.run_key_of(bad)
        assert exc.value.field == "runKey"


def test_filters_that_cannot_select_runs_are_refused() -> None:
    """Unknown statuses and triggers, an empty status list and an empty time window are
    refused; fromStep goes with retryFromStep alone."""
    t = datetime(2026, 1, 1, tzinfo=UTC)
    cases = [
        dict(status="asleep"),
        dict(status=[]),
        dict(trigger="cron"),
        dict(created_after=t, created_before=t),
    ]
    for case in cases:
        args = dict(status=None, run_key=None, trigger=None, created_after=None,
                    created_before=None) | case  # fmt: skip
        with pytest.raises(bulk.FilterError):
            bulk.select(bulk.Action.CANCEL, **args)  # type: ignore[arg-type]
    with pytest.raises(bulk.FilterError):
        bulk.check_from_step(bulk.Action.RETRY_FROM_STEP, None)
    with pytest.raises(bulk.FilterError):
        bulk.check_from_step(bulk.Action.CANCEL, "a")
    bulk.check_from_step(bulk.Action.RETRY_FROM_STEP, "a")


def test_a_cancel_skips_runs_no_longer_running() -> None:
    assert bulk.cancel_outcome("running") is None
    for status in ("cancelling", "completed", "failed", None):
        assert bulk.cancel_outcome(status) is bulk.Outcome.SKIPPED


def test_pacing_rests_between_batches() -> None:
    """A batch is followed by a rest (longer after a longer batch, longer with a backlog)."""
    assert bulk.rest_after(0.0, 0) == bulk.REST_SECONDS
    assert bulk.rest_after(1.0, 0) == pytest.approx(1.0 * (1 - bulk.DUTY) / bulk.DUTY)
    assert bulk.rest_after(0.0, bulk.BACKLOG_ROOM + 1) > bulk.REST_SECONDS


def test_a_batch_tops_up_the_operations_runs_in_the_dispatcher_to_one_batch() -> None:
    """The next batch fills what keeps the operation's runs in the dispatcher (due and not
    taken, or being invoked) at most one batch, once half a batch has room; none goes while
    the dispatcher has a backlog; after waiting ROOM_WAIT_SECONDS a whole batch goes."""

    def room(
        waiting: int = 0, invoking: int = 0, backlog: int = 0, held: float = 0.0, size: int = 10
    ) -> int:
        return bulk.batch_room(
            size, backlog=backlog, waiting=waiting, invoking=invoking, held_seconds=held
        )

    assert room() == 10
    assert room(waiting=3) == 7 and room(invoking=4) == 6 and room(waiting=2, invoking=3) == 5
    assert room(waiting=6) == 0 and room(waiting=3, invoking=3) == 0  # under half a batch
    assert room(waiting=10) == 0 and room(invoking=25) == 0
    for waiting, invoking in ((0, 0), (4, 0), (0, 5), (3, 2)):  # never past one batch
        assert waiting + invoking + room(waiting, invoking) <= 10
    assert room(backlog=bulk.BACKLOG_ROOM) == 10
    assert room(backlog=bulk.BACKLOG_ROOM + 1) == 0
    assert room(waiting=10, backlog=99, held=bulk.ROOM_WAIT_SECONDS) == 10  # it always moves
    assert room(waiting=10, held=bulk.ROOM_WAIT_SECONDS - 0.1) == 0
    assert room(size=1) == 1 and room(waiting=1, size=1) == 0
    assert room(size=0) == 1  # a batch is one run at least
    assert room(waiting=1, size=3) == 2  # half of 3 is 2


def test_history_names_the_operation() -> None:
    """A run an operation acted on says so in its history's ``data.by``."""
    assert bulk.by("x") == "operation:x"


def test_a_selection_carries_every_filter_field_in_utc(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every field of the filter reaches the selection; times are in UTC whatever the
    server's own zone; fromStep only for retryFromStep."""
    monkeypatch.setenv("TZ", "Europe/Paris")
    time.tzset()
    try:
        after = datetime(2026, 1, 1, 12, tzinfo=timezone(timedelta(hours=2)))
        before = datetime(2026, 1, 2, tzinfo=UTC)
        selection = bulk.select(
            bulk.Action.RETRY_FROM_STEP, status=["failed"], run_key="signup-*", trigger="api",
            created_after=after, created_before=before, workflow="w", app="a",
            deployment_id="d", from_step="s", run_ids=("r1",),
        )  # fmt: skip
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert selection == bulk.Selection(
        statuses=("failed",), workflow="w", app="a", deployment_id="d",
        created_after=datetime(2026, 1, 1, 10, tzinfo=UTC), created_before=before,
        run_key=None, run_key_prefix="signup-", trigger="api", from_step="s", run_ids=("r1",),
    )  # fmt: skip
    assert selection.created_after is not None and selection.created_after.utcoffset() == timedelta(
        0
    )
    assert selection.created_after.tzinfo is UTC
    exact = bulk.select(bulk.Action.RETRY, status=None, run_key="k", trigger=None,
                        created_after=after, created_before=None, from_step="s")  # fmt: skip
    assert (exact.run_key, exact.run_key_prefix, exact.from_step) == ("k", None, None)
    only_before = bulk.select(bulk.Action.RETRY, status=None, run_key=None, trigger=None,
                              created_after=None, created_before=before)  # fmt: skip
    assert only_before.created_before == before and only_before.created_after is None


@pytest.mark.parametrize(
    ("case", "field", "message"),
    [
        ({"status": "asleep"}, "status", "unknown status 'asleep'; one of cancelled, cancelling,"),
        ({"status": []}, "status", "status must name at least one run status"),
        ({"trigger": "cron"}, "trigger",
         "unknown trigger 'cron'; one of api, schedule, manual, event, parent, retry, bulk"),
        ({"created_after": datetime(2026, 1, 2, tzinfo=UTC),
          "created_before": datetime(2026, 1, 1, tzinfo=UTC)},
         "createdBefore", "createdBefore must be later than createdAfter"),
        ({"created_after": datetime.max.replace(tzinfo=timezone(-timedelta(hours=1)))},
         "createdAfter", "createdAfter is out of range"),
        ({"created_before": datetime.max.replace(tzinfo=timezone(-timedelta(hours=1)))},
         "createdBefore", "createdBefore is out of range"),
        ({"run_key": "a*b*"}, "runKey", "a runKey prefix is run key characters then one '*'"),
        ({"run_key": "sp ace"}, "runKey", "runKey must be a run key, or a prefix ending with '*'"),
    ],
)  # fmt: skip
def test_a_refused_filter_names_its_field_and_why(
    case: dict[str, object], field: str, message: str
) -> None:
    args: dict[str, object] = dict(status=None, run_key=None, trigger=None, created_after=None,
                                   created_before=None) | case  # fmt: skip
    with pytest.raises(bulk.FilterError) as caught:
        bulk.select(bulk.Action.CANCEL, **args)  # type: ignore[arg-type]
    assert caught.value.field == field and str(caught.value).startswith(message)


def test_from_step_errors_name_the_field() -> None:
    with pytest.raises(bulk.FilterError, match=r"^retryFromStep needs fromStep: the step") as c:
        bulk.check_from_step(bulk.Action.RETRY_FROM_STEP, None)
    assert c.value.field == "fromStep"
    with pytest.raises(
        bulk.FilterError, match=r"^fromStep goes with retryFromStep, not retry$"
    ) as c:
        bulk.check_from_step(bulk.Action.RETRY, "a")
    assert c.value.field == "fromStep"


def test_a_backlog_over_its_room_rests_a_quarter_second() -> None:
    assert bulk.rest_after(0.0, bulk.BACKLOG_ROOM) == bulk.REST_SECONDS == 0.1
    assert bulk.rest_after(0.0, bulk.BACKLOG_ROOM + 1) == 0.25
