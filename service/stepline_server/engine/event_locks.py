"""Which locks keep an event's send and the recording of a wait for it from missing each other.

An event and a wait committed at once would each miss the other (the send does not see the
uncommitted wait, the wait does not see the uncommitted event), so the two are serialised by
advisory locks held until their transactions end. Holding one lock per event name made every
send and wait of a name go one at a time; these rules let only those that could match each
other wait for each other:

- A wait with match fields takes its name's lock shared and, exclusive, the lock of one of
  its fields with its value (the first by name): an event it matches carries that field with
  that value.
- A wait with no match fields (it matches every event of its name) takes its name's lock
  exclusive.
- A send takes its name's lock shared and, shared, the lock of each of its data's top-level
  fields with its value; data with more than :data:`MAX_FIELD_LOCKS` fields takes its name's
  lock exclusive instead. Sends never wait for each other.

Locks are taken name by name (in name order), the name's first, then its fields' in key order,
so no two transactions wait for each other in a ring. A field's lock key is a hash of the
project, the name, the field and its value as JSON compares it (numbers by value: ``1`` and
``1.0`` are one), so two values that match always share a lock; two that do not may share one
by a collision, which only makes them wait.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MAX_FIELD_LOCKS", "NameLocks", "field_key", "send_locks", "wait_locks"]

MAX_FIELD_LOCKS = 32


@dataclass(frozen=True, slots=True)
class NameLocks:
    """The locks one transaction takes for event ``name``: the name's (exclusive or shared),
    then ``fields`` (lock keys, ascending; exclusive when ``fields_exclusive``)."""

    name: str
    exclusive: bool
    fields: tuple[int, ...] = field(default=())
    fields_exclusive: bool = False


def _value_text(value: Any) -> str:
    """``value`` as JSON equality sees it: equal JSON values give equal texts."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int | float):
        try:
            number = float(value)
        except OverflowError:
            return "number"  # past a double: all such numbers share one lock
        return "number" if not math.isfinite(number) else repr(number)
    if isinstance(value, str):
        return "string:" + value
    if isinstance(value, Mapping):
        return "object"  # nested values: one lock per field for all (coarse, never wrong)
    return "array"


def field_key(project_id: str, name: str, key: str, value: Any) -> int:
    """The lock key (a 32-bit integer) of field ``key`` holding ``value`` in an event ``name``
    of the project."""
    text = json.dumps([project_id, name, key, _value_text(value)])
    digest = hashlib.blake2b(text.encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big", signed=True)


def send_locks(project_id: str, name: str, data: Any) -> NameLocks:
    """The locks sending event ``name`` with ``data`` takes."""
    if isinstance(data, Mapping):
        if len(data) > MAX_FIELD_LOCKS:
            return NameLocks(name, exclusive=True)
        keys = {field_key(project_id, name, k, v) for k, v in data.items()}
        return NameLocks(name, exclusive=False, fields=tuple(sorted(keys)))
    # Data of any other kind matches only waits with no match fields, which lock the name.
    return NameLocks(name, exclusive=False)


def wait_locks(project_id: str, waits: Iterable[tuple[str, Any]]) -> list[NameLocks]:
    """The locks recording ``waits`` (each an event name and its match fields) takes, name by
    name in name order."""
    matches: dict[str, list[Any]] = {}
    for name, match in waits:
        matches.setdefault(name, []).append(match)
    locks = []
    for name in sorted(matches):
        keys: set[int] = set()
        exclusive = False
        for match in matches[name]:
            if not isinstance(match, Mapping) or not match:
                exclusive = True  # matches every event of the name
                continue
            first = min(match)
            keys.add(field_key(project_id, name, first, match[first]))
        if exclusive:
            locks.append(NameLocks(name, exclusive=True))
        else:
            locks.append(NameLocks(name, False, tuple(sorted(keys)), fields_exclusive=True))
    return locks
