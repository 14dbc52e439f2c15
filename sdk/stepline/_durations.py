"""Durations as the API and SDK take them: seconds, a ``timedelta``, or ``"500ms"``, ``"1h30m"``."""

from __future__ import annotations

import functools
import re
from datetime import timedelta

Duration = int | float | str | timedelta

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration(value: Duration) -> float:
    """Return ``value`` in seconds; raise ``ValueError`` for anything else or a negative."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        return _parse_text(value)
    else:
        raise ValueError(f"not a duration: {value!r}")
    return _non_negative(seconds)


@functools.lru_cache(maxsize=256)
def _parse_text(value: str) -> float:
    # Cached: a workflow replays the same few durations (its sleeps) at every invocation.
    text = value.strip().lower().replace(" ", "")
    if not text:
        raise ValueError("empty duration")
    try:
        return _non_negative(float(text))
    except ValueError:
        pass
    pos, seconds = 0, 0.0
    for match in _PART.finditer(text):
        if match.start() != pos:
            break
        seconds += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos != len(text):
        raise ValueError(f"not a duration: {value!r} (use e.g. 30s, 5m, 1h30m, 1d)")
    return _non_negative(seconds)


def _non_negative(seconds: float) -> float:
    if seconds < 0 or seconds != seconds or seconds == float("inf"):
        raise ValueError(f"duration must be a finite, non-negative number of seconds: {seconds}")
    return seconds


def to_ms(value: Duration) -> int:
    """Return ``value`` in whole milliseconds."""
    return round(parse_duration(value) * 1000)


def in_words(seconds: float) -> str:
    """Seconds as a person says them: ``850 ms``, ``3.4 s``, ``2 min 5 s``, ``3 h 20 min``,
    ``7 days``; the second unit only when it is not zero."""
    return _spelled(seconds, " ", ("ms", "s", "min", "h", "day", "days"))


def in_short(seconds: float) -> str:
    """Seconds as a table shows them: ``850ms``, ``3.4s``, ``45s``, ``2m 5s``, ``2h 5m``,
    ``3d 4h``; the second unit only when it is not zero (``2h``, ``7d``)."""
    return _spelled(seconds, "", ("ms", "s", "m", "h", "d", "d"))


def _spelled(seconds: float, gap: str, units: tuple[str, str, str, str, str, str]) -> str:
    """``seconds`` in at most two units (``units``: ms, s, min, h, one day, days), each number
    and its unit apart by ``gap``."""
    ms, s, mins, hrs, day, days = units
    if seconds < 0.9995:
        return f"{round(max(0.0, seconds) * 1000)}{gap}{ms}"
    if seconds < 9.95:
        return f"{seconds:.1f}".removesuffix(".0") + gap + s
    minutes, secs = divmod(round(seconds), 60)
    if minutes == 0:
        return f"{secs}{gap}{s}"
    if minutes < 60:
        return _two(gap, minutes, mins, secs, s)
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return _two(gap, hours, hrs, minutes, mins)
    whole, hours = divmod(hours, 24)
    return _two(gap, whole, day if whole == 1 else days, hours, hrs)


def _two(gap: str, big: int, big_unit: str, small: int, small_unit: str) -> str:
    return f"{big}{gap}{big_unit}" + (f" {small}{gap}{small_unit}" if small else "")
