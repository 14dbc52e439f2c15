"""Unit tests for the pure scheduling rules: cron, time zones, DST, misfires, overlap, ids."""

from __future__ import annotations

import re
import time
import uuid
from datetime import UTC, datetime, timedelta, tzinfo
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from stepline_server.engine import schedules
from stepline_server.engine.schedules import (
    MisfirePolicy,
    OverlapDecision,
    OverlapPolicy,
    ScheduleError,
    ScheduleStatus,
    TickPlan,
    decide_overlap,
    new_schedule_id,
    next_fire_after,
    parse_cron,
    parse_timezone,
    plan_ticks,
    should_disable,
    tick_run_id,
)

NY = "America/New_York"
LONDON = "Europe/London"
SYDNEY = "Australia/Sydney"
GRACE = timedelta(seconds=60)


def utc(y: int, mo: int, d: int, h: int = 0, mi: int = 0, s: int = 0) -> datetime:
    """Build an aware UTC datetime."""
    return datetime(y, mo, d, h, mi, s, tzinfo=UTC)


def local(tz: str, y: int, mo: int, d: int, h: int = 0, mi: int = 0, *, fold: int = 0) -> datetime:
    """Build an aware datetime in a named zone."""
    return datetime(y, mo, d, h, mi, tzinfo=ZoneInfo(tz), fold=fold)


def ticks(cron: str, tz: str, after: datetime, count: int) -> list[datetime]:
    """Return `count` successive ticks after `after`."""
    out: list[datetime] = []
    for _ in range(count):
        after = next_fire_after(cron, tz, after)
        out.append(after)
    return out


def wall(instants: list[datetime], tz: str) -> list[str]:
    """Render instants as local wall time with offset, for readable assertions."""
    return [i.astimezone(ZoneInfo(tz)).strftime("%m-%d %H:%M%z") for i in instants]


# --- parsing -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("0 9 * * 1-5", "0 9 * * 1-5"),
        ("  */15   *  * * *  ", "*/15 * * * *"),
        ("0 0 * JAN MON", "0 0 * JAN MON"),
        ("0 0 L * *", "0 0 L * *"),
        ("@hourly", "@hourly"),
        ("@Daily", "@daily"),
        ("@weekly", "@weekly"),
        ("@monthly", "@monthly"),
        ("@yearly", "@yearly"),
        ("@annually", "@annually"),
        ("@midnight", "@midnight"),
    ],
)
def test_parse_cron_accepts_five_fields_and_aliases(expr: str, expected: str) -> None:
    """Five-field expressions and croniter's @aliases are accepted and normalised."""
    assert parse_cron(expr) == expected


@pytest.mark.parametrize(
    ("expr", "why"),
    [
        ("* * * * * *", "6 fields"),
        ("0 0 0 * * * 2026", "7 fields"),
        ("* * * *", "4 fields"),
        ("61 * * * *", "not a valid"),
        ("a b c d e", "not a valid"),
        ("@reboot", "not supported"),
        ("@every 5m", "not supported"),
        ("H * * * *", "H or R"),
        ("R * * * *", "H or R"),
        ("0 0 30 2 *", "never fires"),
        ("", "non-empty"),
        ("   ", "non-empty"),
    ],
)
def test_parse_cron_rejects_with_field_and_reason(expr: str, why: str) -> None:
    """Bad cron expressions raise ScheduleError naming the cron field and the reason."""
    with pytest.raises(ScheduleError) as caught:
        parse_cron(expr)
    assert caught.value.field == "cron"
    assert "cron" in str(caught.value)
    assert why in str(caught.value)


def test_month_and_day_names_are_not_mistaken_for_hash_or_random() -> None:
    """Names containing H or R (THU, FRI, MAR) are fine; only bare H/R tokens are refused."""
    assert parse_cron("0 0 * MAR THU,FRI") == "0 0 * MAR THU,FRI"


def test_parse_timezone_returns_zoneinfo() -> None:
    """Known IANA names load as ZoneInfo."""
    assert parse_timezone("Europe/London") == ZoneInfo("Europe/London")
    assert parse_timezone("UTC") == ZoneInfo("UTC")


