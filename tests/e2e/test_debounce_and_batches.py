"""Debounces and batches end to end: starts gathered into one run, over real HTTP, with one
orchestrator, two on one database, and one restarted."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import datetime
from typing import Any

import httpx
import pytest

import stepline
from stepline_server.engine import gathering
from stepline_server.loops import repair
from stepline_server.store import gatherings, runs
from stepline_server.store.keys import DEFAULT_PROJECT
from tests.dashboard_forms import Dashboard
from tests.support import Stack, app_server, hosted, lifespan, orchestrator_stack, serve, until


def _debounced(
    period: str = "1s", max_wait: str | None = None, key: str | None = "userId"
) -> tuple[stepline.Stepline, list[Any]]:
    """An app with workflow ``digest`` debounced so; ``seen`` gets each input it runs with."""
    sl = stepline.Stepline("debounce-secret")
    seen: list[Any] = []

    @sl.workflow("digest", debounce=stepline.Debounce(period, key=key, max_wait=max_wait))
    async def digest(ctx: stepline.Context, input: Any) -> Any:
        seen.append(input)
        return input

    return sl, seen


def _batched(
    size: int, wait: str, key: str | None = None
) -> tuple[stepline.Stepline, list[list[Any]]]:
    sl = stepline.Stepline("batch-secret")
    seen: list[list[Any]] = []

    @sl.workflow("mailer", on_event="email.queued", batch=stepline.Batch(size, wait, key))
    async def mailer(ctx: stepline.Context, input: list[Any]) -> int:
        seen.append(input)
        return len(input)

    return sl, seen


async def _history(stack: Stack, run_id: str) -> list[dict[str, Any]]:
    return (await stack.client.list_run_events(run_id))["events"]


def _at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


@pytest.mark.parametrize("kind", ["push", "pull"])
async def test_debounced_starts_become_one_run_with_the_last_input(
    database_url: str, kind: str
) -> None:
    """Three starts of one key within the period answer one run (201, then 200 debounced),
    held by the debounce until it fires once with the last input, a period after the last
    start; its history says how many starts it absorbed. Another key is another run; a
    runKey is refused with 422 and changes nothing."""
    sl, seen = _debounced(period="1s")
    async with orchestrator_stack(database_url) as stack, hosted(stack, sl, kind):
        headers = {"authorization": f"Bearer {stack.api_key}"}
        async with httpx.AsyncClient(base_url=stack.url, headers=headers) as http:
            answers = []
            for n in range(3):
                body = {"workflow": "digest", "input": {"userId": "u1", "n": n}}
                answers.append(await http.post("/v1/runs", json=body))
            last_start = time.time()
            other = await http.post(
                "/v1/runs", json={"workflow": "digest", "input": {"userId": "u2", "n": 9}}
            )
            keyed = await http.post(
                "/v1/runs",
                json={"workflow": "digest", "input": {"userId": "u1"}, "runKey": "k-1"},
            )
        assert [a.status_code for a in answers] == [201, 200, 200]
        ids = {a.json()["id"] for a in answers}
        assert len(ids) == 1
        run_id = ids.pop()
        assert [a.json().get("debounced") for a in answers] == [None, True, True]
        assert answers[2].json()["heldBy"] == "debounce"
        assert answers[2].json()["gathering"]["starts"] == 3
        assert other.status_code == 201 and other.json()["id"] != run_id
        assert keyed.status_code == 422 and keyed.json()["error"]["code"] == "validation_failed"
        assert "runKey" in keyed.json()["error"]["details"]["fields"]
        # A gathering run has no due time, yet a way forward: the way-forward check leaves it.
        assert await repair.check_once(stack.orchestrator.pool, stack.orchestrator.metrics) == []
        pending = await stack.client.get_run(run_id)
        assert pending["status"] == "running" and pending["startedAt"] is None
        assert pending["input"] == {"userId": "u1", "n": 2}
        done = await stack.client.wait_run(run_id, timeout=20)
        assert done["status"] == "completed" and done["output"] == {"userId": "u1", "n": 2}
        assert done["heldBy"] is None and "gathering" not in done
        assert _at(done["startedAt"]) >= last_start + 0.9
        events = await _history(stack, run_id)
        assert [e["type"] for e in events][:2] == ["run.started", "run.debounced"]
        assert events[1]["data"] == {"starts": 3}
        await stack.client.wait_run(other.json()["id"], timeout=20)
        runs_now = (await stack.client.list_runs(workflow="digest"))["runs"]
        assert len(runs_now) == 2
        async with httpx.AsyncClient() as plain:
            metrics = (await plain.get(stack.url + "/metrics")).text
    assert sorted(seen, key=str) == [{"userId": "u1", "n": 2}, {"userId": "u2", "n": 9}]
    assert 'stepline_debounce_absorbed_total{workflow="digest"} 2.0' in metrics
    assert 'stepline_gathered_starts_count{kind="debounce",workflow="digest"} 2.0' in metrics


async def test_max_wait_caps_a_debounce_that_keeps_being_joined(database_url: str) -> None:
    """Starts every 0.3 s keep a 1 s debounce open, but max_wait (1.5 s) fires it anyway; the
    starts after that open a new run."""
    sl, _ = _debounced(period="1s", max_wait="1.5s", key=None)
    async with orchestrator_stack(database_url) as stack, hosted(stack, sl, "push"):
        first = await stack.client.start_run("digest", {"n": 0})
        began = time.monotonic()
        ids = [first["id"]]
        n = 0
        while time.monotonic() - began < 3.0:
            await asyncio.sleep(0.3)
            n += 1
            ids.append((await stack.client.start_run("digest", {"n": n}))["id"])
        done = await stack.client.wait_run(first["id"], timeout=20)
        assert done["status"] == "completed"
        took = _at(done["startedAt"]) - _at(first["createdAt"])
        assert 1.4 <= took < 2.4, took
        later = [i for i in ids if i != first["id"]]
        assert later and len(set(ids)) >= 2
        assert ids[: ids.index(later[0])] == [first["id"]] * ids.index(later[0])
        history = await _history(stack, first["id"])
        starts = history[1]["data"]["starts"]
        assert starts == ids.count(first["id"]) and starts >= 4
        assert done["output"] == {"n": starts - 1}  # the last start it absorbed


async def test_two_orchestrators_share_one_debounce(database_url: str) -> None:
    """Starts sent at once through two orchestrators on one database join one run, which
    fires once (both gatherers run) with the last input."""
    sl, seen = _debounced(period="1s")
    async with (
        orchestrator_stack(database_url) as a,
        orchestrator_stack(database_url) as b,
        app_server(sl) as url,
    ):
        await a.register(sl, url)
        started = await asyncio.gather(
            *[
                (a if n % 2 else b).client.start_run("digest", {"userId": "u", "n": n})
                for n in range(10)
            ]
        )
        assert len({r["id"] for r in started}) == 1
        run_id = started[0]["id"]
        done = await b.client.wait_run(run_id, timeout=20)
        assert done["status"] == "completed"
        history = await _history(a, run_id)
        assert [e["type"] for e in history].count("run.debounced") == 1
        assert history[1]["data"] == {"starts": 10}
        assert done["output"] == done["input"]
    assert len(seen) == 1


async def test_two_connections_race_for_one_gathering(database_url: str) -> None:
    """Store level, two connections: a start that comes while another's transaction holds the
    key waits and joins the run that one opened; a firing skips a gathering a start holds,
    fires it once that start commits, and never twice."""
    sl, _ = _debounced(period="1ms", key=None)
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        spec = gathering.Spec(gathering.DEBOUNCE, 1, None, None, None)
        c1, c2 = await stack.conn(), await stack.conn()
        try:

            def new(n: int) -> runs.NewRun:
                return runs.NewRun(uuid.uuid4(), DEFAULT_PROJECT, "digest", {"n": n})

            tx1 = c1.transaction()
            await tx1.start()
            opened = await gatherings.gather(c1, spec, new(1))
            assert opened is not None and opened.created is not None

            async def second() -> gatherings.Gathered | None:
                async with c2.transaction():
                    return await gatherings.gather(c2, spec, new(2))

            joining = asyncio.create_task(second())
            await until(lambda: _waiting_on_lock(stack), "the second start to wait")
            await tx1.commit()
            joined = await joining
            assert joined is not None and joined.created is None
            assert joined.run_id == opened.run_id and joined.starts == 2

            async with c1.transaction():  # a start holds the gathering: the firing skips it
                await c1.fetchrow(
                    "SELECT 1 FROM run_gatherings WHERE run_id = $1 FOR UPDATE", opened.run_id
                )
                assert await gatherings.fire_due(c2) == []
            fired = await gatherings.fire_due(c2)
            assert [(f.run_id, f.starts) for f in fired] == [(opened.run_id, 2)]
            assert await gatherings.fire_due(c1) == []
        finally:
            await c1.close()
            await c2.close()


async def _waiting_on_lock(stack: Stack) -> bool:
    conn = await stack.conn()
    try:
        return bool(
            await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database()"
            )
        )
    finally:
        await conn.close()


async def test_a_restarted_orchestrator_fires_pending_debounces_and_batches(
    database_url: str,
) -> None:
    """A debounce and a batch left pending when the orchestrator stopped are fired by the next
    one on the same database: nothing of them was kept in memory."""
    sl, _ = _debounced(period="1.5s")

    @sl.workflow("mailer", on_event="email.queued", batch=stepline.Batch(10, "1.5s"))
    async def mailer(ctx: stepline.Context, input: list[Any]) -> int:
        return len(input)

    async with app_server(sl) as url:
        async with orchestrator_stack(database_url) as first:
            await first.register(sl, url)
            run = await first.client.start_run("digest", {"userId": "u", "n": 1})
            await first.client.start_run("digest", {"userId": "u", "n": 2})
            sent = [await first.client.send_event("email.queued", {"to": t}) for t in "ab"]
        async with orchestrator_stack(database_url) as second:
            done = await second.client.wait_run(run["id"], timeout=20)
            assert done["status"] == "completed" and done["output"] == {"userId": "u", "n": 2}
            [batch_id] = {s["startedRuns"][0] for s in sent}
            batch = await second.client.wait_run(batch_id, timeout=20)
            assert batch["status"] == "completed" and batch["output"] == 2
            assert batch["input"] == [{"to": "a"}, {"to": "b"}]


async def test_batches_fill_by_size_or_fire_after_their_wait(database_url: str) -> None:
    """Seven events into batches of 3 (wait 1 s): two full batches start at once, the
    seventh event's after the wait; each event names its batch's run, in the events API too,
    and each batch run's history lists its events' ids."""
    sl, seen = _batched(3, "1s")
    async with orchestrator_stack(database_url) as stack, hosted(stack, sl, "push"):
        sent = []
        for n in range(7):
            sent.append(await stack.client.send_event("email.queued", {"n": n}, id=f"ev-{n}"))
        run_ids = [s["startedRuns"] for s in sent]
        assert all(len(r) == 1 for r in run_ids)
        order = [r[0] for r in run_ids]
        assert order[0:3] == [order[0]] * 3 and order[3:6] == [order[3]] * 3
        assert len(set(order)) == 3
        full = await stack.client.wait_run(order[0], timeout=20)
        assert full["input"] == [{"n": 0}, {"n": 1}, {"n": 2}] and full["output"] == 3
        late = await stack.client.get_run(order[6])
        assert late["heldBy"] == "batch" and late["gathering"]["starts"] == 1
        async with Dashboard(stack.url) as person:
            await person.sign_in(stack.api_key)
            page = await person.get(f"/ui/runs/{order[6]}")
            assert page.status_code == 200 and "gathering-banner" in page.text
            assert "1 so far" in page.text
            listing = await person.get("/ui/workflows")
            assert "events gathered into runs of at most 3" in listing.text
        late = await stack.client.wait_run(order[6], timeout=20)
        assert late["input"] == [{"n": 6}] and late["status"] == "completed"
        assert _at(late["startedAt"]) - _at(late["createdAt"]) >= 0.9
        history = await _history(stack, order[3])
        batched = [e for e in history if e["type"] == "run.batched"]
        assert [e["data"] for e in batched] == [{"size": 3, "eventIds": ["ev-3", "ev-4", "ev-5"]}]
        listed = (await stack.client.list_events(name="email.queued"))["events"]
        assert {e["id"]: e["startedRuns"] for e in listed} == {
            f"ev-{n}": [order[n]] for n in range(7)
        }
        again = await stack.client.send_event("email.queued", {"n": 0}, id="ev-0")
        assert again["startedRuns"] == [order[0]]  # a repeated id is in no second batch
    assert sorted(len(b) for b in seen) == [1, 3, 3]


async def test_batches_group_by_key_and_take_each_event_once(database_url: str) -> None:
    """Events sent at once through two orchestrators, with a key field: each event lands in
    exactly one batch of its key's, none lost or repeated."""
    sl, seen = _batched(4, "1s", key="tenant")
    async with (
        orchestrator_stack(database_url) as a,
        orchestrator_stack(database_url) as b,
        app_server(sl) as url,
    ):
        await a.register(sl, url)
        sent = await asyncio.gather(
            *[
                (a if n % 2 else b).client.send_event(
                    "email.queued", {"tenant": "t1" if n % 3 else "t2", "n": n}
                )
                for n in range(24)
            ]
        )
        batch_ids = {s["startedRuns"][0] for s in sent}
        done = [await a.client.wait_run(r, timeout=20) for r in batch_ids]
    assert all(d["status"] == "completed" for d in done)
    gathered = [item for d in done for item in d["input"]]
    assert sorted(item["n"] for item in gathered) == list(range(24))
    for d in done:
        assert len({item["tenant"] for item in d["input"]}) == 1
        assert 1 <= len(d["input"]) <= 4
    assert sorted(item["n"] for batch in seen for item in batch) == list(range(24))


