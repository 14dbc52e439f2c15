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
    """Outside the migrations and schema.sql, no statement inserts into run_events: every path
    appends through append_run_events."""
    for path in STORE.glob("*.sql"):
        if path.name == "schema.sql":
            continue
        text = path.read_text(encoding="utf-8")
        assert "INSERT INTO run_events" not in text, path.name


def test_runs_are_updated_only_by_transition_functions() -> None:
    """Outside the migrations and schema.sql (where the transition functions are), and the
    functions the Citus layout makes (citus_claim_functions: their counterparts on Citus only),
    no store statement updates runs: each goes through a transition function."""
    found: dict[str, int] = {}
    for name, sql in db.Q.items():
        if name == "citus_claim_functions":
            continue
        n = len(re.findall(r"\bUPDATE\s+runs\b", sql))
        if n:
            found[name] = n
    assert found == {}


async def _leased(conn: db.Conn, run_id: uuid.UUID) -> str:
    token = await conn.fetchval(
        "SELECT lease_token FROM lease_runs(ARRAY[$1]::uuid[], 'o', 30, NULL, true)", run_id
    )
    assert token is not None
    return str(token)


async def test_a_transition_makes_one_row_version_of_its_run(database_url: str) -> None:
    """Appending history does not update the run's row: a wake (its update and its event)
    makes one row version of runs, an append alone none."""
    conn = await db.connect(database_url)
    try:
        run_id = await _run(conn)
        updates = "SELECT n_tup_upd FROM pg_stat_xact_user_tables WHERE relname = 'runs'"
        project = keys.DEFAULT_PROJECT
        async with conn.transaction():
            # (The backend's counts not yet reported include earlier transactions': within one
            # transaction, the difference is its own.)
            before = await conn.fetchval(updates)
            await conn.fetchval(
                """SELECT append_run_events($1, $2, '[{"type": "run.cancelling"}]')""",
                run_id,
                project,
            )
            assert await conn.fetchval(updates) == before
            woke = [{"type": "event.received", "step_name": "e"}]
            assert await conn.fetchval("SELECT run_wake($1, $2, $3::jsonb)", run_id, project, woke)
            assert await conn.fetchval(updates) == before + 1
    finally:
        await conn.close()


async def test_a_stale_lease_token_moves_nothing(database_url: str) -> None:
    """The functions fenced by a lease token (keep, continue, suspend, release) change nothing
    for a token that no longer holds the run."""
    conn = await db.connect(database_url)
    try:
        run_id = await _run(conn)
        project = keys.DEFAULT_PROJECT
        await _leased(conn, run_id)
        before = await conn.fetchrow("SELECT * FROM runs WHERE id = $1", run_id)
        calls = [
            ("SELECT run_keep_lease($1, $2, 'stale', 60)", None),
            ("SELECT count(*) FROM run_continue($1, $2, 'stale', '{}')", 0),
            ("SELECT run_suspend($1, $2, 'stale', true)", False),
            ("SELECT run_release($1, $2, 'stale', 1000)", None),
        ]
        for sql, answer in calls:
            assert await conn.fetchval(sql, run_id, project) == answer, sql
        assert await conn.fetchrow("SELECT * FROM runs WHERE id = $1", run_id) == before
    finally:
        await conn.close()


async def test_a_heartbeat_waiting_for_a_new_lease_keeps_nothing(database_url: str) -> None:
    """A heartbeat with the old token that waits while another transaction takes the run
    over (a new lease) extends nothing once that transaction commits."""
    conn = await db.connect(database_url)
    first = await asyncpg.connect(database_url)
    second = await asyncpg.connect(database_url)
    try:
        run_id = await _run(conn)
        project = keys.DEFAULT_PROJECT
        old = await _leased(conn, run_id)
        await conn.execute("UPDATE runs SET ready_at = now() WHERE id = $1", run_id)
        tx = first.transaction()
        await tx.start()
        new = await first.fetchval(
            "SELECT lease_token FROM lease_runs(ARRAY[$1]::uuid[], 'p', 30, NULL, true)", run_id
        )
        assert new is not None and new != old
        beat = asyncio.ensure_future(
            second.fetchval("SELECT run_keep_lease($1, $2, $3, 600)", run_id, project, old)
        )
        await asyncio.sleep(0.3)
        assert not beat.done()
        await tx.commit()
        assert await asyncio.wait_for(beat, 10) is None
        row = await conn.fetchrow("SELECT lease_token, ready_at FROM runs WHERE id = $1", run_id)
        assert row["lease_token"] == new
        assert await conn.fetchval("SELECT $1 < now() + interval '60 seconds'", row["ready_at"])
    finally:
        await first.close()
        await second.close()
        await conn.close()