@pytest.mark.parametrize("name", ["Mars/Olympus", "", "../etc/passwd", "Europe/"])
def test_parse_timezone_rejects_with_field(name: str) -> None:
    """Unknown or malformed zone names raise ScheduleError naming the timezone field."""
    with pytest.raises(ScheduleError) as caught:
        parse_timezone(name)
    assert caught.value.field == "timezone"
    assert "timezone" in str(caught.value)


def test_schedule_error_is_a_value_error() -> None:
    """ScheduleError is a ValueError so generic validation handlers catch it."""
    assert issubclass(ScheduleError, ValueError)


def test_next_fire_after_validates_inputs() -> None:
    """A bad zone name and a naive datetime are both refused."""
    with pytest.raises(ScheduleError) as caught:
        next_fire_after("@daily", "Nowhere/Land", utc(2026, 1, 1))
    assert caught.value.field == "timezone"
    with pytest.raises(ValueError, match="timezone-aware"):
        next_fire_after("@daily", "UTC", datetime(2026, 1, 1))


# --- next_fire_after and DST ---------------------------------------------------------------


def test_next_fire_is_strictly_after_and_utc() -> None:
    """The next tick is strictly later than `after` and comes back in UTC."""
    at = utc(2026, 1, 1, 9, 0)
    nxt = next_fire_after("0 9 * * *", "UTC", at)
    assert nxt == utc(2026, 1, 2, 9, 0)
    assert nxt.tzinfo is UTC
    assert next_fire_after("0 9 * * *", "UTC", at - timedelta(microseconds=1)) == at


def test_next_fire_uses_local_wall_time() -> None:
    """09:00 in New York is 14:00 UTC in winter and 13:00 UTC in summer."""
    assert next_fire_after("0 9 * * *", NY, utc(2026, 1, 5)) == utc(2026, 1, 5, 14)
    assert next_fire_after("0 9 * * *", ZoneInfo(NY), utc(2026, 7, 5)) == utc(2026, 7, 5, 13)


def test_us_spring_forward_missing_time_fires_once_at_gap_end() -> None:
    """02:30 does not exist on 2026-03-08 in New York: it fires once, at 03:00 EDT."""
    got = ticks("30 2 * * *", NY, utc(2026, 3, 7, 12), 3)
    assert wall(got, NY) == ["03-08 03:00-0400", "03-09 02:30-0400", "03-10 02:30-0400"]
    assert got[0] == utc(2026, 3, 8, 7, 0)


def test_us_spring_forward_gap_ticks_collapse_into_one() -> None:
    """Every */15 tick inside the skipped hour collapses into one fire at 03:00."""
    got = ticks("*/15 * * * *", NY, local(NY, 2026, 3, 8, 1, 40), 4)
    assert wall(got, NY) == [
        "03-08 01:45-0500",
        "03-08 03:00-0400",
        "03-08 03:15-0400",
        "03-08 03:30-0400",
    ]


def test_us_fall_back_repeated_time_fires_once_at_first_occurrence() -> None:
    """01:30 happens twice on 2026-11-01 in New York: it fires once, in EDT."""
    got = ticks("30 1 * * *", NY, utc(2026, 10, 31, 12), 3)
    assert wall(got, NY) == ["11-01 01:30-0400", "11-02 01:30-0500", "11-03 01:30-0500"]


def test_us_fall_back_after_second_occurrence_does_not_refire() -> None:
    """From inside the repeated hour (EST), the 01:30 tick already fired and is not repeated."""
    after = local(NY, 2026, 11, 1, 1, 10, fold=1)
    assert after.utcoffset() == timedelta(hours=-5)
    assert wall([next_fire_after("30 1 * * *", NY, after)], NY) == ["11-02 01:30-0500"]
    assert wall([next_fire_after("*/30 * * * *", NY, after)], NY) == ["11-01 02:00-0500"]


def test_hourly_across_us_spring_forward() -> None:
    """@hourly goes 01:00 EST, 03:00 EDT: one real hour apart, with no duplicate."""
    got = ticks("@hourly", NY, local(NY, 2026, 3, 8, 0, 30), 4)
    assert wall(got, NY) == [
        "03-08 01:00-0500",
        "03-08 03:00-0400",
        "03-08 04:00-0400",
        "03-08 05:00-0400",
    ]
    assert got[1] - got[0] == timedelta(hours=1)


