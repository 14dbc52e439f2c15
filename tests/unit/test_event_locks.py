"""The locks that keep an event's send and a wait for it from missing each other: a send and
a wait that could match share one; sends never share an exclusive one."""

from __future__ import annotations

from stepline_server.engine import event_locks

P = "0b6f1c6e-0000-4000-8000-000000000001"


def test_a_send_and_a_wait_that_could_match_share_a_field_lock() -> None:
    sent = event_locks.send_locks(P, "order.paid", {"order": 7, "amount": 3})
    [wait] = event_locks.wait_locks(P, [("order.paid", {"order": 7})])
    assert not sent.exclusive and not wait.exclusive
    assert wait.fields_exclusive and not sent.fields_exclusive
    assert set(wait.fields) <= set(sent.fields)


def test_numbers_equal_in_json_share_a_lock_and_other_values_do_not() -> None:
    key = event_locks.field_key
    assert key(P, "e", "n", 1) == key(P, "e", "n", 1.0)
    assert key(P, "e", "n", 10**30) == key(P, "e", "n", 1e30)
    assert key(P, "e", "n", 1) != key(P, "e", "n", 2)
    assert key(P, "e", "n", True) != key(P, "e", "n", 1)
    assert key(P, "e", "n", "1") != key(P, "e", "n", 1)
    assert key(P, "e", "n", None) != key(P, "e", "n", "null")
    assert key(P, "e", "n", 1) != key(P, "other", "n", 1)
    assert key(P, "e", "n", 1) != key(P, "e", "m", 1)
    # Nested values lock by kind: equal ones always share.
    assert key(P, "e", "n", {"a": 1}) == key(P, "e", "n", {"a": 1.0})
    assert key(P, "e", "n", [1]) == key(P, "e", "n", [2])


def test_a_wait_with_no_match_fields_locks_its_name_exclusive() -> None:
    for match in (None, {}, [1]):
        [locks] = event_locks.wait_locks(P, [("e", match)])
        assert locks.exclusive and locks.fields == ()


def test_data_with_many_fields_locks_the_name_exclusive() -> None:
    many = {f"f{i}": i for i in range(event_locks.MAX_FIELD_LOCKS + 1)}
    assert event_locks.send_locks(P, "e", many).exclusive
    few = {f"f{i}": i for i in range(event_locks.MAX_FIELD_LOCKS)}
    locks = event_locks.send_locks(P, "e", few)
    assert not locks.exclusive and len(locks.fields) == event_locks.MAX_FIELD_LOCKS


def test_data_of_another_kind_takes_only_the_name_shared() -> None:
    locks = event_locks.send_locks(P, "e", 7)
    assert not locks.exclusive and locks.fields == ()


def test_a_plan_locks_name_by_name_each_fields_in_key_order() -> None:
    locks = event_locks.wait_locks(
        P, [("b", {"k": 2}), ("a", {"y": 1, "x": 5}), ("a", {"k": 3}), ("b", None)]
    )
    assert [lock.name for lock in locks] == ["a", "b"]
    a, b = locks
    assert a.fields == tuple(sorted(a.fields)) and len(a.fields) == 2
    # The first match field by name: "x" of {"y": 1, "x": 5}.
    assert event_locks.field_key(P, "a", "x", 5) in a.fields
    assert b.exclusive and b.fields == ()
