"""Races between two connections, proven by holding one transaction open across the other."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from stepline.protocol import Action, StepKind, StepUpdate
from stepline_server.engine import transitions
from stepline_server.engine.steps import plan_updates
from stepline_server.store import apps, claims, db, keys, progress, runs, waits

PROJECT = keys.DEFAULT_PROJECT


async def blocked_or_done(watcher: db.Conn, pid: int, task: asyncio.Future[Any]) -> bool:
    """Whether the backend ``pid`` is waiting for a lock (True) or ``task`` ended first (False):
    looked up in pg_stat_activity, not guessed from timing. Gives up after 10 s."""
    for _ in range(1000):
        if task.done():
            return False
        state = await watcher.fetchval(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", pid
        )
        if state == "Lock":
            return True
        await asyncio.sleep(0.01)
    raise AssertionError("the second connection neither blocked nor finished")


async def leased_run(conn: db.Conn, workflow: str = "wf", options: Any = None) -> progress.Progress:
    """A run of ``workflow`` claimed by this test, as an empty progress item for its lease."""
    await keys.bootstrap(conn)
    if await apps.get_by_name(conn, PROJECT, "a") is None:
        app = await apps.create(conn, PROJECT, "a", "http://127.0.0.1:9/", "s")
        await apps.record_sync(conn, app, [(workflow, options or {})], None)
    run_id = uuid.uuid4()
    await runs.insert(conn, runs.NewRun(run_id, PROJECT, workflow, None))
    [claim] = await claims.claim(conn, "test", 60, 1)
    plan = plan_updates(str(run_id), [])
    return progress.Progress(run_id, claim["lease_token"], claim["invocation_id"], plan)


def event_wait(
    item: progress.Progress, event: str, match: dict[str, Any] | None = None
) -> progress.Progress:
    update = StepUpdate(
        name="wait", kind=StepKind.EVENT, action=Action.EVENT, event=event, match=match
    )
    plan = plan_updates(str(item.run_id), [update])
    return progress.Progress(item.run_id, item.token, item.invocation_id, plan, seq=1)


async def step_status(conn: db.Conn, run_id: uuid.UUID, name: str) -> str:
    return str(
        await conn.fetchval(
            "SELECT status FROM steps WHERE run_id = $1 AND name = $2", run_id, name
        )
    )


async def connections(database_url: str, n: int) -> list[db.Conn]:
    return list(await asyncio.gather(*(db.connect(database_url) for _ in range(n))))


async def close_all(conns: list[db.Conn]) -> None:
    for conn in conns:
        await conn.close()


async def test_an_event_sent_while_its_wait_commits_resumes_the_run(database_url: str) -> None:
    """A wait recorded in a transaction still open when the event is sent: the event waits for
    it, then resumes the run (before, each missed the other and the run waited forever)."""
    first, second, watcher = conns = await connections(database_url, 3)
    try:
        item = event_wait(await leased_run(first), "order.paid")
        async with first.transaction():
            assert await progress.apply_plan(first, item) is not None
            sending = asyncio.ensure_future(
                waits.send_event(second, PROJECT, "order.paid", {"n": 1})
            )
            assert await blocked_or_done(watcher, second.get_server_pid(), sending)
        assert (await sending)[1].matched == [item.run_id]
        assert await step_status(watcher, item.run_id, "wait") == "completed"
    finally:
        await close_all(conns)


async def test_a_wait_recorded_while_its_event_commits_takes_the_event(database_url: str) -> None:
    """An event sent in a transaction still open when the wait is recorded: the wait waits for
    it, then takes the event."""
    first, second, watcher = conns = await connections(database_url, 3)
    try:
        item = event_wait(await leased_run(first), "order.paid")
        async with second.transaction():
            _, sent = await waits.send_event(second, PROJECT, "order.paid", 7)
            assert sent.matched == []
            recording = asyncio.ensure_future(progress.apply_plan(first, item))
            assert await blocked_or_done(watcher, first.get_server_pid(), recording)
        assert await recording is not None
        assert await step_status(watcher, item.run_id, "wait") == "completed"
        output = await watcher.fetchval(
            "SELECT output FROM steps WHERE run_id = $1 AND name = 'wait'", item.run_id
        )
        assert output == 7
    finally:
        await close_all(conns)


async def test_a_wait_with_match_fields_holds_up_only_the_events_it_could_match(
    database_url: str,
) -> None:
    """A wait for order 1 recorded in a transaction still open: an event of another order is
    sent meanwhile without waiting for it; one of order 1 (``1.0`` equals ``1`` in JSON) waits
    for it, then resumes the run."""
    first, second, watcher = conns = await connections(database_url, 3)
    try:
        item = event_wait(await leased_run(first), "order.paid", {"order": 1})
        async with first.transaction():
            assert await progress.apply_plan(first, item) is not None
            other = asyncio.ensure_future(
                waits.send_event(second, PROJECT, "order.paid", {"order": 2})
            )
            assert not await blocked_or_done(watcher, second.get_server_pid(), other)
            assert (await other)[1].matched == []
            sending = asyncio.ensure_future(
                waits.send_event(second, PROJECT, "order.paid", {"n": 5, "order": 1.0})
            )
            assert await blocked_or_done(watcher, second.get_server_pid(), sending)
        assert (await sending)[1].matched == [item.run_id]
        assert await step_status(watcher, item.run_id, "wait") == "completed"
    finally:
        await close_all(conns)


async def test_two_sends_of_one_event_never_wait_for_each_other(database_url: str) -> None:
    """An event of one name and data sent in a transaction still open does not hold up another
    send of the same (before, every send of a name waited for the one before it)."""
    first, second, watcher = conns = await connections(database_url, 3)
    try:
        await leased_run(first)
        async with first.transaction():
            await waits.send_event(first, PROJECT, "order.paid", {"order": 1})
            other = asyncio.ensure_future(
                waits.send_event(second, PROJECT, "order.paid", {"order": 1})
            )
            assert not await blocked_or_done(watcher, second.get_server_pid(), other)
            await other
    finally:
        await close_all(conns)


async def test_an_event_of_many_fields_holds_up_every_wait_of_its_name(
    database_url: str,
) -> None:
    """An event whose data has more fields than are locked one by one, sent in a transaction
    still open: a wait matching one of its fields waits for it, then takes the event."""
    first, second, watcher = conns = await connections(database_url, 3)
    try:
        item = event_wait(await leased_run(first), "order.paid", {"f7": 7})
        data = {f"f{i}": i for i in range(40)}
        async with second.transaction():
            _, sent = await waits.send_event(second, PROJECT, "order.paid", data)
            assert sent.matched == []
            recording = asyncio.ensure_future(progress.apply_plan(first, item))
            assert await blocked_or_done(watcher, first.get_server_pid(), recording)
        assert await recording is not None
        output = await watcher.fetchval(
            "SELECT output FROM steps WHERE run_id = $1 AND name = 'wait'", item.run_id
        )
        assert output == data
    finally:
        await close_all(conns)


async def test_two_claims_at_once_never_exceed_a_concurrency_cap(database_url: str) -> None:
    """Cap 1: one orchestrator leases a run in a transaction still open while a second run comes
    due and another orchestrator claims; the second waits for the first, sees the cap full and
    holds its run (before, both saw room and two runs were leased)."""
    first, second, watcher = conns = await connections(database_url, 3)
    try:
        one = await leased_run_of_capped(first)
        two = uuid.uuid4()
        await runs.insert(watcher, runs.NewRun(two, PROJECT, "capped", None))
        await watcher.execute(
            "UPDATE runs SET ready_at = now() + interval '1 h' WHERE id = $1", two
        )
        async with first.transaction():
            [claim] = await claims.claim(first, "first", 60, 10)
            assert claim["id"] == one
            await watcher.execute("UPDATE runs SET ready_at = now() WHERE id = $1", two)
            claiming = asyncio.ensure_future(claims.claim(second, "second", 60, 10))
            assert await blocked_or_done(watcher, second.get_server_pid(), claiming)
        assert await claiming == []
        leased = await watcher.fetchval(
            "SELECT count(*) FROM runs WHERE workflow = 'capped' AND lease_token IS NOT NULL"
        )
        assert leased == 1
        assert await watcher.fetchval("SELECT held FROM runs WHERE id = $1", two)
    finally:
        await close_all(conns)


async def leased_run_of_capped(conn: db.Conn) -> uuid.UUID:
    """A due run of workflow ``capped`` (concurrency 1), not yet claimed."""
    await keys.bootstrap(conn)
    app = await apps.create(conn, PROJECT, "a", "http://127.0.0.1:9/", "s")
    await apps.record_sync(conn, app, [("capped", {"concurrency": 1})], None)
    run_id = uuid.uuid4()
    await runs.insert(conn, runs.NewRun(run_id, PROJECT, "capped", None))
    return run_id


async def test_held_runs_go_as_slots_free_oldest_first(database_url: str) -> None:
    """Three runs under cap 1: one leased, two held; when the lease ends, release lets the
    oldest go and the next claim leases it, the youngest still held."""
    conn = await db.connect(database_url)
    try:
        first = await leased_run_of_capped(conn)
        others = []
        for _ in range(2):
            others.append(uuid.uuid4())
            await runs.insert(conn, runs.NewRun(others[-1], PROJECT, "capped", None))
        [claim] = await claims.claim(conn, "o", 60, 10)
        assert claim["id"] == first
        assert await claims.claim(conn, "o", 60, 10) == []
        assert await conn.fetchval("SELECT count(*) FROM runs WHERE held") == 2
        leases = [{"id": str(first), "token": claim["lease_token"]}]
        await conn.execute(db.Q["suspend_runs"], leases)
        assert await claims.release_held(conn) == 1
        [nxt] = await claims.claim(conn, "o", 60, 10)
        assert nxt["id"] == others[0]
        assert await conn.fetchval("SELECT held FROM runs WHERE id = $1", others[1])
    finally:
        await conn.close()


async def delete_between_updates(
    owner: db.Conn,
    deleter: db.Conn,
    watcher: db.Conn,
    app_id: uuid.UUID,
    first: uuid.UUID,
    second: uuid.UUID,
) -> None:
    """Delete app ``app_id`` on ``deleter`` while ``owner``, in a transaction held open, has
    updated run ``first``; once the delete waits for a lock, ``owner`` updates run ``second``
    and commits, and the delete must then finish."""
    tx = owner.transaction()
    await tx.start()
    touch = "UPDATE runs SET invoke_attempts = invoke_attempts + 1 WHERE id = $1"
    await owner.execute(touch, first)
    pid = await deleter.fetchval("SELECT pg_backend_pid()")
    deleting = asyncio.ensure_future(apps.delete(deleter, PROJECT, app_id))
    assert await blocked_or_done(watcher, pid, deleting)
    await owner.execute(touch, second)
    await tx.commit()
    await deleting


async def test_deleting_an_app_waits_for_its_runs_in_id_order_and_never_deadlocks(
    database_url: str,
) -> None:
    """An app is deleted while an invocation's end holds one of its runs and then locks
    another (runs are always locked in id order): the delete waits for the first run without
    taking the second, the end commits, then the delete takes the app and every run with it.
    (Deleted by cascade in the order the rows lie, the later run was taken first: a deadlock.)"""
    owner, deleter, watcher = await connections(database_url, 3)
    try:
        await keys.bootstrap(owner)
        app = await apps.create(owner, PROJECT, "a", "http://127.0.0.1:9/", "s")
        await apps.record_sync(owner, app, [("wf", {})], None)
        low, high = uuid.UUID(int=1), uuid.UUID(int=2**127)
        for run_id in (high, low):  # the higher id lies first in the table
            await runs.insert(owner, runs.NewRun(run_id, PROJECT, "wf", None))
        # It would deadlock if the delete held the higher run.
        await delete_between_updates(owner, deleter, watcher, app["id"], low, high)
        assert await owner.fetchval("SELECT count(*) FROM runs WHERE app_id = $1", app["id"]) == 0
        assert await apps.get_by_name(owner, PROJECT, "a") is None
    finally:
        for conn in (owner, deleter, watcher):
            await conn.close()


async def test_deleting_an_app_never_deadlocks_with_a_child_run_updated_twice(
    database_url: str,
) -> None:
    """An app whose run is the child of another app's run is deleted while an invocation's
    transaction updates that child twice (its last progress, then its suspension). The second
    update checks the child's parent key, which locks the parent for share. The delete, holding
    the parent (the lower id) and waiting for the child, must not block that check: the
    transaction commits, then the delete takes the child with its app and the parent stays."""
    owner, deleter, watcher = await connections(database_url, 3)
    try:
        await keys.bootstrap(owner)
        parents = await apps.create(owner, PROJECT, "parents", "http://127.0.0.1:9/", "s")
        await apps.record_sync(owner, parents, [("parent", {})], None)
        children = await apps.create(owner, PROJECT, "children", "http://127.0.0.1:9/", "s")
        await apps.record_sync(owner, children, [("child", {})], None)
        parent, child = uuid.UUID(int=1), uuid.UUID(int=2**127)
        await runs.insert(owner, runs.NewRun(parent, PROJECT, "parent", None))
        await runs.insert(
            owner,
            runs.NewRun(child, PROJECT, "child", None, parent_run_id=parent, parent_step="c"),
        )
        # It deadlocked when the delete held the parent for update.
        await delete_between_updates(owner, deleter, watcher, children["id"], child, child)
        assert await owner.fetchval("SELECT count(*) FROM runs WHERE id = $1", child) == 0
        assert await owner.fetchval("SELECT count(*) FROM runs WHERE id = $1", parent) == 1
    finally:
        for conn in (owner, deleter, watcher):
            await conn.close()


async def begin(conn: db.Conn, run_id: uuid.UUID) -> tuple[progress.Progress, claims.Begun]:
    """Claim ``run_id`` (made due now) and begin its invocation: the lease and what it sends."""
    await conn.execute("UPDATE runs SET ready_at = now() WHERE id = $1", run_id)
    [claim] = await claims.claim(conn, "test", 60, 1)
    start = claims.Begin(run_id, claim["lease_token"], claim["invocation_id"], 1)
    begun = (await claims.begin_invocations(conn, [start]))[run_id]
    item = progress.Progress(
        run_id, claim["lease_token"], claim["invocation_id"], plan_updates(str(run_id), [])
    )
    return item, begun


async def suspend(conn: db.Conn, item: progress.Progress) -> None:
    """End the invocation suspended, answered by an SDK that reads history deltas."""
    done = progress.Progress(
        item.run_id,
        item.token,
        item.invocation_id,
        item.plan,
        outcome=transitions.Outcome(status="suspended", reads_deltas=True),
    )
    assert await progress.commit(conn, [done])


async def test_a_step_written_while_an_invocation_begins_reaches_the_next(
    database_url: str,
) -> None:
    """An event completes a wait in a transaction still open while the run's next invocation
    begins (it waits for the run's lock; a later transaction committed before it began): that
    invocation (run_begin reads the steps once it holds the lock) sends the completed wait with
    the event's data, and the one after, which sends only what changed, sends nothing: the
    snapshot kept is the one the steps were read under. Each invocation after the first names
    the one it builds on."""
    first, second, watcher = conns = await connections(database_url, 3)
    try:
        item = event_wait(await leased_run(first), "order.shipped")
        assert await progress.apply_plan(first, item) is not None
        await suspend(first, item)
        whole_item, whole = await begin(first, item.run_id)
        assert whole.history_base is None  # the first begun: every step
        assert [(s["name"], s["status"]) for s in whole.steps] == [("wait", "waiting")]
        await suspend(first, whole_item)

        await first.execute("UPDATE runs SET ready_at = now() WHERE id = $1", item.run_id)
        [claim] = await claims.claim(first, "test", 60, 1)
        start = claims.Begin(item.run_id, claim["lease_token"], claim["invocation_id"], 1)
        async with first.transaction():
            await waits.send_event(first, PROJECT, "order.shipped", {"n": 7})
            # A newer transaction ends first: the event's is still open below the snapshot's
            # horizon when the invocation begins.
            await watcher.execute("SELECT pg_current_xact_id()")
            beginning = asyncio.ensure_future(claims.begin_invocations(second, [start]))
            assert await blocked_or_done(watcher, second.get_server_pid(), beginning)
        raced = (await beginning)[item.run_id]
        assert raced.history_base == whole_item.invocation_id
        assert [(s["name"], s["status"], s["output"]) for s in raced.steps] == [
            ("wait", "completed", {"n": 7})
        ]
        raced_item = progress.Progress(
            item.run_id,
            claim["lease_token"],
            claim["invocation_id"],
            plan_updates(str(item.run_id), []),
        )
        await suspend(first, raced_item)

        after_item, after = await begin(first, item.run_id)
        assert after.history_base == claim["invocation_id"]
        assert after.steps == []
        await suspend(first, after_item)
        _, quiet = await begin(first, item.run_id)
        assert quiet.steps == [] and (quiet.history_steps, quiet.history_bytes) == (1, 8)
    finally:
        await close_all(conns)
