"""The alerts' outbox in the store: notifications recorded by the statement that caused them,
once per alert, run and type, and claimed for delivery by one orchestrator at a time."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from stepline_server.engine.runs import RunStatus
from stepline_server.store import alerts, apps, db, keys, outcomes, runs

ENV = keys.DEFAULT_PROJECT


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[db.Conn]:
    c = await db.connect(database_url)
    await keys.bootstrap(c)
    app = await apps.create(c, ENV, "a", "http://127.0.0.1:9/", "s")
    await apps.record_sync(c, app, [("wf", {}), ("other", {})], None)
    try:
        yield c
    finally:
        await c.close()


async def _run(conn: db.Conn, workflow: str = "wf") -> uuid.UUID:
    run_id = uuid.uuid4()
    await runs.insert(conn, runs.NewRun(run_id, ENV, workflow, None))
    return run_id


async def _alert(conn: db.Conn, types: list[str], workflow: str | None = None) -> db.Record:
    url = "http://127.0.0.1:9/hook"
    return await alerts.create(conn, ENV, "ops", types, workflow, "webhook", url)


async def _notifications(conn: db.Conn) -> list[tuple[uuid.UUID, str, uuid.UUID | None]]:
    rows = await conn.fetch("SELECT alert_id, type, run_id FROM alert_notifications")
    return sorted((r["alert_id"], r["type"], r["run_id"]) for r in rows)


async def test_record_run_stuck_once_per_alert_and_run(conn: db.Conn) -> None:
    """The repair check's call records run.stuck for each alert listening for it and of the
    run's workflow, and a second call for the same run records nothing more."""
    every = await _alert(conn, ["run.stuck"])
    mine = await _alert(conn, ["run.failed", "run.stuck"], workflow="wf")
    await _alert(conn, ["run.stuck"], workflow="other")
    await _alert(conn, ["run.failed"])
    run_id = await _run(conn)
    assert await alerts.record_run_stuck(conn, ENV, run_id) == 2
    assert await alerts.record_run_stuck(conn, ENV, run_id) == 0
    assert await _notifications(conn) == sorted(
        [(every["id"], "run.stuck", run_id), (mine["id"], "run.stuck", run_id)]
    )
    other_env = uuid.uuid4()
    assert await alerts.record_run_stuck(conn, other_env, run_id) == 0


async def test_a_failed_run_and_its_alert_commit_together(conn: db.Conn, database_url: str) -> None:
    """end_runs records run.failed and app.unreachable in the run's own statement: while its
    transaction is open another connection sees neither the failure nor the notifications, a
    rollback keeps neither, and a commit both."""
    failed = await _alert(conn, ["run.failed", "app.unreachable"])
    timed = await _alert(conn, ["run.timedOut"])
    run_id = await _run(conn)
    error = {"code": "app_unreachable", "message": "the app could not be reached"}
    end = outcomes.End(run_id, None, RunStatus.FAILED, None, error)
    other = await db.connect(database_url)
    try:
        tx = conn.transaction()
        await tx.start()
        assert await outcomes.end_runs(conn, [end]) == {run_id}
        assert len(await _notifications(conn)) == 2
        assert await _notifications(other) == []
        assert await other.fetchval("SELECT status FROM runs WHERE id = $1", run_id) == "running"
        await tx.rollback()
        assert await _notifications(other) == []
        async with conn.transaction():
            await outcomes.end_runs(conn, [end])
        assert await _notifications(other) == sorted(
            [(failed["id"], "run.failed", run_id), (failed["id"], "app.unreachable", run_id)]
        )
        data = await other.fetchval("SELECT data FROM alert_notifications LIMIT 1")
        assert data == {"workflow": "wf", "status": "failed", "error": error}
    finally:
        await other.close()
    timed_out = await _run(conn)
    async with conn.transaction():
        await outcomes.end_runs(conn, [outcomes.End(timed_out, None, RunStatus.TIMED_OUT)])
    assert (timed["id"], "run.timedOut", timed_out) in await _notifications(conn)
    completed = await _run(conn)
    async with conn.transaction():
        await outcomes.end_runs(conn, [outcomes.End(completed, None, RunStatus.COMPLETED)])
    assert all(run != completed for _, _, run in await _notifications(conn))


async def test_a_claimed_notification_is_skipped_by_another_orchestrator(
    conn: db.Conn, database_url: str
) -> None:
    """While one orchestrator's claim is uncommitted, another's claim skips that notification
    instead of waiting; once claimed (leased), it is not due again until the lease ends, and
    only the lease holder can record the attempt."""
    alert = await _alert(conn, ["run.stuck"])
    await alerts.record_run_stuck(conn, ENV, await _run(conn))
    other = await db.connect(database_url)
    try:
        tx = conn.transaction()
        await tx.start()
        mine = await alerts.claim(conn, 10, uuid.uuid4(), 30)
        assert [r["alert_id"] for r in mine] == [alert["id"]]
        assert await alerts.claim(other, 10, uuid.uuid4(), 30) == []
        await tx.commit()
        assert await alerts.claim(other, 10, uuid.uuid4(), 30) == []
        n = mine[0]
        assert not await alerts.record_attempt(
            other, n["id"], uuid.uuid4(), "delivered", 200, None, None
        )
        assert await alerts.record_attempt(conn, n["id"], n["lease_token"], "pending", 503, "x", 0)
        again = await alerts.claim(other, 10, uuid.uuid4(), 30)
        assert [r["id"] for r in again] == [n["id"]] and again[0]["attempts"] == 1
    finally:
        await other.close()


async def test_settled_notifications_go_after_the_retention_days(conn: db.Conn) -> None:
    """A delivered or failed notification older than the retention is deleted; a pending
    one, however old, and a recent delivered one are kept."""
    await _alert(conn, ["run.stuck"])
    for status in ("delivered", "failed", "pending", "recent"):
        run_id = await _run(conn)
        await alerts.record_run_stuck(conn, ENV, run_id)
        await conn.execute(
            "UPDATE alert_notifications SET status = $2, created_at = now() - $3::interval,"
            " delivered_at = CASE WHEN $2 = 'delivered' THEN now() END WHERE run_id = $1",
            run_id,
            "delivered" if status == "recent" else status,
            timedelta(days=1 if status == "recent" else 40),
        )
    assert await alerts.delete_old(conn, 30) == 2
    left = await conn.fetch("SELECT status FROM alert_notifications ORDER BY status")
    assert [r["status"] for r in left] == ["delivered", "pending"]