def test_hourly_across_us_fall_back_fires_each_wall_hour_once() -> None:
    """@hourly fires 01:00 once (EDT), then 02:00 EST: two real hours apart."""
    got = ticks("@hourly", NY, local(NY, 2026, 11, 1, 0, 30), 4)
    assert wall(got, NY) == [
        "11-01 01:00-0400",
        "11-01 02:00-0500",
        "11-01 03:00-0500",
        "11-01 04:00-0500",
    ]
    assert got[1] - got[0] == timedelta(hours=2)


def test_minutely_across_us_fall_back_skips_the_repeat() -> None:
    """A minutely cron runs 01:00-01:59 once (EDT) and continues at 02:00 EST."""
    got = ticks("* * * * *", NY, local(NY, 2026, 11, 1, 1, 58), 3)
    assert wall(got, NY) == ["11-01 01:59-0400", "11-01 02:00-0500", "11-01 02:01-0500"]


def test_london_spring_forward_2026_03_29() -> None:
    """01:30 does not exist in London on 2026-03-29: it fires at 02:00 BST (01:00 UTC)."""
    got = ticks("30 1 * * *", LONDON, utc(2026, 3, 28, 12), 2)
    assert wall(got, LONDON) == ["03-29 02:00+0100", "03-30 01:30+0100"]
    assert got[0] == utc(2026, 3, 29, 1, 0)


def test_london_fall_back_2026_10_25() -> None:
    """01:30 happens twice in London on 2026-10-25: it fires once, in BST."""
    got = ticks("30 1 * * *", LONDON, utc(2026, 10, 24, 12), 2)
    assert wall(got, LONDON) == ["10-25 01:30+0100", "10-26 01:30+0000"]


def test_hourly_across_london_transitions() -> None:
    """@hourly in London: 00:00 GMT then 02:00 BST in March; 01:00 BST then 02:00 GMT in October."""
    spring = ticks("@hourly", LONDON, utc(2026, 3, 28, 23, 30), 3)
    assert wall(spring, LONDON) == ["03-29 00:00+0000", "03-29 02:00+0100", "03-29 03:00+0100"]
    autumn = ticks("@hourly", LONDON, utc(2026, 10, 24, 23, 30), 3)
    assert wall(autumn, LONDON) == ["10-25 01:00+0100", "10-25 02:00+0000", "10-25 03:00+0000"]


def test_sydney_spring_forward_october() -> None:
    """02:30 does not exist in Sydney on 2026-10-04: it fires at 03:00 AEDT."""
    got = ticks("30 2 * * *", SYDNEY, utc(2026, 10, 3), 2)
    assert wall(got, SYDNEY) == ["10-04 03:00+1100", "10-05 02:30+1100"]


def test_sydney_fall_back_april() -> None:
    """02:30 happens twice in Sydney on 2026-04-05: it fires once, in AEDT."""
    got = ticks("30 2 * * *", SYDNEY, utc(2026, 4, 4), 2)
    assert wall(got, SYDNEY) == ["04-05 02:30+1100", "04-06 02:30+1000"]


def test_half_hour_dst_gap_ends_at_the_real_transition() -> None:
    """Lord Howe springs forward 30 minutes: 02:15 on 2026-10-04 fires at 02:30 local."""
    tz = "Australia/Lord_Howe"
    got = ticks("15 2 * * *", tz, utc(2026, 10, 3), 2)
    assert wall(got, tz) == ["10-04 02:30+1100", "10-05 02:15+1100"]


# --- plan_ticks ----------------------------------------------------------------------------


def plan(
    misfire: MisfirePolicy,
    *,
    now: datetime,
    last_tick: datetime | None = None,
    cron: str = "0 * * * *",
    grace: timedelta = GRACE,
    cap: int = 100,
) -> TickPlan:
    """Plan ticks for a UTC schedule created at 2026-01-01 00:00 with a controllable `now`."""
    return plan_ticks(
        cron,
        "UTC",
        last_tick=last_tick,
        created_at=utc(2026, 1, 1),
        now=now,
        misfire=misfire,
        grace=grace,
        cap=cap,
    )


@pytest.mark.parametrize("policy", list(MisfirePolicy))
def test_nothing_due_fires_nothing(policy: MisfirePolicy) -> None:
    """Before the first tick nothing fires, and the cursor stays put."""
    p = plan(policy, now=utc(2026, 1, 1, 0, 30))
    assert p == TickPlan((), (), False, None, utc(2026, 1, 1, 1))


