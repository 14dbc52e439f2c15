"""The run transitions in the database: history is appended through append_run_events only,
numbered without gaps even when two transactions move one run at once."""

from __future__ import annotations

import asyncio
import re
import uuid
from pathlib import Path

import asyncpg

from stepline_server.store import apps, db, keys, runs

STORE = Path(__file__).resolve().parents[2] / "service" / "stepline_server" / "store"


async def _run(conn: db.Conn) -> uuid.UUID:
    await keys.bootstrap(conn)
    app = await apps.create(conn, keys.DEFAULT_PROJECT, "a", "http://127.0.0.1:9/", "s")
    await apps.record_sync(conn, app, [("wf", {})], None)
    run_id = uuid.uuid4()
    await runs.insert(conn, runs.NewRun(run_id, keys.DEFAULT_PROJECT, "wf", None))
    return run_id


def test_history_is_written_in_one_place() -> None:
    """Outside the migrations and schema.sql, no statement inserts into run_events or moves
    next_seq: every path appends through append_run_events."""
    for path in STORE.glob("*.sql"):
        if path.name == "schema.sql":
            continue
        text = path.read_text(encoding="utf-8")
        assert "INSERT INTO run_events" not in text, path.name
        assert not re.search(r"next_seq\s*=", text), path.name


async def test_two_transitions_of_one_run_number_its_history_without_gaps(
    database_url: str,
) -> None:
    """One transaction appends and stays open; a second appending to the same run waits for
    it, then numbers its events after the first's: seqs 1.. with no gap and no repeat."""
    conn = await db.connect(database_url)
    first = await asyncpg.connect(database_url)
    second = await asyncpg.connect(database_url)
    try:
        run_id = await _run(conn)
        project = keys.DEFAULT_PROJECT
        two = (
            '[{"type": "step.started", "step_name": "a"},'
            ' {"type": "step.completed", "step_name": "a"}]'
        )
        one = '[{"type": "run.cancelling"}]'
        tx = first.transaction()
        await tx.start()
        base_first = await first.fetchval(
            "SELECT append_run_events($1, $2, $3::jsonb)", run_id, project, two
        )
        waiting = asyncio.ensure_future(
            second.fetchval("SELECT append_run_events($1, $2, $3::jsonb)", run_id, project, one)
        )
        await asyncio.sleep(0.3)
        assert not waiting.done()  # the run's row is the first transaction's until it ends
        await tx.commit()
        base_second = await asyncio.wait_for(waiting, 10)
        assert (base_first, base_second) == (2, 4)
        rows = await conn.fetch(
            "SELECT seq, type::text FROM run_events WHERE run_id = $1 ORDER BY seq", run_id
        )
        assert [(r["seq"], r["type"]) for r in rows] == [
            (1, "run.started"),
            (2, "step.started"),
            (3, "step.completed"),
            (4, "run.cancelling"),
        ]
    finally:
        await first.close()
        await second.close()
        await conn.close()


async def test_a_type_outside_the_enum_is_refused(database_url: str) -> None:
    conn = await db.connect(database_url)
    try:
        run_id = await _run(conn)
        try:
            await conn.fetchval(
                'SELECT append_run_events($1, $2, \'[{"type": "run.exploded"}]\'::jsonb)',
                run_id,
                keys.DEFAULT_PROJECT,
            )
        except asyncpg.InvalidTextRepresentationError:
            pass
        else:
            raise AssertionError("an unknown event type was appended")
        assert await conn.fetchval("SELECT max(seq) FROM run_events WHERE run_id = $1", run_id) == 1
    finally:
        await conn.close()


async def test_wake_makes_a_run_due_with_what_woke_it_and_leaves_an_ended_run_alone(
    database_url: str,
) -> None:
    conn = await db.connect(database_url)
    try:
        run_id = await _run(conn)
        await conn.execute("UPDATE runs SET ready_at = NULL WHERE id = $1", run_id)
        woke = [{"type": "callback.completed", "step_name": "cb", "data": {"callbackId": "x"}}]
        assert await runs.wake(conn, run_id, woke, notify=False)
        row = await conn.fetchrow(
            "SELECT wake_seq, ready_at IS NOT NULL AS due FROM runs WHERE id = $1", run_id
        )
        assert (row["wake_seq"], row["due"]) == (1, True)
        await conn.execute(
            "UPDATE runs SET status = 'completed', ended_at = now(), ready_at = NULL WHERE id = $1",
            run_id,
        )
        assert not await runs.wake(conn, run_id, woke, notify=False)
        types = await conn.fetch(
            "SELECT type::text FROM run_events WHERE run_id = $1 ORDER BY seq", run_id
        )
        assert [r["type"] for r in types] == ["run.started", "callback.completed"]
    finally:
        await conn.close()
