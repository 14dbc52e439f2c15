"""Durations as the SDK takes them: seconds, timedeltas and strings like "1h30m"."""

from __future__ import annotations

from datetime import timedelta

import pytest

from stepline import parse_duration
from stepline._durations import to_ms


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (5, 5.0),
        (2.5, 2.5),
        (timedelta(minutes=2), 120.0),
        ("500ms", 0.5),
        ("30s", 30.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("1d", 86400.0),
        ("1h30m", 5400.0),
        ("1.5", 1.5),
    ],
)
def test_parse_duration_accepts_documented_forms(value: object, seconds: float) -> None:
    """Every documented duration form parses to the right number of seconds."""
    assert parse_duration(value) == seconds  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["", "abc", "5x", "1h 30q", -1, True, None, float("nan")])
def test_parse_duration_rejects_nonsense(value: object) -> None:
    """Anything that is not a non-negative duration raises ValueError."""
    with pytest.raises(ValueError):
        parse_duration(value)  # type: ignore[arg-type]


def test_to_ms_rounds_to_whole_milliseconds() -> None:
    """to_ms answers whole milliseconds."""
    assert to_ms("1s") == 1000
    assert to_ms(0.0004) == 0
    assert to_ms("1m30s") == 90_000
