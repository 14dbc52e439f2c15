"""The workflow registry: names, options, duplicate detection and signing secrets."""

from __future__ import annotations

from typing import Any

import pytest

import stepline


async def noop(ctx: stepline.Context, input: Any) -> None:
    return None


@pytest.mark.parametrize("name", ["", "has space", "a" * 65, "dots.not.allowed", "é"])
def test_invalid_workflow_names_are_rejected(name: str) -> None:
    """Names must match ^[A-Za-z0-9_-]{1,64}$."""
    with pytest.raises(ValueError):
        stepline.Stepline("s").workflow(name)


def test_duplicate_workflow_names_are_rejected() -> None:
    """Registering a name twice raises ValueError."""
    sl = stepline.Stepline("s")
    sl.workflow("a")(noop)
    with pytest.raises(ValueError, match="already registered"):
        sl.workflow("a")(noop)


def test_sync_workflow_functions_are_rejected() -> None:
    """Workflows must be async functions."""

    def sync(ctx: stepline.Context, input: Any) -> None:
        return None

    with pytest.raises(TypeError, match="async"):
        stepline.Stepline("s").workflow("sync")(sync)  # type: ignore[arg-type]


def test_options_reach_describe() -> None:
    """Retries as an int, timeouts and schedules as dicts end up in the description."""
    sl = stepline.Stepline("s")
    sl.workflow("a", retries=5, timeout="30d", schedule={"cron": "* * * * *", "timezone": "X"})(
        noop
    )
    sl.workflow("b")(noop)
    a, b = sl.describe().workflows
    assert a.retries.attempts == 5 and a.timeout_ms == 30 * 86_400_000
    assert a.schedule is not None and a.schedule.timezone == "X"
    assert b.retries == stepline.Retries().policy() and b.timeout_ms is None


def test_retries_validation() -> None:
    """Retries needs at least one attempt and a factor of at least 1."""
    with pytest.raises(ValueError):
        stepline.Retries(attempts=0)
    with pytest.raises(ValueError):
        stepline.Retries(factor=0.5)
    with pytest.raises(ValueError):
        stepline.Retries(initial_delay="soon")


def test_a_rate_limit_reaches_describe() -> None:
    """RateLimit(limit, period, key) is described with its period in milliseconds; a workflow
    without one describes none."""
    sl = stepline.Stepline("s")
    sl.workflow("a", rate_limit=stepline.RateLimit(limit=10, period="1m30s", key="userId"))(noop)
    sl.workflow("b", rate_limit=stepline.RateLimit(2))(noop)
    sl.workflow("c")(noop)
    a, b, c = sl.describe().workflows
    dumped = a.model_dump(by_alias=True, exclude_none=True)
    assert dumped["rateLimit"] == {"limit": 10, "periodMs": 90_000, "key": "userId"}
    assert b.rate_limit is not None and (b.rate_limit.limit, b.rate_limit.period_ms) == (2, 60_000)
    assert c.rate_limit is None


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"limit": 0}, ValueError),
        ({"limit": -3}, ValueError),
        ({"limit": 1.5}, TypeError),
        ({"limit": True}, TypeError),
        ({"limit": 1, "period": 0}, ValueError),
        ({"limit": 1, "period": "-1s"}, ValueError),
        ({"limit": 1, "period": "soon"}, ValueError),
        ({"limit": 1, "key": ""}, ValueError),
    ],
)
def test_rate_limit_validation(kwargs: dict[str, Any], error: type[Exception]) -> None:
    """A rate limit needs a limit of at least 1 and a period that is a duration over zero."""
    with pytest.raises(error):
        stepline.RateLimit(**kwargs)


def test_a_workflow_takes_concurrency_or_a_rate_limit_not_both() -> None:
    """Both on one workflow is refused when it is declared."""
    with pytest.raises(ValueError, match="not both"):
        stepline.Stepline("s").workflow("a", concurrency=1, rate_limit=stepline.RateLimit(limit=1))(
            noop
        )


def test_signing_secrets_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """STEPLINE_SIGNING_SECRET is read when no secret is given, comma separated."""
    monkeypatch.setenv("STEPLINE_SIGNING_SECRET", "new, old,")
    assert stepline.Stepline().signing_secrets == ("new", "old")
    assert stepline.Stepline("explicit").signing_secrets == ("explicit",)
    monkeypatch.delenv("STEPLINE_SIGNING_SECRET")
    assert stepline.Stepline().signing_secrets == ()


def test_errors_carry_their_data() -> None:
    """The public exceptions keep their data as attributes and share one base."""
    terminal = stepline.TerminalError("no", code="nope")
    retry = stepline.RetryableError("later", retry_after="5s")
    failed = stepline.StepFailed("s", "KeyError", "boom", "c")
    child = stepline.ChildWorkflowFailed("c", stepline.protocol.ErrorInfo(message="x"), "r2")
    assert (terminal.message, terminal.code) == ("no", "nope")
    assert retry.retry_after == "5s"
    assert (failed.step, failed.error_type, failed.error_message, failed.code) == (
        "s", "KeyError", "boom", "c",
    )  # fmt: skip
    assert child.child_run_id == "r2"
    for exc in (terminal, retry, failed, child, stepline.Cancelled()):
        assert isinstance(exc, stepline.SteplineError)
    assert str(stepline.Cancelled())


def test_a_code_schedule_takes_an_sla_as_a_duration() -> None:
    """``schedule={"cron": ..., "sla": "10m"}`` is described with ``slaMs``; the dict given is
    left as it was."""
    sl = stepline.Stepline("whsec_t")
    given = {"cron": "0 3 * * *", "sla": "10m"}

    @sl.workflow("nightly", schedule=given)
    async def nightly(ctx: stepline.Context, input: None) -> None: ...

    (info,) = sl.describe().workflows
    assert info.schedule is not None and info.schedule.sla_ms == 600_000
    assert given == {"cron": "0 3 * * *", "sla": "10m"}