async def test_the_other_transitions_leave_a_run_they_do_not_apply_to(database_url: str) -> None:
    """Each transition checks the run's state under its lock: an ended run is not cancelled,
    resumed, moved or repaired; a run already leased neither gathers input nor fires; a run
    not held is not released; a run is moved only to a deployment of its app."""
    conn = await db.connect(database_url)
    try:
        run_id = await _run(conn)
        project = keys.DEFAULT_PROJECT
        other_app = await apps.create(conn, project, "b", "http://127.0.0.1:9/", "s")
        foreign = await conn.fetchval(
            "SELECT id FROM deployments WHERE app_id = $1", other_app["id"]
        )
        assert foreign is not None
        assert not await conn.fetchval("SELECT run_move($1, $2, $3)", run_id, project, foreign)
        assert not await conn.fetchval("SELECT run_unhold($1, $2)", run_id, project)
        assert not await conn.fetchval("SELECT run_resume($1, $2)", run_id, project)
        await _leased(conn, run_id)
        assert not await conn.fetchval(
            "SELECT run_gather_input($1, $2, '{}', false)", run_id, project
        )
        assert not await conn.fetchval("SELECT run_fire($1, $2, '[]')", run_id, project)
        assert not await conn.fetchval("SELECT run_request_cancel($1, $2)", run_id, uuid.uuid4())
        await conn.execute(
            "UPDATE runs SET status = 'completed', ended_at = now(), ready_at = NULL,"
            " lease_token = NULL WHERE id = $1",
            run_id,
        )
        before = await conn.fetchrow("SELECT * FROM runs WHERE id = $1", run_id)
        own = await conn.fetchval(
            "SELECT d.id FROM deployments d JOIN runs r ON r.app_id = d.app_id WHERE r.id = $1",
            run_id,
        )
        assert own is not None
        assert not await conn.fetchval("SELECT run_request_cancel($1, $2)", run_id, project)
        assert not await conn.fetchval("SELECT run_move($1, $2, $3)", run_id, project, own)
        assert not await conn.fetchval("SELECT run_repair($1, $2, 'x')", run_id, project)
        assert await conn.fetchrow("SELECT * FROM runs WHERE id = $1", run_id) == before
        assert (
            await conn.fetchval(
                "SELECT count(*) FROM run_events WHERE run_id = $1 AND type = 'run.repaired'",
                run_id,
            )
            == 0
        )
    finally:
        await conn.close()


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


async def _invoked(conn: db.Conn) -> tuple[uuid.UUID, str, uuid.UUID, int]:
    """A run leased to an invocation: its id, lease token, invocation id and events so far."""
    run_id = await _run(conn)
    token = await _leased(conn, run_id)
    invocation = await conn.fetchval("SELECT invocation_id FROM runs WHERE id = $1", run_id)
    events = await conn.fetchval("SELECT count(*) FROM run_events WHERE run_id = $1", run_id)
    return run_id, token, invocation, events


_PROGRESS = (
    "SELECT applied, cancel_requested FROM run_progress($1, $2, $3, $4,"
    ' \'[{"type": "step.completed", "step_name": "a"}]\', $5, $6, 0,'
    ' \'[{"ord": 1, "name": "a", "kind": "run", "status": "completed", "attempt": 1,'
    ' "output": 1}]\','
    " NULL, NULL, 100, 100000)"
)


