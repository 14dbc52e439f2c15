"""The small chaos run inside the suite: every invariant of ``python -m tests.chaos`` holds."""

from __future__ import annotations

import pytest

from tests.chaos import scenario
from tests.chaos.config import parse

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.slow,
]


async def test_small_chaos_run_keeps_every_invariant() -> None:
    """24 runs through kills of both orchestrators, a PostgreSQL restart and an app kill all
    complete with the right output, with no step recorded twice, no acknowledged callback or
    event lost, no two invocations of a run at once and no deadlock."""
    config = parse(["--size", "small"], environ={})
    lines: list[str] = []
    report = await scenario.run(config, out=lines.append)
    print("\n".join(lines))
    print(report.table())
    assert report.ok, report.table()