@pytest.mark.parametrize("policy", list(MisfirePolicy))
def test_on_time_tick_fires_under_every_policy(policy: MisfirePolicy) -> None:
    """A tick seen within the grace period is on time and fires whatever the misfire policy."""
    p = plan(policy, now=utc(2026, 1, 1, 1, 0, 45), last_tick=utc(2026, 1, 1, 0))
    assert p.fire == (utc(2026, 1, 1, 1),)
    assert p.skipped == ()
    assert p.last_tick == utc(2026, 1, 1, 1)
    assert p.next_fire_at == utc(2026, 1, 1, 2)


def test_grace_boundary_is_inclusive() -> None:
    """Exactly `grace` late is on time; one microsecond more is a misfire."""
    tick = utc(2026, 1, 1, 1)
    on_time = plan(MisfirePolicy.SKIP, now=tick + GRACE)
    assert on_time.fire == (tick,)
    late = plan(MisfirePolicy.SKIP, now=tick + GRACE + timedelta(microseconds=1))
    assert late.fire == ()
    assert late.skipped == (tick,)


def test_first_tick_is_after_created_at() -> None:
    """With no cursor, ticks count from creation; the creation instant itself is not a tick."""
    p = plan(MisfirePolicy.FIRE_ALL, now=utc(2026, 1, 1, 0, 0, 30))
    assert p.fire == ()
    assert p.next_fire_at == utc(2026, 1, 1, 1)


def test_fire_once_fires_only_the_latest_missed_tick() -> None:
    """Five hours down: one run for the 05:00 tick; 01:00-04:00 are recorded skipped."""
    p = plan(MisfirePolicy.FIRE_ONCE, now=utc(2026, 1, 1, 5, 30))
    assert p.fire == (utc(2026, 1, 1, 5),)
    assert p.skipped == tuple(utc(2026, 1, 1, h) for h in range(1, 5))
    assert not p.more_skipped
    assert p.last_tick == utc(2026, 1, 1, 5)
    assert p.next_fire_at == utc(2026, 1, 1, 6)


def test_fire_once_keeps_on_time_ticks() -> None:
    """Missed ticks collapse into one run, and the on-time tick fires as well."""
    p = plan(MisfirePolicy.FIRE_ONCE, cron="* * * * *", now=utc(2026, 1, 1, 0, 5, 30))
    assert p.fire == (utc(2026, 1, 1, 0, 4), utc(2026, 1, 1, 0, 5))
    assert p.skipped == tuple(utc(2026, 1, 1, 0, m) for m in range(1, 4))


def test_skip_fires_no_missed_tick() -> None:
    """Under skip, every missed tick is recorded skipped and only on-time ones fire."""
    p = plan(MisfirePolicy.SKIP, cron="* * * * *", now=utc(2026, 1, 1, 0, 5, 30))
    assert p.fire == (utc(2026, 1, 1, 0, 5),)
    assert p.skipped == tuple(utc(2026, 1, 1, 0, m) for m in range(1, 5))


def test_fire_all_fires_every_missed_tick_oldest_first() -> None:
    """Under fire_all, each missed tick gets its own run with its own scheduled time."""
    p = plan(MisfirePolicy.FIRE_ALL, now=utc(2026, 1, 1, 5, 30))
    assert p.fire == tuple(utc(2026, 1, 1, h) for h in range(1, 6))
    assert p.skipped == ()


def test_fire_all_is_capped_and_the_rest_skipped() -> None:
    """fire_all starts at most `cap` missed runs (oldest first); the rest are skipped."""
    p = plan(MisfirePolicy.FIRE_ALL, now=utc(2026, 1, 1, 10, 30), cap=3)
    assert p.fire == tuple(utc(2026, 1, 1, h) for h in (1, 2, 3))
    assert p.skipped == tuple(utc(2026, 1, 1, h) for h in (4, 5, 6))
    assert p.more_skipped
    assert p.last_tick == utc(2026, 1, 1, 10)


