"""Pull apps' claims on real PostgreSQL: each due run goes to one poll, never to the dispatcher."""

from __future__ import annotations

import uuid

from stepline_server.store import apps, claims, db, keys, leases, orchestrators, pull, runs

P = keys.DEFAULT_PROJECT


async def _apps_with_runs(conn: db.Conn, n: int) -> tuple[uuid.UUID, list[uuid.UUID]]:
    """A pull app and a push app, each with a workflow and ``n`` due runs; the pull app's id
    and its runs."""
    await keys.bootstrap(conn)
    pulled = await apps.create(conn, P, "pulled", None, "s", kind="pull")
    pushed = await apps.create(conn, P, "pushed", "http://127.0.0.1:9/", "s")
    assert pulled is not None and pushed is not None
    await apps.record_sync(conn, pulled, [("pulled-wf", {})], None)
    await apps.record_sync(conn, pushed, [("pushed-wf", {})], None)
    mine = []
    for workflow in ("pulled-wf", "pushed-wf"):
        for _ in range(n):
            new = runs.NewRun(uuid.uuid4(), P, workflow, None)
            async with conn.transaction():
                row = await runs.insert(conn, new)
                assert row is not None
                if workflow == "pulled-wf":
                    # Never taken at once: its workers poll.
                    assert await leases.take_now(conn, row["id"], leases.Lease("here", 30)) is None
                    mine.append(new.id)
    return pulled["id"], mine


async def test_the_dispatcher_never_claims_a_pull_apps_runs(database_url: str) -> None:
    """The dispatcher's claim takes the push app's runs only; a poll takes the pull app's."""
    conn = await db.connect(database_url)
    try:
        app_id, mine = await _apps_with_runs(conn, 3)
        claimed = await claims.claim(conn, "dispatcher", 30, 10)
        assert {r["workflow"] for r in claimed} == {"pushed-wf"} and len(claimed) == 3
        due_in = await claims.next_due_in(conn)  # the pull runs, due now, do not count
        assert due_in is not None and due_in > 1  # the push runs' leases
        polled = await pull.claim(conn, app_id, "poll", 30, 10)
        assert sorted(r["id"] for r in polled) == sorted(mine)
        assert all(r["lease_token"] for r in polled)
        assert await pull.claim(conn, app_id, "poll", 30, 10) == []
    finally:
        await conn.close()


async def test_two_polls_at_once_never_take_the_same_run(database_url: str) -> None:
    """While one poll's claim holds its run (its transaction open), a second poll on another
    connection skips it and takes the others; after the first commits, nothing is left."""
    setup = await db.connect(database_url)
    first = await db.connect(database_url)
    second = await db.connect(database_url)
    try:
        app_id, mine = await _apps_with_runs(setup, 3)
        async with first.transaction():
            held = await pull.claim(first, app_id, "one", 30, 1)
            assert len(held) == 1
            others = await pull.claim(second, app_id, "two", 30, 10)
            assert len(others) == 2
            assert held[0]["id"] not in {r["id"] for r in others}
        assert sorted([held[0]["id"], *(r["id"] for r in others)]) == sorted(mine)
        assert await pull.claim(second, app_id, "two", 30, 10) == []
    finally:
        for conn in (setup, first, second):
            await conn.close()


async def test_a_lease_that_runs_out_is_claimed_again(database_url: str) -> None:
    """A poll's lease that ran out (its worker died) makes the run due for the next poll,
    which takes it over; the old lease no longer holds the run."""
    conn = await db.connect(database_url)
    try:
        app_id, mine = await _apps_with_runs(conn, 1)
        (gone,) = await pull.claim(conn, app_id, "dead", 0.05, 1)
        await conn.execute("SELECT pg_sleep(0.1)")
        (taken,) = await pull.claim(conn, app_id, "alive", 30, 1)
        assert taken["id"] == gone["id"] == mine[0] and taken["taken_over"]
        assert taken["lease_token"] != gone["lease_token"]
        assert await pull.leased(conn, gone["id"], gone["lease_token"]) is None
        assert await pull.leased(conn, taken["id"], taken["lease_token"]) is not None
    finally:
        await conn.close()


async def test_a_lapsed_lease_is_its_workers_loss_only_when_our_side_served_it(
    database_url: str,
) -> None:
    """A lease orchestrator "here" gave for 60 s, lapsed a second ago (kept 61 s ago), as any
    orchestrator sees it from "here"'s beats: no beat at all, or "here" serving only for the
    last 30 s (it restarted or lost the database since), is our loss: taken over with no count.
    "here" beating after the lapse and serving for 62 s is the worker's loss: found lost, and
    not taken over before the loss is recorded. "here" last beating 2 s ago (before the lapse)
    may beat yet: neither lost nor taken over, looked at again within a second. "here" silent
    for more than a lease died: taken over. A live lease is never lost."""
    conn = await db.connect(database_url)
    try:
        app_id, _ = await _apps_with_runs(conn, 3)
        lapsed, live = await pull.claim(conn, app_id, "here", 60, 2)
        await conn.execute(
            "UPDATE runs SET ready_at = now() - interval '1 second' WHERE id = $1", lapsed["id"]
        )
        assert await pull.lost(conn, app_id, 60) == []  # no beat of "here" ever
        await orchestrators.seen(conn, "here", 30)
        assert await pull.lost(conn, app_id, 60) == []
        await orchestrators.seen(conn, "here", 62)
        (lost,) = await pull.lost(conn, app_id, 60)
        assert lost["id"] == lapsed["id"] and lost["lease_token"] == lapsed["lease_token"]
        assert lost["invocation_id"] == lapsed["invocation_id"]
        assert live["id"] != lapsed["id"]
        (other,) = await pull.claim(conn, app_id, "there", 60, 5)  # the third run, not lapsed
        assert other["id"] not in (lapsed["id"], live["id"])
        await conn.execute(
            "UPDATE orchestrators SET seen_at = now() - interval '2 seconds' WHERE owner = 'here'"
        )
        assert await pull.lost(conn, app_id, 60) == []
        assert await pull.claim(conn, app_id, "there", 60, 5) == []
        due_in = await pull.next_due_in(conn, app_id, 60)
        assert due_in is not None and 0 < due_in <= 1.0, due_in
        await conn.execute(
            "UPDATE orchestrators SET seen_at = now() - interval '61 seconds' WHERE owner = 'here'"
        )
        assert await pull.lost(conn, app_id, 60) == []
        (taken,) = await pull.claim(conn, app_id, "there", 60, 5)
        assert taken["id"] == lapsed["id"] and taken["taken_over"]
    finally:
        await conn.close()