@pytest.mark.parametrize(
    ("option", "field"),
    [
        ({"debounce": {"periodMs": 5000, "maxWaitMs": 1000}}, "debounce.maxWaitMs"),
        ({"debounce": {"periodMs": 0}}, "debounce.periodMs"),
        ({"onEvent": "e", "batch": {"size": 0, "waitMs": 1000}}, "batch.size"),
        ({"batch": {"size": 2, "waitMs": 1000}}, "batch"),
    ],
)
async def test_sync_refuses_invalid_debounces_and_batches(
    database_url: str, option: dict[str, Any], field: str
) -> None:
    """A description with a debounce or batch that cannot work is 422 naming the field, and
    registers nothing; an option this orchestrator does not know is ignored."""
    async with orchestrator_stack(database_url) as stack:
        slug = await stack.register_pull()
        headers = {"authorization": f"Bearer {stack.api_key}"}
        async with httpx.AsyncClient(base_url=stack.url, headers=headers) as http:
            bad = await http.post(
                f"/v1/apps/{slug}/sync", json={"workflows": [{"name": "w", **option}]}
            )
            assert bad.status_code == 422, bad.text
            error = bad.json()["error"]
            assert error["code"] == "validation_failed"
            assert f"workflows.w.{field}" in error["details"]["fields"]
            assert (await stack.client.list_workflows())["workflows"] == []
            newer = await http.post(
                f"/v1/apps/{slug}/sync",
                json={"workflows": [{"name": "w", "someFutureOption": {"x": 1}}]},
            )
            assert newer.status_code == 200, newer.text