def test_skipped_list_is_capped_and_flagged() -> None:
    """The skipped list holds at most `cap` ticks and says when more were left out."""
    p = plan(MisfirePolicy.SKIP, now=utc(2026, 1, 2), cap=5)
    assert len(p.skipped) == 5
    assert p.skipped[0] == utc(2026, 1, 1, 1)
    assert p.more_skipped


def test_cursor_excludes_ticks_already_handled() -> None:
    """Ticks at or before `last_tick` are never planned again."""
    p = plan(MisfirePolicy.FIRE_ALL, now=utc(2026, 1, 1, 3, 0, 10), last_tick=utc(2026, 1, 1, 2))
    assert p.fire == (utc(2026, 1, 1, 3),)


def test_long_outage_is_planned_quickly_and_correctly() -> None:
    """A minutely schedule down for over a year still fires the right ticks and moves on."""
    now = utc(2027, 3, 1, 12, 0, 30)
    p = plan(MisfirePolicy.FIRE_ONCE, cron="* * * * *", now=now, cap=10)
    assert p.fire == (utc(2027, 3, 1, 11, 59), utc(2027, 3, 1, 12, 0))
    assert p.skipped == tuple(utc(2026, 1, 1, 0, m) for m in range(1, 11))
    assert p.more_skipped
    assert p.last_tick == utc(2027, 3, 1, 12)
    assert p.next_fire_at == utc(2027, 3, 1, 12, 1)


def test_plan_across_spring_forward_has_no_duplicates() -> None:
    """Planning through the US gap with fire_all yields each instant once, in order."""
    p = plan_ticks(
        "*/30 * * * *",
        NY,
        last_tick=local(NY, 2026, 3, 8, 1, 0),
        created_at=utc(2026, 1, 1),
        now=local(NY, 2026, 3, 8, 4, 0),
        misfire=MisfirePolicy.FIRE_ALL,
        grace=GRACE,
    )
    assert wall(list(p.fire), NY) == [
        "03-08 01:30-0500",
        "03-08 03:00-0400",
        "03-08 03:30-0400",
        "03-08 04:00-0400",
    ]


def test_plan_rejects_bad_arguments() -> None:
    """Negative grace or cap, and naive datetimes, are programming errors."""
    with pytest.raises(ValueError, match="grace"):
        plan(MisfirePolicy.SKIP, now=utc(2026, 1, 2), grace=timedelta(seconds=-1))
    with pytest.raises(ValueError, match="cap"):
        plan(MisfirePolicy.SKIP, now=utc(2026, 1, 2), cap=-1)
    with pytest.raises(ValueError, match="now"):
        plan(MisfirePolicy.SKIP, now=datetime(2026, 1, 2))


# --- overlap, auto-disable, ids ------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "active", "buffered", "expected"),
    [
        (OverlapPolicy.ALLOW, 0, 0, OverlapDecision.START),
        (OverlapPolicy.ALLOW, 3, 0, OverlapDecision.START),
        (OverlapPolicy.SKIP, 0, 0, OverlapDecision.START),
        (OverlapPolicy.SKIP, 1, 0, OverlapDecision.SKIP),
        (OverlapPolicy.BUFFER_ONE, 0, 0, OverlapDecision.START),
        (OverlapPolicy.BUFFER_ONE, 1, 0, OverlapDecision.BUFFER),
        (OverlapPolicy.BUFFER_ONE, 1, 1, OverlapDecision.DROP),
        (OverlapPolicy.BUFFER_ONE, 0, 1, OverlapDecision.DROP),
    ],
)
def test_overlap_table(
    policy: OverlapPolicy, active: int, buffered: int, expected: OverlapDecision
) -> None:
    """Each overlap policy decides start, skip, buffer or drop as documented."""
    assert decide_overlap(policy, active_runs=active, buffered=buffered) is expected


def test_policies_given_as_plain_strings_behave_like_the_enums() -> None:
    """Values read from the database as plain strings pick the same branch as the enums."""
    now = utc(2026, 1, 1, 5, 30)
    assert plan(MisfirePolicy("skip"), now=now) == plan("skip", now=now)  # type: ignore[arg-type]
    assert plan("skip", now=now).fire == ()  # type: ignore[arg-type]
    got = decide_overlap("skip", active_runs=1, buffered=0)  # type: ignore[arg-type]
    assert got is OverlapDecision.SKIP