async def test_progress_is_fenced_by_the_lease_and_replays_once(database_url: str) -> None:
    """run_progress writes for the invocation holding the lease only (updating the run's row
    once); the same call again
    (same seq and digest) answers applied = false and writes nothing; the same seq with another
    digest (a second execution) answers no row."""
    conn = await db.connect(database_url)
    try:
        run_id, token, invocation, events = await _invoked(conn)
        project = keys.DEFAULT_PROJECT
        count = "SELECT count(*) FROM run_events WHERE run_id = $1"
        assert await conn.fetch(_PROGRESS, run_id, project, "stale", invocation, 1, "d") == []
        assert await conn.fetch(_PROGRESS, run_id, project, token, uuid.uuid4(), 1, "d") == []
        assert await conn.fetchval(count, run_id) == events
        updates = "SELECT n_tup_upd FROM pg_stat_xact_user_tables WHERE relname = 'runs'"
        async with conn.transaction():
            before = await conn.fetchval(updates)
            first = await conn.fetchrow(_PROGRESS, run_id, project, token, invocation, 1, "d")
            assert await conn.fetchval(updates) == before + 1  # one row version of the run
        assert first is not None and first["applied"] is True
        assert await conn.fetchval(count, run_id) == events + 1
        again = await conn.fetchrow(_PROGRESS, run_id, project, token, invocation, 1, "d")
        assert again is not None and again["applied"] is False
        assert await conn.fetch(_PROGRESS, run_id, project, token, invocation, 1, "other") == []
        assert await conn.fetchval(count, run_id) == events + 1
        position = await conn.fetchval(
            "SELECT position FROM steps WHERE run_id = $1 AND name = 'a'", run_id
        )
        assert position == events + 1
    finally:
        await conn.close()


async def _blocked(database_url: str, conn: db.Conn, task: asyncio.Future[object]) -> None:
    """Waits until ``conn``'s backend waits for a lock (read from pg_stat_activity on a
    connection of its own, not guessed from timing); fails when ``task`` ended first."""
    pid = conn.get_server_pid()
    watcher = await db.connect(database_url)
    try:
        for _ in range(1000):
            assert not task.done(), "the call did not wait for the transaction holding the run"
            state = await watcher.fetchval(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", pid
            )
            if state == "Lock":
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the second connection neither blocked nor finished")
    finally:
        await watcher.close()


async def test_progress_waiting_on_another_transaction_sees_what_it_committed(
    database_url: str,
) -> None:
    """run_progress fences, checks for a replay and updates in one statement: when another
    transaction holds the run's row, it waits, and then judges the row as that one left it. A
    cancel requested meanwhile is answered; the same call sent twice at once is applied once
    (the second answers applied = false); a line of log written with it is numbered after the
    first's."""
    first = await db.connect(database_url)
    second = await db.connect(database_url)
    try:
        run_id, token, invocation, events = await _invoked(first)
        project = keys.DEFAULT_PROJECT
        count = "SELECT count(*) FROM run_events WHERE run_id = $1"

        # A cancel request held open: the progress waits for it and answers it.
        hold = first.transaction()
        await hold.start()
        assert await first.fetchval("SELECT run_request_cancel($1, $2)", run_id, project)
        waiting = asyncio.ensure_future(
            second.fetchrow(_PROGRESS, run_id, project, token, invocation, 1, "d")
        )
        await _blocked(database_url, second, waiting)
        await hold.commit()
        answer = await waiting
        assert answer is not None and answer["applied"] is True
        assert answer["cancel_requested"] is True

        # The same call twice at once: the second waits for the first and writes nothing.
        hold = first.transaction()
        await hold.start()
        applied = await first.fetchrow(_PROGRESS, run_id, project, token, invocation, 2, "e")
        assert applied is not None and applied["applied"] is True
        waiting = asyncio.ensure_future(
            second.fetchrow(_PROGRESS, run_id, project, token, invocation, 2, "e")
        )
        await _blocked(database_url, second, waiting)
        await hold.commit()
        again = await waiting
        assert again is not None and again["applied"] is False
        assert await first.fetchval(count, run_id) == events + 2
        assert await first.fetchval("SELECT progress_seq FROM runs WHERE id = $1", run_id) == 2

        # Log lines: each call's lines follow what the run's log holds when it writes.
        logs = (
            "SELECT applied FROM run_progress($1, $2, $3, $4, '[]', $5, $6, 0, NULL, NULL,"
            ' \'[{"ord": 1, "at": "2026-01-01T00:00:00Z", "level": "info", "message": "m",'
            ' "size": 10}]\', 100, 100000)'
        )
        hold = first.transaction()
        await hold.start()
        assert await first.fetchval(logs, run_id, project, token, invocation, 3, "f")
        waiting = asyncio.ensure_future(
            second.fetchval(logs, run_id, project, token, invocation, 4, "g")
        )
        await _blocked(database_url, second, waiting)
        await hold.commit()
        assert await waiting is True
        lines = await first.fetch("SELECT seq FROM run_logs WHERE run_id = $1 ORDER BY seq", run_id)
        assert [r["seq"] for r in lines] == [1, 2]
        row = await first.fetchrow("SELECT log_lines, log_bytes FROM runs WHERE id = $1", run_id)
        assert (row["log_lines"], row["log_bytes"]) == (2, 20)
    finally:
        await first.close()
        await second.close()


