"""Time-ordered ids: UUIDv7 for new rows, derived UUIDv8 that keep their source's time, the
old UUIDv5 derivation for sources made before, and the ids run keys name."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from stepline_server.engine import ids
from stepline_server.engine.steps import callback_id, child_run_id

_NS = uuid.UUID("6f1f3c1e-3b1a-4d5e-9f51-5a3d1f0b7c42")


def test_new_ids_are_uuid7_ordered_by_time() -> None:
    earlier, later = ids.new_id(1_700_000_000_000), ids.new_id(1_700_000_000_001)
    assert earlier.version == 7 and earlier.variant == uuid.RFC_4122
    assert earlier < later and str(earlier) < str(later)
    assert ids.time_prefix(earlier) == 1_700_000_000_000
    assert ids.new_id(5) != ids.new_id(5)  # random below the millisecond


def test_ids_made_in_order_sort_in_order() -> None:
    made = [ids.new_id(1_700_000_000_000 + i) for i in range(100)]
    assert sorted(made) == made


def test_a_derived_id_keeps_its_sources_time_and_is_stable() -> None:
    run = ids.new_id(1_700_000_123_456)
    child = uuid.UUID(child_run_id(str(run), "charge"))
    assert child == uuid.UUID(child_run_id(str(run), "charge"))
    assert child.version == 8 and ids.is_time_ordered(child)
    assert ids.time_prefix(child) == 1_700_000_123_456
    assert child != uuid.UUID(child_run_id(str(run), "refund"))
    assert uuid.UUID(callback_id(str(run), "charge")) not in (child, run)


def test_ids_derived_from_older_random_ids_keep_the_old_derivation() -> None:
    """A run made before time-ordered ids derives the children and callbacks it derived then,
    so replaying it after an upgrade starts no second child."""
    old = uuid.UUID("0b0c6d52-5d1e-4c7a-9c51-2a9a0d3e4f11")
    assert old.version == 4
    assert child_run_id(str(old), "s") == str(uuid.uuid5(_NS, f"child:{old}:s"))
    assert callback_id(str(old), "s") == str(uuid.uuid5(_NS, f"callback:{old}:s"))


def test_an_id_derived_from_an_instant_orders_by_it() -> None:
    at = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    a = ids.derived_id(at, "tick", _NS)
    assert a == ids.derived_id(at, "tick", _NS)
    assert ids.time_prefix(a) == int(at.timestamp() * 1000)


def test_a_run_key_names_one_id_per_environment() -> None:
    """The id of a keyed run is the key's in its environment: the same on every call, another
    for another key or environment, a UUIDv5 (not time-ordered)."""
    env, other = uuid.uuid4(), uuid.uuid4()
    one = ids.run_key_id(env, "order-1")
    assert one == ids.run_key_id(env, "order-1")
    assert one.version == 5 and not ids.is_time_ordered(one)
    assert len({one, ids.run_key_id(env, "order-2"), ids.run_key_id(other, "order-1")}) == 3