def test_overlap_rejects_negative_counts() -> None:
    """Negative counts are a programming error."""
    with pytest.raises(ValueError):
        decide_overlap(OverlapPolicy.SKIP, active_runs=-1, buffered=0)


def test_policies_are_str_enums_matching_the_database() -> None:
    """Enum values are the strings stored in the schedules table and shown by the API."""
    assert [p.value for p in OverlapPolicy] == ["allow", "skip", "buffer_one"]
    assert [p.value for p in MisfirePolicy] == ["fire_once", "skip", "fire_all"]
    assert [s.value for s in ScheduleStatus] == ["active", "paused", "disabled", "completed"]
    assert OverlapPolicy("buffer_one") == "buffer_one"


@pytest.mark.parametrize(
    ("failures", "threshold", "expected"),
    [(19, 20, False), (20, 20, True), (21, 20, True), (1000, 0, False), (1, 1, True)],
)
def test_should_disable(failures: int, threshold: int, expected: bool) -> None:
    """A schedule is disabled at the threshold; threshold 0 means never."""
    assert should_disable(failures, threshold) is expected


def test_should_disable_defaults_to_twenty() -> None:
    """The default threshold is 20 consecutive failures."""
    assert not should_disable(19)
    assert should_disable(20)


def test_tick_run_id_is_deterministic() -> None:
    """The same schedule and instant give the same id, whatever zone the tick is written in,
    time-ordered by the tick."""
    tick = utc(2026, 3, 8, 7)
    a = tick_run_id("wfs_ABC", tick)
    assert a == tick_run_id("wfs_ABC", tick.astimezone(ZoneInfo(NY)))
    assert a.version == 8 and a.int >> 80 == int(tick.timestamp() * 1000)
    assert a == uuid.UUID(str(tick_run_id("wfs_ABC", utc(2026, 3, 8, 7))))


def test_tick_run_id_differs_per_tick_and_schedule() -> None:
    """Different ticks or schedules give different run ids."""
    tick = utc(2026, 3, 8, 7)
    ids = {
        tick_run_id("wfs_ABC", tick),
        tick_run_id("wfs_ABC", tick + timedelta(minutes=1)),
        tick_run_id("wfs_ABD", tick),
    }
    assert len(ids) == 3


def test_tick_run_id_requires_an_aware_tick() -> None:
    """A naive tick would be ambiguous, so it is refused."""
    with pytest.raises(ValueError):
        tick_run_id("wfs_ABC", datetime(2026, 1, 1))


def test_new_schedule_id_shape_and_uniqueness() -> None:
    """Ids are wfs_ plus 26 Crockford base32 characters, unique, and match the table's CHECK."""
    ids = {new_schedule_id() for _ in range(200)}
    assert len(ids) == 200
    for sid in ids:
        assert re.fullmatch(r"wfs_[0-9A-HJKMNP-TV-Z]{26}", sid)


def test_new_schedule_ids_sort_by_creation_time() -> None:
    """The leading characters encode the creation time, so ids sort in creation order."""
    early = new_schedule_id(utc(2026, 1, 1))
    late = new_schedule_id(utc(2026, 1, 1, 0, 0, 1))
    assert early < late


def test_module_has_no_io_imports() -> None:
    """The rules module imports no I/O library."""
    source = Path(schedules.__file__).read_text(encoding="utf-8")
    for name in ("asyncpg", "httpx", "socket", "os"):
        assert not re.search(rf"^\s*(import|from)\s+{name}\b", source, re.M)


# --- edges pinned ----------------------------------------------------------------------------


def test_an_alias_is_one_field_alone_and_errors_say_what_is_known() -> None:
    with pytest.raises(ScheduleError, match="has 2 fields; expected 5"):
        parse_cron("@daily 5")
    with pytest.raises(ScheduleError) as caught:
        parse_cron("@often")
    assert caught.value.field == "cron"
    assert caught.value.message == (
        "cron alias '@often' is not supported; use @annually, @daily, @hourly, @midnight,"
        " @monthly, @weekly, @yearly"
    )
    with pytest.raises(ScheduleError, match=r"^timezone must be an IANA name") as tz:
        parse_timezone("  ")
    assert tz.value.field == "timezone"
    with pytest.raises(ScheduleError, match=r"^timezone must be an IANA name"):
        parse_timezone(5)  # type: ignore[arg-type]


