"""Durations said in words for the dashboard: "7 days", "3 h 20 min", never "7d00h"."""

from __future__ import annotations

import pytest

from stepline._durations import in_words


@pytest.mark.parametrize(
    ("seconds", "said"),
    [
        (0, "0 ms"),
        (0.012, "12 ms"),
        (0.9996, "1 s"),
        (1.0, "1 s"),
        (3.44, "3.4 s"),
        (9.96, "10 s"),
        (30.0, "30 s"),
        (59.6, "1 min"),
        (90, "1 min 30 s"),
        (125, "2 min 5 s"),
        (3600, "1 h"),
        (3 * 3600 + 20 * 60 + 12, "3 h 20 min"),
        (86400, "1 day"),
        (7 * 86400, "7 days"),
        (30 * 86400, "30 days"),
        (3 * 86400 + 4 * 3600 + 59, "3 days 4 h"),
    ],
)
def test_a_duration_reads_in_words(seconds: float, said: str) -> None:
    """Each duration reads in at most two units, the second left out when zero."""
    assert in_words(seconds) == said


def test_a_negative_duration_reads_as_none() -> None:
    """A clock that went backwards (a start after its end) reads as no time at all."""
    assert in_words(-2.5) == "0 ms"
