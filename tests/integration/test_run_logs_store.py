"""The run log in the store: lines committed with progress (per run, once, fenced like the
steps) and the run's cap holding when two commits for one run race."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

from stepline.protocol import LogLine, StepUpdate
from stepline_server.engine import logs as run_logs
from stepline_server.engine.steps import plan_updates
from stepline_server.store import apps, claims, db, keys, progress, runs

P = keys.DEFAULT_PROJECT


async def _leased_runs(conn: db.Conn, n: int) -> list[tuple[uuid.UUID, str, uuid.UUID]]:
    await keys.bootstrap(conn)
    app = await apps.create(conn, P, "a", "http://127.0.0.1:9/", "s")
    await apps.record_sync(conn, app, [("wf", {})], None)
    for _ in range(n):
        await runs.insert(conn, runs.NewRun(uuid.uuid4(), P, "wf", None))
    claimed = await claims.claim(conn, "test", 60, n)
    return [(r["id"], r["lease_token"], r["invocation_id"]) for r in claimed]


def _lines(prefix: str, n: int) -> list[LogLine]:
    now = datetime.now(UTC)
    return [LogLine(at=now, level="info", message=f"{prefix}{i}") for i in range(n)]


def _item(
    lease: tuple[uuid.UUID, str, uuid.UUID], seq: int, lines: list[LogLine], name: str = "a"
) -> progress.Progress:
    run_id, token, inv = lease
    plan = plan_updates(str(run_id), [StepUpdate(name=name, kind="run", action="start")], lines)
    return progress.Progress(run_id, token, inv, plan, seq=seq)


async def _messages(conn: db.Conn, run_id: uuid.UUID) -> list[str]:
    return [r["message"] for r in await runs.logs(conn, P, run_id, 0, 2000)]


async def test_lines_commit_with_progress_per_run_once_and_fenced(database_url: str) -> None:
    """One statement commits two runs' lines, each numbered in its own run; a stale token
    writes none; a call sent again (its answer lost) does not write its lines twice."""
    conn = await db.connect(database_url)
    try:
        a, b, c = await _leased_runs(conn, 3)
        stale = (c[0], "stale", c[2])
        rows = await progress.apply_batch(
            conn,
            [
                _item(a, 1, _lines("a", 2)),
                _item(b, 1, _lines("b", 3)),
                _item(stale, 1, _lines("c", 1)),
            ],
        )
        assert set(rows) == {a[0], b[0]}
        assert await _messages(conn, a[0]) == ["a0", "a1"]
        assert await _messages(conn, b[0]) == ["b0", "b1", "b2"]
        assert await _messages(conn, c[0]) == []
        again = await progress.apply_batch(conn, [_item(a, 1, _lines("a", 2))])
        assert not again[a[0]]["applied"]
        assert await _messages(conn, a[0]) == ["a0", "a1"]
        seqs = [r["seq"] for r in await runs.logs(conn, P, b[0], 0, 10)]
        assert seqs == [1, 2, 3]
    finally:
        await conn.close()


async def test_the_cap_holds_when_two_commits_for_one_run_race(database_url: str) -> None:
    """A commit of 600 lines waits for another run's commit of 600 held open in a transaction
    (the run is locked), then sees its count: 1,000 lines are kept, 200 dropped, none twice."""
    first = await db.connect(database_url)
    second = await db.connect(database_url)
    try:
        [lease] = await _leased_runs(first, 1)
        run_id = lease[0]
        tx = first.transaction()
        await tx.start()
        await progress.apply_batch(first, [_item(lease, 1, _lines("x", 600), "a")])
        racing = asyncio.create_task(
            progress.apply_batch(second, [_item(lease, 2, _lines("y", 600), "b")])
        )
        pid = second.get_server_pid()
        for _ in range(500):  # until the second commit waits for the run's row lock
            waiting = await first.fetchval(
                "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", pid
            )
            if waiting:
                break
            await asyncio.sleep(0.01)
        assert waiting and not racing.done()
        await tx.commit()
        assert run_id in await racing
        kept = await _messages(first, run_id)
        assert len(kept) == run_logs.MAX_LINES
        assert kept[:600] == [f"x{i}" for i in range(600)]
        assert kept[600:] == [f"y{i}" for i in range(400)]
        row = await runs.get(first, P, run_id)
        assert (row["log_lines"], row["logs_dropped"]) == (1000, 200)
    finally:
        await first.close()
        await second.close()