class _NoOffset(tzinfo):
    def utcoffset(self, dt: datetime | None) -> None:
        return None


def test_naive_times_are_refused_by_name() -> None:
    """Each rule names the argument that has no offset (a tzinfo giving none counts too)."""
    naive = datetime(2026, 1, 2)
    with pytest.raises(ValueError, match=r"^after must be a timezone-aware datetime$"):
        next_fire_after("@daily", "UTC", naive)
    with pytest.raises(ValueError, match=r"^after must be"):
        next_fire_after("@daily", "UTC", datetime(2026, 1, 2, tzinfo=_NoOffset()))
    with pytest.raises(ValueError, match=r"^tick must be"):
        tick_run_id("wfs_A", naive)
    for name in ("created_at", "last_tick"):
        args = {"created_at": utc(2026, 1, 1), "last_tick": utc(2026, 1, 1), name: naive}
        with pytest.raises(ValueError, match=f"^{name} must be"):
            plan_ticks("@daily", "UTC", now=utc(2026, 1, 2), misfire=MisfirePolicy.SKIP,
                       grace=GRACE, **args)  # type: ignore[arg-type]  # fmt: skip
    with pytest.raises(ValueError, match=r"^active_runs and buffered must not be negative$"):
        decide_overlap(OverlapPolicy.SKIP, active_runs=-1, buffered=0)


def test_plans_keep_their_default_cap_and_zero_bounds() -> None:
    """fire_all starts at most 100 missed runs by default; a zero grace and a zero cap are
    allowed."""
    p = plan_ticks(
        "0 * * * *", "UTC", last_tick=None, created_at=utc(2026, 1, 1), now=utc(2026, 1, 8),
        misfire=MisfirePolicy.FIRE_ALL, grace=timedelta(0),
    )  # fmt: skip
    assert len(p.fire) == 100 + 1 and p.fire[-1] == utc(2026, 1, 8)
    zero = plan(MisfirePolicy.FIRE_ALL, now=utc(2026, 1, 1, 5, 30), cap=0)
    assert zero.fire == () and zero.skipped == () and zero.more_skipped


def test_more_skipped_says_exactly_when_some_are_unlisted() -> None:
    """Skipped ticks up to the cap are all listed (no flag); one more is flagged."""
    listed = plan(MisfirePolicy.SKIP, now=utc(2026, 1, 1, 2, 30), cap=2)
    assert listed.skipped == (utc(2026, 1, 1, 1), utc(2026, 1, 1, 2))
    assert not listed.more_skipped
    over = plan(MisfirePolicy.SKIP, now=utc(2026, 1, 1, 3, 30), cap=2)
    assert over.skipped == (utc(2026, 1, 1, 1), utc(2026, 1, 1, 2)) and over.more_skipped


def test_a_long_outage_of_a_daily_schedule_fires_the_latest_missed_tick() -> None:
    """Past the misfires listed, the plan jumps near the boundary (widening its step) and
    still finds the latest missed tick and the next one."""
    p = plan_ticks(
        "0 9 * * *", NY, last_tick=None, created_at=utc(2025, 1, 1), now=utc(2026, 6, 1, 18),
        misfire=MisfirePolicy.FIRE_ONCE, grace=GRACE, cap=2,
    )  # fmt: skip
    assert p.fire == (utc(2026, 6, 1, 13),)  # 09:00 EDT
    assert p.skipped == (utc(2025, 1, 1, 14), utc(2025, 1, 2, 14))
    assert p.more_skipped and p.last_tick == utc(2026, 6, 1, 13)
    assert p.next_fire_at == utc(2026, 6, 2, 13)


def test_a_long_outage_ending_on_a_tick_fires_the_one_before_it_too() -> None:
    """A tick exactly at the grace boundary is on time; the latest missed one is the tick
    before it, found even after the plan jumped ahead."""
    p = plan(MisfirePolicy.FIRE_ONCE, now=utc(2026, 1, 1, 12), grace=timedelta(0), cap=1)
    assert p.fire == (utc(2026, 1, 1, 11), utc(2026, 1, 1, 12))
    assert p.last_tick == utc(2026, 1, 1, 12) and p.next_fire_at == utc(2026, 1, 1, 13)


