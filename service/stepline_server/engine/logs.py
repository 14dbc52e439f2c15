"""Run log rules: what a line the SDK sent weighs against the run's cap, as the store keeps it.

A run keeps at most ``MAX_LINES`` lines and ``MAX_BYTES`` of them (each line's message in UTF-8
plus its fields as JSON). The store applies the cap in the statement that commits the lines,
with the run locked: lines are kept in order until the first that does not fit; from then on
none is kept, and each line not kept is counted on the run (``logsDropped``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from stepline.protocol import MAX_RUN_LOG_BYTES, MAX_RUN_LOG_LINES, LogLine

MAX_LINES = MAX_RUN_LOG_LINES
MAX_BYTES = MAX_RUN_LOG_BYTES


def line_size(message: str, fields: Any) -> int:
    """What a line counts against the run's byte cap."""
    size = len(message.encode("utf-8", "surrogatepass"))
    if fields is not None:
        size += len(orjson.dumps(fields))
    return size


def rows(lines: Iterable[LogLine]) -> list[dict[str, Any]]:
    """The lines as the store's JSON records, in order (``ord`` from 1), each with its size."""
    return [
        {
            "ord": n,
            "at": line.at.isoformat(),
            "level": line.level.value,
            "message": line.message,
            "fields": line.fields,
            "step_name": line.step_name,
            "size": line_size(line.message, line.fields),
        }
        for n, line in enumerate(lines, 1)
    ]


def kept(lines_so_far: int, bytes_so_far: int, dropped_so_far: int, sizes: list[int]) -> int:
    """How many of new lines of ``sizes`` a run keeps (the first ones): the rule the store's
    statement applies, stated once here for tests and readers."""
    if dropped_so_far:
        return 0
    total = bytes_so_far
    for n, size in enumerate(sizes):
        total += size
        if lines_so_far + n + 1 > MAX_LINES or total > MAX_BYTES:
            return n
    return len(sizes)
