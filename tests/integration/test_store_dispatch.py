"""The run loop's store: group commit of progress, resent calls, the sweeper."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

from stepline.protocol import Action, StepKind, StepUpdate
from stepline_server.engine import transitions
from stepline_server.engine.steps import Plan, plan_updates
from stepline_server.loops.batcher import ProgressBatcher
from stepline_server.store import apps, claims, db, keys, leases, outcomes, progress, runs, waits


async def _leased_runs(conn: db.Conn, n: int) -> list[tuple[uuid.UUID, str, uuid.UUID]]:
    app = await apps.create(conn, keys.DEFAULT_PROJECT, "a", "http://127.0.0.1:9/", "s")
    await apps.record_sync(conn, app, [("wf", {})], None)
    for _ in range(n):
        new = runs.NewRun(uuid.uuid4(), keys.DEFAULT_PROJECT, "wf", None)
        await runs.insert(conn, new)
    claimed = await claims.claim(conn, "test", 60, n)
    return [(r["id"], r["lease_token"], r["invocation_id"]) for r in claimed]


async def test_one_statement_commits_several_runs_and_refuses_a_stale_one(
    database_url: str,
) -> None:
    """Three runs' progress in one batch: the two with live leases are written in order, the
    one with a stale token writes nothing and is reported stale."""
    await keys_bootstrap(database_url)
    conn = await db.connect(database_url)
    try:
        leased = await _leased_runs(conn, 3)
        items = []
        for n, (run_id, token, inv) in enumerate(leased):
            updates = [StepUpdate(name="a", kind="run", action="start")]
            plan = plan_updates(str(run_id), updates)
            items.append(progress.Progress(run_id, token if n else "stale", inv, plan))
        rows = await progress.apply_batch(conn, items)
        assert set(rows) == {leased[1][0], leased[2][0]}
        for n, (run_id, _, _) in enumerate(leased):
            steps = await runs.steps(conn, run_id)
            assert [(s["name"], s["status"]) for s in steps] == (
                [] if n == 0 else [("a", "running")]
            )
            events = [
                e["type"] for e in await runs.events(conn, keys.DEFAULT_PROJECT, run_id, 0, 50)
            ]
            assert events == ["run.started", "step.started"] if n else ["run.started"]
    finally:
        await conn.close()


async def test_batcher_isolates_a_bad_call(database_url: str) -> None:
    """Calls flushed together still succeed when one of them breaks a constraint."""
    await keys_bootstrap(database_url)
    conn = await db.connect(database_url)
    pool = await db.create_pool(database_url, min_size=1, max_size=4)
    try:
        leased = await _leased_runs(conn, 4)
        batcher = ProgressBatcher(pool, max_flushes=1)
        calls = []
        for n, (run_id, token, inv) in enumerate(leased):
            name = "x" * 300 if n == 2 else "ok"  # over the 256-character step name limit
            update = StepUpdate.model_construct(
                name=name, kind=StepKind.RUN, action=Action.START, attempt=1
            )
            plan = plan_updates(str(run_id), [update])
            calls.append(batcher.apply(progress.Progress(run_id, token, inv, plan)))
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert [isinstance(r, Exception) for r in results] == [False, False, True, False]
        assert all(r is not None for n, r in enumerate(results) if n != 2)
    finally:
        await pool.close()
        await conn.close()


async def keys_bootstrap(database_url: str) -> None:
    conn = await db.connect(database_url)
    try:
        await keys.bootstrap(conn)
    finally:
        await conn.close()


async def test_a_progress_call_sent_again_is_applied_once(database_url: str) -> None:
    """The SDK resends a call whose answer it lost: the same seq is answered, not re-applied."""
    await keys_bootstrap(database_url)
    conn = await db.connect(database_url)
    try:
        [(run_id, token, inv)] = await _leased_runs(conn, 1)
        updates = [StepUpdate(name="a", kind="run", action="start")]
        item = progress.Progress(run_id, token, inv, plan_updates(str(run_id), updates), seq=1)
        first = await progress.apply_batch(conn, [item])
        again = await progress.apply_batch(conn, [item])
        assert first[run_id]["applied"] and not again[run_id]["applied"]
        history = await runs.events(conn, keys.DEFAULT_PROJECT, run_id, 0, 50)
        assert [e["type"] for e in history] == ["run.started", "step.started"]
        stale = progress.Progress(run_id, "other", inv, item.plan, seq=2)
        assert await progress.apply_batch(conn, [stale]) == {}
    finally:
        await conn.close()


async def test_sweeper_deletes_runs_past_retention_and_old_events(database_url: str) -> None:
    """Runs that ended longer ago than the retention go with their history; others stay."""
    from stepline_server.engine.runs import RunStatus
    from stepline_server.loops import sweeper

    await keys_bootstrap(database_url)
    conn = await db.connect(database_url)
    pool = await db.create_pool(database_url, min_size=1, max_size=2)
    try:
        leased = await _leased_runs(conn, 3)
        old, recent, running = (run_id for run_id, _, _ in leased)
        async with conn.transaction():
            for run_id in (old, recent):
                await outcomes.end_run(conn, run_id, None, RunStatus.COMPLETED, 1, None)
        await conn.execute(
            "UPDATE runs SET ended_at = now() - interval '31 days' WHERE id = $1", old
        )
        await conn.execute(
            "INSERT INTO events (id, project_id, name, received_at) "
            "VALUES ($1, $2, 'e', now() - interval '2 days')",
            uuid.uuid4(),
            keys.DEFAULT_PROJECT,
        )
        assert await sweeper.sweep_once(pool, retention_days=30) == sweeper.Swept(1, 1, 0, 0)
        left = {r["id"] for r in await conn.fetch("SELECT id FROM runs")}
        assert left == {recent, running}
        assert await conn.fetchval("SELECT count(*) FROM run_events WHERE run_id = $1", old) == 0
    finally:
        await pool.close()
        await conn.close()


async def test_invocations_ending_together_are_recorded_in_one_commit(database_url: str) -> None:
    """Four invocations answer at once: one run completes with a list output, one fails, one
    suspends on a sleep, and one lost its lease; each gets its own outcome and history."""
    await keys_bootstrap(database_url)
    conn = await db.connect(database_url)
    try:
        leased = await _leased_runs(conn, 4)
        done_plan = [StepUpdate(name="a", kind="run", action="complete", output=[0, 1, 4])]
        sleep_plan = [StepUpdate(name="z", kind="sleep", action="sleep", delayMs=60_000)]
        outcomes = [
            (done_plan, transitions.Outcome("completed", output=[0, 1, 4])),
            ([], transitions.Outcome("failed", error={"type": "Boom", "message": "no"})),
            (sleep_plan, transitions.Outcome("suspended")),
            ([], transitions.Outcome("completed", output="never")),
        ]
        items = [
            progress.Progress(
                run_id,
                token if n != 3 else "lost",
                inv,
                plan_updates(str(run_id), updates),
                (outcome.ended_event(),),
                outcome=outcome,
            )
            for n, ((run_id, token, inv), (updates, outcome)) in enumerate(
                zip(leased, outcomes, strict=True)
            )
        ]
        done = await progress.commit(conn, items)
        assert [leased[n][0] in done for n in range(4)] == [True, True, True, False]
        assert all(d.recorded for d in done.values())
        rows = [await runs.get(conn, keys.DEFAULT_PROJECT, r[0]) for r in leased]
        assert [r["status"] for r in rows if r] == ["completed", "failed", "running", "running"]
        assert rows[0] and rows[0]["output"] == [0, 1, 4]
        assert rows[1] and rows[1]["error"] == {"type": "Boom", "message": "no"}
        assert rows[2] and rows[2]["lease_token"] is None and rows[2]["ready_at"] is not None
        assert rows[3] and rows[3]["lease_token"] is not None  # the lost lease is untouched
        histories = [
            [e["type"] for e in await runs.events(conn, keys.DEFAULT_PROJECT, r[0], 0, 50)]
            for r in leased
        ]
        assert histories[0][-3:] == ["step.completed", "invocation.ended", "run.completed"]
        assert histories[1][-2:] == ["invocation.ended", "run.failed"]
        assert histories[2][-2:] == ["step.sleeping", "invocation.ended"]
        assert histories[3] == ["run.started"]
    finally:
        await conn.close()


async def test_a_sleep_counts_from_when_the_workflow_reached_it(database_url: str) -> None:
    """wakeAt = atMs + delay when atMs lies between the invocation's last commit and the
    commit of the sleep; an app clock behind or ahead cannot move it outside those bounds."""
    await keys_bootstrap(database_url)
    conn = await db.connect(database_url)
    try:
        leased = await _leased_runs(conn, 3)
        claimed_at = [(await runs.get(conn, keys.DEFAULT_PROJECT, r[0]))["progress_at"]
                      for r in leased]  # fmt: skip
        await asyncio.sleep(0.3)
        at_ms = [
            int((claimed_at[0] + timedelta(milliseconds=100)).timestamp() * 1000),  # in bounds
            int((claimed_at[1] - timedelta(minutes=10)).timestamp() * 1000),  # clock behind
            int((datetime.now(UTC) + timedelta(minutes=10)).timestamp() * 1000),  # ahead
        ]

        def nap(run_id: uuid.UUID, at: int) -> Plan:
            update = StepUpdate(name="nap", kind="sleep", action="sleep", delayMs=60_000, atMs=at)
            return plan_updates(str(run_id), [update])

        items = [
            progress.Progress(run_id, token, inv, nap(run_id, at))
            for (run_id, token, inv), at in zip(leased, at_ms, strict=True)
        ]
        before = datetime.now(UTC)
        await progress.apply_batch(conn, items)
        after = datetime.now(UTC)
        wakes = [(await runs.steps(conn, r[0]))[0]["wake_at"] for r in leased]
        minute = timedelta(minutes=1)
        assert abs(wakes[0] - (claimed_at[0] + timedelta(milliseconds=100) + minute)) < timedelta(
            milliseconds=2
        )
        assert wakes[1] == claimed_at[1] + minute
        assert before + minute - timedelta(seconds=1) <= wakes[2] <= after + minute
    finally:
        await conn.close()


async def test_a_run_created_leased_is_begun_and_a_capped_one_is_left_to_the_claim(
    database_url: str,
) -> None:
    """Taken at once with a lease, a run needs no claim: its first invocation has begun, and
    progress under the lease goes on from there. A workflow with a concurrency cap is not taken
    at once, so the claim keeps judging its cap."""
    await keys_bootstrap(database_url)
    conn = await db.connect(database_url)
    try:
        app = await apps.create(conn, keys.DEFAULT_PROJECT, "a", "http://127.0.0.1:9/", "s")
        await apps.record_sync(conn, app, [("wf", {}), ("capped", {"concurrency": 1})], None)
        lease = leases.Lease("here", 60)
        taken = {}
        for workflow, value in (("wf", 1), ("capped", 2)):
            async with conn.transaction():
                row = await runs.insert(
                    conn, runs.NewRun(uuid.uuid4(), keys.DEFAULT_PROJECT, workflow, value)
                )
                assert row is not None
                taken[workflow] = (row, await leases.take_now(conn, row["id"], lease))
        (_, now), (capped, not_taken) = taken["wf"], taken["capped"]
        assert now is not None and not_taken is None
        free = now.claim
        assert free.lease_token is not None and free.generation == 1
        assert free.app_url == "http://127.0.0.1:9/" and not free.past_deadline
        assert now.begun is not None and now.begun.steps == []

        claimed = await claims.claim(conn, "other", 60, 10)
        assert [r["id"] for r in claimed] == [capped["id"]]

        plan = plan_updates(str(free.id), [StepUpdate(name="a", kind="run", action="start")])
        item = progress.Progress(free.id, free.lease_token, free.invocation_id, plan)
        assert free.id in await progress.apply_batch(conn, [item])
        history = await runs.events(conn, keys.DEFAULT_PROJECT, free.id, 0, 50)
        assert [(e["seq"], e["type"]) for e in history] == [
            (1, "run.started"),
            (2, "invocation.started"),
            (3, "step.started"),
        ]
        assert history[1]["invocation_id"] == free.invocation_id
        assert history[1]["data"] == {"attempt": 1}
    finally:
        await conn.close()


async def test_completing_a_callback_leases_its_suspended_run(database_url: str) -> None:
    """A callback completed with a lease hands its suspended run straight to that orchestrator:
    the run is leased (no claim finds it), its begin records the invocation and shows the
    callback done, and the invocation may suspend again without being run once more for the
    wake-up it has already seen. Completed while an invocation is active, the run stays with
    that invocation."""
    await keys_bootstrap(database_url)
    conn = await db.connect(database_url)
    try:
        [(run_id, token, inv), (busy_id, busy_token, busy_inv)] = await _leased_runs(conn, 2)
        callbacks: dict[uuid.UUID, uuid.UUID] = {}
        for rid, tok, iid in ((run_id, token, inv), (busy_id, busy_token, busy_inv)):
            update = StepUpdate(name="cb", kind="callback", action="callback")
            plan = plan_updates(str(rid), [update])
            callbacks[rid] = uuid.UUID(plan.callbacks[0][0])
            suspend = transitions.Outcome(status="suspended") if rid == run_id else None
            assert await progress.commit(
                conn, [progress.Progress(rid, tok, iid, plan, outcome=suspend)]
            )

        lease = leases.Lease("here", 60)
        done = await waits.complete_callback(conn, callbacks[run_id], None, {"ok": 1}, lease=lease)
        assert done.completed and done.taken is not None and done.taken.begun is not None
        claim = done.taken.claim
        assert claim.id == run_id and claim.lease_token not in (None, token)
        assert claim.app_url == "http://127.0.0.1:9/" and claim.invoke_attempts == 0
        assert await claims.claim(conn, "other", 60, 10) == []

        steps = done.taken.begun.steps
        assert [(s["name"], s["status"], s["output"]) for s in steps] == [
            ("cb", "completed", {"ok": 1})
        ]
        again = progress.Progress(
            run_id,
            claim.lease_token,
            claim.invocation_id,
            Plan(),
            outcome=transitions.Outcome(status="suspended"),
        )
        assert (await progress.commit(conn, [again]))[run_id].recorded
        row = await conn.fetchrow("SELECT ready_at, lease_token FROM runs WHERE id = $1", run_id)
        assert row["ready_at"] is None and row["lease_token"] is None
        history = await runs.events(conn, keys.DEFAULT_PROJECT, run_id, 0, 50)
        assert [e["type"] for e in history][-3:] == [
            "callback.completed",
            "step.completed",
            "invocation.started",
        ]

        busy = await waits.complete_callback(conn, callbacks[busy_id], None, None, lease=lease)
        assert busy.completed and busy.taken is None
        row = await conn.fetchrow("SELECT lease_token FROM runs WHERE id = $1", busy_id)
        assert row["lease_token"] == busy_token
    finally:
        await conn.close()


async def test_sleeps_ending_within_the_lead_are_claimed_and_settled_as_of_their_end(
    database_url: str,
) -> None:
    """A run whose sleep ends within the lead is claimed and begun ahead of it: the claim says
    how soon it is due, the sleep is recorded as ending at its due time (never earlier), the
    history says so in order, and the begin says how long the app must wait. A sleep ending
    beyond the lead is left alone, and so is a callback whose timeout is near: it may still be
    completed in time."""
    await keys_bootstrap(database_url)
    conn = await db.connect(database_url)
    try:
        leased = await _leased_runs(conn, 3)
        updates = [
            StepUpdate(name="nap", kind="sleep", action="sleep", delayMs=400),
            StepUpdate(name="nap", kind="sleep", action="sleep", delayMs=60_000),
            StepUpdate(name="cb", kind="callback", action="callback", timeoutMs=400),
        ]
        for (run_id, token, inv), update in zip(leased, updates, strict=True):
            plan = plan_updates(str(run_id), [update])
            item = progress.Progress(
                run_id, token, inv, plan, outcome=transitions.Outcome("suspended")
            )
            assert (await progress.commit(conn, [item]))[run_id].recorded
        soon, later, waiting = (run_id for run_id, _, _ in leased)

        assert await claims.claim(conn, "here", 60, 10) == []
        [claim] = await claims.claim(conn, "here", 60, 10, lead=5.0)
        assert claim["id"] == soon and 0 < claim["due_in"] <= 0.4

        # The waiting run's invocation begins too (as if leased for another reason).
        await conn.execute("UPDATE runs SET lease_token = 'other' WHERE id = $1", waiting)
        begins = [
            claims.Begin(soon, claim["lease_token"], claim["invocation_id"], 1),
            claims.Begin(waiting, "other", uuid.uuid4(), 1),
        ]
        steps = await claims.begin_invocations(conn, begins, lead=5.0)
        [nap] = steps[soon].steps
        assert nap["status"] == "completed" and 0 < steps[soon].wait_s <= 0.4
        row = await conn.fetchrow(
            "SELECT wake_at, ended_at FROM steps WHERE run_id = $1 AND name = 'nap'", soon
        )
        assert row["ended_at"] == row["wake_at"]
        history = await runs.events(conn, keys.DEFAULT_PROJECT, soon, 0, 50)
        assert [e["type"] for e in history][-2:] == ["step.completed", "invocation.started"]
        assert history[-2]["at"] == history[-1]["at"] == row["wake_at"]

        [cb] = steps[waiting].steps
        assert cb["status"] == "waiting" and steps[waiting].wait_s <= 0
        untouched = await conn.fetchval(
            "SELECT status::text FROM steps WHERE run_id = $1 AND name = 'nap'", later
        )
        assert untouched == "sleeping"
    finally:
        await conn.close()


async def test_a_run_this_orchestrator_is_invoking_is_not_taken_again(database_url: str) -> None:
    """A lease that ran out (its beat came late) of a run the orchestrator is still invoking is
    left alone by that orchestrator's claim, so the run never has two invocations from it; a
    claim that does not hold it takes it over."""
    await keys_bootstrap(database_url)
    conn = await db.connect(database_url)
    try:
        app = await apps.create(conn, keys.DEFAULT_PROJECT, "a", "http://127.0.0.1:9/", "s")
        await apps.record_sync(conn, app, [("wf", {})], None)
        await runs.insert(conn, runs.NewRun(uuid.uuid4(), keys.DEFAULT_PROJECT, "wf", None))
        [first] = await claims.claim(conn, "here", 0, 10)  # a lease that is over at once
        again = await claims.claim(conn, "here", 60, 10, holding=[first["id"]])
        assert again == []
        [other] = await claims.claim(conn, "there", 60, 10)
        assert other["id"] == first["id"] and other["taken_over"]
        assert other["lease_token"] != first["lease_token"]
    finally:
        await conn.close()


async def test_a_delta_follows_only_an_answer_of_an_sdk_that_reads_deltas(
    database_url: str,
) -> None:
    """What an invocation carries follows the answer to the run's last invocation, not what
    the app declared at its last sync: after an answer that does not read deltas, the whole
    history though the app declared it does; after one that does, only what changed though the
    app declared protocol 1; never to a poll that does not read them."""
    await keys_bootstrap(database_url)
    conn = await db.connect(database_url)
    try:
        [(run_id, token, inv)] = await _leased_runs(conn, 1)
        update = StepUpdate(name="a", kind="value", action="complete", output=1)
        plan = plan_updates(str(run_id), [update])
        begun = await claims.begin_invocations(conn, [claims.Begin(run_id, token, inv, 1)])
        assert begun[run_id].history_base is None

        async def answer_then_begin(reads_deltas: bool, deltas: bool = True) -> claims.Begun:
            """The invocation holding the run answers, suspended; the next one begins."""
            nonlocal token, inv
            token, inv = await _answer_and_claim(conn, run_id, token, inv, plan, reads_deltas)
            start = claims.Begin(run_id, token, inv, 1, deltas)
            return (await claims.begin_invocations(conn, [start]))[run_id]

        assert (await answer_then_begin(reads_deltas=False)).history_base is None
        await conn.execute("UPDATE apps SET protocol_version = 1")
        before = inv
        assert (await answer_then_begin(reads_deltas=True)).history_base == before
        assert (await answer_then_begin(reads_deltas=True, deltas=False)).history_base is None
    finally:
        await conn.close()


async def test_a_begin_tried_again_after_its_commit_was_lost_records_it_once(
    database_url: str,
) -> None:
    """A begin whose commit went through but whose answer was lost (the connection dropped at
    COMMIT) is tried again with the same claim: the invocation starts once in the history, and
    the second try still answers the run, with its whole history (the delta base the first
    try moved past is not trusted)."""
    await keys_bootstrap(database_url)
    conn = await db.connect(database_url)
    try:
        [(run_id, token, inv)] = await _leased_runs(conn, 1)
        update = StepUpdate(name="a", kind="value", action="complete", output=1)
        plan = plan_updates(str(run_id), [update])
        await claims.begin_invocations(conn, [claims.Begin(run_id, token, inv, 1)])
        next_token, next_inv = await _answer_and_claim(conn, run_id, token, inv, plan, True)
        start = claims.Begin(run_id, next_token, next_inv, 1)
        first = (await claims.begin_invocations(conn, [start]))[run_id]
        again = (await claims.begin_invocations(conn, [start]))[run_id]
        started = await conn.fetchval(
            "SELECT count(*) FROM run_events WHERE run_id = $1 AND type = 'invocation.started'"
            " AND invocation_id = $2",
            run_id,
            next_inv,
        )
        seqs = [
            r["seq"]
            for r in await conn.fetch(
                "SELECT seq FROM run_events WHERE run_id = $1 ORDER BY seq", run_id
            )
        ]
    finally:
        await conn.close()
    assert first.history_base == inv
    assert started == 1
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert again.history_base is None and [s["name"] for s in again.steps] == ["a"]


async def _answer_and_claim(
    conn: db.Conn,
    run_id: uuid.UUID,
    token: str,
    inv: uuid.UUID,
    plan: Plan,
    reads_deltas: bool,
) -> tuple[str, uuid.UUID]:
    """The invocation holding the run answers ``plan``, suspended (its SDK reading deltas or
    not); the run comes due and is claimed again: the new claim's token and invocation id."""
    outcome = transitions.Outcome(status="suspended", reads_deltas=reads_deltas)
    done = progress.Progress(run_id, token, inv, plan, outcome=outcome)
    assert (await progress.commit(conn, [done]))[run_id].recorded
    await conn.execute("UPDATE runs SET ready_at = now() WHERE id = $1", run_id)
    [claim] = await claims.claim(conn, "test", 60, 1)
    return claim["lease_token"], claim["invocation_id"]