class Describing:
    """An app whose SDK answers ``describe`` with ``answer`` (as today's SDK does, with its
    protocol header), whatever it was asked."""

    def __init__(self, answer: dict[str, Any]) -> None:
        self.answer = answer

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        headers = [(b"content-type", b"application/json"), (b"stepline-protocol", b"4")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": json.dumps(self.answer).encode()})


@pytest.mark.parametrize("kind", ["push", "pull"])
@pytest.mark.parametrize(
    ("debounce", "field"),
    [({"periodMs": "soon"}, "debounce.periodMs"), ("soon", "debounce")],
)
async def test_a_debounce_of_the_wrong_type_is_422_naming_the_workflow(
    database_url: str, kind: str, debounce: Any, field: str
) -> None:
    """A description whose debounce is of the wrong JSON type is ``422 validation_failed``
    naming the workflow and the field, whether a push app's describe answered it or a pull
    app's worker sent it, and registers nothing; a push app's sync is not taken for an app
    that could not be reached (502)."""
    described = {"workflows": [{"name": "ok"}, {"name": "w", "debounce": debounce}]}
    async with orchestrator_stack(database_url) as stack, serve(Describing(described)) as url:
        headers = {"authorization": f"Bearer {stack.api_key}"}
        async with httpx.AsyncClient(base_url=stack.url, headers=headers) as http:
            if kind == "push":
                slug = (await stack.client.create_app("pushed", url + "/"))["slug"]
                bad = await http.post(f"/v1/apps/{slug}/sync")
            else:
                slug = await stack.register_pull()
                bad = await http.post(f"/v1/apps/{slug}/sync", json=described)
            assert bad.status_code == 422, bad.text
            error = bad.json()["error"]
            assert error["code"] == "validation_failed"
            assert list(error["details"]["fields"]) == [f"workflows.w.{field}"]
            assert error["message"].startswith(f"workflow 'w' declares an invalid {field}: ")
            assert (await stack.client.list_workflows())["workflows"] == []
            assert (await stack.client.get_app(slug))["syncedAt"] is None
