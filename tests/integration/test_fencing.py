"""Fencing: only the invocation holding a run's lease writes, begins or repeats a call."""

from __future__ import annotations

import uuid

from stepline.protocol import Action, StepKind, StepUpdate
from stepline_server.engine.steps import plan_updates
from stepline_server.store import claims, db, keys, progress, runs
from tests.integration.test_races import leased_run

PROJECT = keys.DEFAULT_PROJECT


def complete(item: progress.Progress, output: object, seq: int, digest: str) -> progress.Progress:
    update = StepUpdate(name="a", kind=StepKind.RUN, action=Action.COMPLETE, output=output)
    plan = plan_updates(str(item.run_id), [update])
    return progress.Progress(
        item.run_id, item.token, item.invocation_id, plan, seq=seq, digest=digest
    )


async def history(conn: db.Conn, run_id: uuid.UUID) -> list[str]:
    return [e["type"] for e in await runs.events(conn, PROJECT, run_id, 0, 100)]


async def test_a_repeated_seq_with_another_body_is_refused(database_url: str) -> None:
    """A second execution of one invocation (same token) repeating a seq with a different
    result is refused, so it stops; the same call sent again is answered and not re-applied."""
    conn = await db.connect(database_url)
    try:
        item = await leased_run(conn)
        first = complete(item, 1, seq=1, digest="d1")
        assert (await progress.apply_batch(conn, [first]))[item.run_id]["applied"]
        again = await progress.apply_batch(conn, [first])
        assert not again[item.run_id]["applied"]
        other = complete(item, 2, seq=1, digest="d2")
        assert await progress.apply_batch(conn, [other]) == {}
        [step] = await runs.steps(conn, item.run_id)
        assert step["output"] == 1
        assert (await history(conn, item.run_id)).count("step.completed") == 1
    finally:
        await conn.close()


async def test_a_call_for_another_invocation_of_the_run_is_refused(database_url: str) -> None:
    """A progress call whose path names another invocation than the one holding the run writes
    nothing, even with the right token."""
    conn = await db.connect(database_url)
    try:
        item = await leased_run(conn)
        update = StepUpdate(name="a", kind=StepKind.RUN, action=Action.START)
        wrong = progress.Progress(
            item.run_id, item.token, uuid.uuid4(), plan_updates(str(item.run_id), [update]), seq=1
        )
        assert await progress.apply_batch(conn, [wrong]) == {}
        assert await runs.steps(conn, item.run_id) == []
    finally:
        await conn.close()


async def test_a_claim_gone_stale_begins_nothing(database_url: str) -> None:
    """An orchestrator whose lease expired and was taken over before it began the invocation
    begins nothing (no invocation.started, no app call), while the new holder begins."""
    conn = await db.connect(database_url)
    try:
        item = await leased_run(conn)
        await conn.execute(
            "UPDATE runs SET ready_at = now() - interval '1 s' WHERE id = $1", item.run_id
        )
        [taken] = await claims.claim(conn, "other", 60, 1)
        assert taken["id"] == item.run_id and taken["lease_token"] != item.token
        stale = claims.Begin(item.run_id, item.token, item.invocation_id, 1)
        assert await claims.begin_invocations(conn, [stale]) == {}
        assert "invocation.started" not in await history(conn, item.run_id)
        fresh = claims.Begin(item.run_id, taken["lease_token"], taken["invocation_id"], 1)
        begun = await claims.begin_invocations(conn, [fresh])
        assert list(begun) == [item.run_id] and begun[item.run_id].steps == []
        assert (await history(conn, item.run_id)).count("invocation.started") == 1
    finally:
        await conn.close()


async def test_progress_past_the_time_limit_is_refused(database_url: str) -> None:
    """Once a run is past its time limit, its invocation can record nothing more."""
    conn = await db.connect(database_url)
    try:
        item = await leased_run(conn)
        await conn.execute(
            "UPDATE runs SET deadline_at = now() - interval '1 ms' WHERE id = $1", item.run_id
        )
        assert await progress.apply_batch(conn, [complete(item, 1, seq=1, digest="x")]) == {}
        assert await runs.steps(conn, item.run_id) == []
    finally:
        await conn.close()


async def test_just_after_the_database_was_away_an_expired_lease_is_left_to_its_holder(
    database_url: str,
) -> None:
    """Without takeovers (the dispatcher's state for one lease after it lost the database), a
    run whose lease expired is neither claimed nor counted as due; with them, it is taken."""
    conn = await db.connect(database_url)
    try:
        item = await leased_run(conn)
        await conn.execute(
            "UPDATE runs SET ready_at = now() - interval '1 s' WHERE id = $1", item.run_id
        )
        assert await claims.claim(conn, "other", 60, 5, takeovers=False) == []
        assert await claims.next_due_in(conn, takeovers=False) is None
        [taken] = await claims.claim(conn, "other", 60, 5)
        assert taken["id"] == item.run_id and taken["lease_token"] != item.token
    finally:
        await conn.close()
