"""Singleton keys held in ``run_singletons`` (``take_singleton``): one run not ended per key,
on plain PostgreSQL and on Citus (with ``STEPLINE_TEST_CITUS``), where the unique index on the
runs cannot enforce it. Races are two connections with a transaction held open."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from stepline_server.store import apps, db, keys, runs, waits
from stepline_server.store.db import Q

P = keys.DEFAULT_PROJECT


async def _setup(conn: db.Conn) -> None:
    await keys.bootstrap(conn)
    app = await apps.create(conn, P, "app", "http://127.0.0.1:9/", "s")
    assert app is not None
    await apps.record_sync(conn, app, [("sync", {"singletonKey": "user"}), ("free", {})], None)


def _new(workflow: str, value: Any) -> runs.NewRun:
    return runs.NewRun(uuid.uuid4(), P, workflow, value)


async def _end(conn: db.Conn, run_id: uuid.UUID) -> None:
    await conn.execute(
        "UPDATE runs SET status = 'completed', ended_at = now(), ready_at = NULL WHERE id = $1",
        run_id,
    )


async def test_a_key_is_held_by_one_run_until_it_ends(database_url: str) -> None:
    """A second start with the key inserts nothing while the first has not ended; another key,
    input that is not an object and a workflow without a singleton key are free; once the
    holder ends the next start takes the key."""
    conn = await db.connect(database_url)
    try:
        await _setup(conn)
        first = _new("sync", {"user": "ada"})
        assert await runs.insert(conn, first, notify=False) is not None
        assert await runs.insert(conn, _new("sync", {"user": "ada"}), notify=False) is None
        assert await runs.insert(conn, _new("sync", {"user": "bob"}), notify=False) is not None
        assert await runs.insert(conn, _new("sync", ["not", "an", "object"]), notify=False)
        assert await runs.insert(conn, _new("free", {"user": "ada"}), notify=False) is not None
        active = await runs.active_singleton(conn, P, "sync", {"user": "ada"}, "user")
        assert active is not None and active["id"] == first.id

        await _end(conn, first.id)
        second = _new("sync", {"user": "ada"})
        assert await runs.insert(conn, second, notify=False) is not None
        holders = await conn.fetch("SELECT run_id FROM run_singletons")
        assert second.id in {r["run_id"] for r in holders}
        assert first.id not in {r["run_id"] for r in holders}
    finally:
        await conn.close()


async def test_a_retry_takes_the_key_back_only_when_it_is_free(database_url: str) -> None:
    """A retried run takes its key again when no other run holds it, and is refused (the
    holder named) while one does."""
    conn = await db.connect(database_url)
    try:
        await _setup(conn)
        first = _new("sync", {"user": "ada"})
        assert await runs.insert(conn, first, notify=False) is not None
        await _end(conn, first.id)
        second = _new("sync", {"user": "ada"})
        assert await runs.insert(conn, second, notify=False) is not None
        assert await conn.fetchval(Q["take_run_singleton"], first.id) == second.id
        await _end(conn, second.id)
        assert await conn.fetchval(Q["take_run_singleton"], first.id) is None
        # The key is the first run's again: a new start now meets it while it has not ended.
        await conn.execute(
            "UPDATE runs SET status = 'running', ended_at = NULL WHERE id = $1", first.id
        )
        assert await runs.insert(conn, _new("sync", {"user": "ada"}), notify=False) is None
    finally:
        await conn.close()


async def _first_holds_second_waits(a: db.Conn, b: db.Conn) -> tuple[Any, Any, Any, Any]:
    """Start a run with key "ada" on ``a`` in a transaction left open, then another on ``b``:
    the two runs, ``a``'s transaction and the second start, still waiting for the key."""
    await _setup(a)
    one, two = _new("sync", {"user": "ada"}), _new("sync", {"user": "ada"})
    tx = a.transaction()
    await tx.start()
    assert await runs.insert(a, one, notify=False) is not None
    second = asyncio.create_task(runs.insert(b, two, notify=False))
    done, _ = await asyncio.wait({second}, timeout=1.0)
    assert not done, "the second start must wait for the first's transaction"
    return one, two, tx, second


async def test_two_starts_at_once_make_one_run(database_url: str) -> None:
    """Two starts of one key in two transactions: the second waits on the first's key row and,
    once the first commits, creates nothing (the first run holds the key)."""
    a = await db.connect(database_url)
    b = await db.connect(database_url)
    try:
        one, _, tx, second = await _first_holds_second_waits(a, b)
        await tx.commit()
        assert await second is None
        rows = await a.fetch("SELECT id FROM runs WHERE workflow = 'sync'")
        assert [r["id"] for r in rows] == [one.id]
    finally:
        await a.close()
        await b.close()


async def test_a_start_after_the_first_rolled_back_takes_the_key(database_url: str) -> None:
    """A start whose transaction rolls back leaves the key free: the one waiting behind it
    creates its run."""
    a = await db.connect(database_url)
    b = await db.connect(database_url)
    try:
        _, two, tx, second = await _first_holds_second_waits(a, b)
        await tx.rollback()
        assert await second is not None
        rows = await a.fetch("SELECT id FROM runs WHERE workflow = 'sync'")
        assert [r["id"] for r in rows] == [two.id]
    finally:
        await a.close()
        await b.close()


async def test_retention_deletes_a_keys_row_with_the_run_that_holds_it(database_url: str) -> None:
    """Runs ended past the retention go with the keys they held last; a key taken since by a
    newer run stays that run's, and still holds the next start back."""
    conn = await db.connect(database_url)
    try:
        await _setup(conn)
        ada, bob = _new("sync", {"user": "ada"}), _new("sync", {"user": "bob"})
        for run in (ada, bob):
            assert await runs.insert(conn, run, notify=False) is not None
            await _end(conn, run.id)
        newer = _new("sync", {"user": "ada"})
        assert await runs.insert(conn, newer, notify=False) is not None
        await conn.execute(
            "UPDATE runs SET ended_at = now() - interval '40 days' WHERE id = ANY ($1::uuid[])",
            [ada.id, bob.id],
        )
        assert await waits.delete_old_runs(conn, 30 * 86_400.0) == 2
        holders = [r["run_id"] for r in await conn.fetch("SELECT run_id FROM run_singletons")]
        assert holders == [newer.id]
        assert await runs.insert(conn, _new("sync", {"user": "ada"}), notify=False) is None
        assert await runs.insert(conn, _new("sync", {"user": "bob"}), notify=False) is not None
    finally:
        await conn.close()
