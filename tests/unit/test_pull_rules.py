"""Pull apps' rules: registrations and poll parameters, and the polls waiting for a wake-up."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from stepline_server.engine import pull
from stepline_server.loops.pollers import Pollers


def test_a_push_app_needs_a_url_and_a_pull_app_has_none() -> None:
    """Push with a URL and pull without one register; the other two name the url field."""
    assert pull.registration_problem("push", "http://127.0.0.1:9/") is None
    assert pull.registration_problem("pull", None) is None
    field, message = pull.registration_problem("push", None) or ("", "")
    assert field == "url" and "pull" in message
    field, message = pull.registration_problem("pull", "http://127.0.0.1:9/") or ("", "")
    assert field == "url" and "no URL" in message


@pytest.mark.parametrize(
    ("wait", "limit", "expected"),
    [
        (None, None, (30.0, 1)),
        ("500ms", "7", (0.5, 7)),
        ("0", "100", (0.0, 100)),
        ("5m", "1", (60.0, 1)),  # at most a minute
    ],
)
def test_poll_parameters(wait: str | None, limit: str | None, expected: tuple[float, int]) -> None:
    """A poll waits 30 s for one invocation unless told; never more than a minute."""
    assert pull.poll_params(wait, limit) == expected


@pytest.mark.parametrize(
    ("wait", "limit", "field"),
    [("soon", None, "wait"), ("-1", None, "wait"), (None, "0", "limit"), (None, "101", "limit"),
     (None, "2.5", "limit"), (None, "", "limit")],
)  # fmt: skip
def test_bad_poll_parameters_name_their_field(
    wait: str | None, limit: str | None, field: str
) -> None:
    """A wait that is not a duration or is negative, a limit outside 1..100: the field."""
    with pytest.raises(pull.BadParam) as info:
        pull.poll_params(wait, limit)
    assert info.value.field == field


async def test_a_wake_up_reaches_the_polls_watching() -> None:
    """wake(app) sets the events of that app's polls only; wake_all sets every one; a poll
    that stopped watching is forgotten."""
    pollers = Pollers()
    a, b = uuid.uuid4(), uuid.uuid4()
    with pollers.watch(a) as ea, pollers.watch(b) as eb:
        assert pollers.waiting == 2
        pollers.wake(a)
        assert ea.is_set() and not eb.is_set()
        pollers.wake_all()
        assert eb.is_set()
        await asyncio.wait_for(eb.wait(), 1)
    assert pollers.waiting == 0
    pollers.wake_all()  # nobody left: nothing to do