def test_a_long_outage_jumps_by_the_schedules_own_zone() -> None:
    """Between 09:00 UTC and 09:00 New York the latest missed tick of a New York schedule is
    the day before's: the jump ahead counts ticks in the schedule's zone, not in UTC."""
    p = plan_ticks(
        "0 9 * * *", NY, last_tick=None, created_at=utc(2025, 1, 1), now=utc(2026, 6, 1, 12),
        misfire=MisfirePolicy.FIRE_ONCE, grace=GRACE, cap=2,
    )  # fmt: skip
    assert p.fire == (utc(2026, 5, 31, 13),)
    assert p.last_tick == utc(2026, 5, 31, 13) and p.next_fire_at == utc(2026, 6, 1, 13)


def test_a_plan_with_nothing_due_keeps_its_cursor() -> None:
    p = plan(MisfirePolicy.FIRE_ALL, now=utc(2026, 1, 1, 5, 30), last_tick=utc(2026, 1, 1, 5))
    assert p.fire == () and p.last_tick == utc(2026, 1, 1, 5)
    assert p.next_fire_at == utc(2026, 1, 1, 6)


def test_plan_and_cron_errors_say_why() -> None:
    with pytest.raises(
        ScheduleError, match=r"^cron must be a non-empty string such as '0 9 \* \* 1-5'$"
    ):
        parse_cron(" ")
    with pytest.raises(ScheduleError) as caught:
        parse_cron("0 9 * *")
    assert caught.value.message == (
        "cron '0 9 * *' has 4 fields; expected 5 (minute hour day-of-month month day-of-week),"
        " seconds and years are not supported"
    )
    with pytest.raises(ValueError, match=r"^now must be a timezone-aware datetime$"):
        plan(MisfirePolicy.SKIP, now=datetime(2026, 1, 2))
    with pytest.raises(ValueError, match=r"^grace must not be negative$"):
        plan(MisfirePolicy.SKIP, now=utc(2026, 1, 2), grace=timedelta(seconds=-1))
    with pytest.raises(ValueError, match=r"^cap must not be negative$"):
        plan(MisfirePolicy.SKIP, now=utc(2026, 1, 2), cap=-1)


def test_a_plan_counts_wall_time_in_its_zone() -> None:
    p = plan_ticks(
        "0 9 * * *", NY, last_tick=None, created_at=utc(2026, 1, 5), now=utc(2026, 1, 7, 15),
        misfire=MisfirePolicy.FIRE_ALL, grace=GRACE,
    )  # fmt: skip
    assert p.fire == (utc(2026, 1, 5, 14), utc(2026, 1, 6, 14), utc(2026, 1, 7, 14))
    assert p.next_fire_at == utc(2026, 1, 8, 14)


def test_a_gap_time_off_the_hour_fires_at_the_gap_end_to_the_second() -> None:
    """02:10 does not exist on 2026-03-08 in New York: the tick is 03:00 EDT exactly; on
    Lord Howe Island (a 30-minute shift) 02:10 fires at 02:30 exactly."""
    assert next_fire_after("10 2 * * *", NY, utc(2026, 3, 7, 12)) == utc(2026, 3, 8, 7)
    assert next_fire_after("1 2 * * *", NY, utc(2026, 3, 7, 12)) == utc(2026, 3, 8, 7)
    howe = next_fire_after("10 2 * * *", "Australia/Lord_Howe", utc(2026, 10, 3, 12))
    assert howe == utc(2026, 10, 3, 15, 30)


def test_tick_run_ids_and_schedule_ids_are_pinned(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tick's run id never changes (orchestrators agree on it, whatever their own zone); a
    schedule id starts with its creation time in milliseconds."""
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        tick = tick_run_id("wfs_ABC", local(NY, 2026, 3, 8, 3))
        assert tick == uuid.UUID("019ccc3e-e580-8c16-803d-e200989e9814")
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    at = datetime(2026, 1, 1, 0, 0, 0, 1000, tzinfo=UTC)  # an odd millisecond
    made = {new_schedule_id(at) for _ in range(5)}
    assert len(made) == 5 and {m[:14] for m in made} == {"wfs_01KDVDNA01"}
    assert new_schedule_id(None) > new_schedule_id(utc(2026, 1, 1))