async def test_an_end_with_a_stale_token_waiting_for_a_new_lease_ends_nothing(
    database_url: str,
) -> None:
    """run_end with the token of a lease another transaction is replacing waits for it, then
    ends nothing; without a token (a cancel, a time limit) it ends the run, once."""
    conn = await db.connect(database_url)
    first = await asyncpg.connect(database_url)
    second = await asyncpg.connect(database_url)
    end = (
        "SELECT status::text FROM run_end($1, $2, $3, 'completed', '1', NULL,"
        " 'run.completed', NULL)"
    )
    try:
        run_id = await _run(conn)
        project = keys.DEFAULT_PROJECT
        old = await _leased(conn, run_id)
        await conn.execute("UPDATE runs SET ready_at = now() WHERE id = $1", run_id)
        tx = first.transaction()
        await tx.start()
        assert await first.fetchval(
            "SELECT lease_token FROM lease_runs(ARRAY[$1]::uuid[], 'p', 30, NULL, true)", run_id
        )
        ending = asyncio.ensure_future(second.fetch(end, run_id, project, old))
        await asyncio.sleep(0.3)
        assert not ending.done()
        await tx.commit()
        assert await asyncio.wait_for(ending, 10) == []
        assert await conn.fetchval("SELECT status::text FROM runs WHERE id = $1", run_id) == (
            "running"
        )
        assert await conn.fetchval(end, run_id, project, None) == "completed"
        assert await conn.fetch(end, run_id, project, None) == []
        types = await conn.fetch(
            "SELECT type::text FROM run_events WHERE run_id = $1 ORDER BY seq", run_id
        )
        assert [r["type"] for r in types][-1] == "run.completed"
        assert sum(r["type"] == "run.completed" for r in types) == 1
    finally:
        await first.close()
        await second.close()
        await conn.close()


async def test_a_begin_is_fenced_and_makes_one_row_version(database_url: str) -> None:
    """run_begin with a stale token begins nothing (no row, no event); with the lease's token
    it records invocation.started, answers the run's (no) steps, and updates the run's row
    once."""
    conn = await db.connect(database_url)
    try:
        run_id = await _run(conn)
        project = keys.DEFAULT_PROJECT
        token = await _leased(conn, run_id)
        invocation = await conn.fetchval("SELECT invocation_id FROM runs WHERE id = $1", run_id)
        begin = "SELECT name, history_base FROM run_begin($1, $2, $3, $4, 1, true, 0, 1000, 'd')"
        count = "SELECT count(*) FROM run_events WHERE run_id = $1"
        events = await conn.fetchval(count, run_id)
        assert await conn.fetch(begin, run_id, project, "stale", invocation) == []
        assert await conn.fetchval(count, run_id) == events
        updates = "SELECT n_tup_upd FROM pg_stat_xact_user_tables WHERE relname = 'runs'"
        async with conn.transaction():
            before = await conn.fetchval(updates)
            rows = await conn.fetch(begin, run_id, project, token, invocation)
            assert [(r["name"], r["history_base"]) for r in rows] == [(None, None)]
            assert await conn.fetchval(updates) == before + 1
        last = await conn.fetchrow(
            "SELECT type::text, invocation_id FROM run_events WHERE run_id = $1"
            " ORDER BY seq DESC LIMIT 1",
            run_id,
        )
        assert (last["type"], last["invocation_id"]) == ("invocation.started", invocation)
    finally:
        await conn.close()
