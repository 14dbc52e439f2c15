"""A run's runKey over real HTTP: its id is derived from the environment and the key
(``ids.run_key_id``), so one key names one run in an environment, another in another; a run
whose key was given before ids were derived (a random id) is still found by its key."""

from __future__ import annotations

import os
from typing import Any

import httpx
import pytest

import stepline
from stepline_server.engine import ids
from stepline_server.store import apps, keys, runs
from tests.support import app_server, orchestrator_stack


def _keyed_app() -> stepline.Stepline:
    sl = stepline.Stepline("run-keys-secret")

    @sl.workflow("keyed")
    async def keyed(ctx: stepline.Context, input: Any) -> Any:
        return {"echo": input}

    return sl


async def test_a_run_key_names_one_run_in_an_environment_and_another_elsewhere(
    database_url: str,
) -> None:
    sl = _keyed_app()
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        async with stack.orchestrator.pool.acquire() as conn:
            production = await keys.find_environment(conn, keys.DEFAULT_PROJECT, "production")
            staging = await keys.find_environment(conn, keys.DEFAULT_PROJECT, "staging")
            assert production is not None and staging is not None
            staging_key = await keys.create_key(conn, "staging", staging["id"])
            app = await apps.create(conn, staging["id"], "app", url, sl.signing_secrets[0])
            assert app is not None
        async with stepline.AsyncClient(stack.url, api_key=staging_key) as other:
            await other.sync_app(app["slug"])
            once = await stack.client.start_run("keyed", {"n": 1}, run_key="order-1")
            again = await stack.client.start_run("keyed", {"n": 1}, run_key="order-1")
            there = await other.start_run("keyed", {"n": 1}, run_key="order-1")

            assert once["id"] == str(ids.run_key_id(production["id"], "order-1"))
            assert again["id"] == once["id"] and again.get("deduplicated") is True
            assert "deduplicated" not in once and "deduplicated" not in there
            assert there["id"] == str(ids.run_key_id(staging["id"], "order-1"))
            assert there["id"] != once["id"]
            for client, run in ((stack.client, once), (other, there)):
                done = await client.wait_run(run["id"], timeout=30)
                assert done["status"] == "completed" and done["output"] == {"echo": {"n": 1}}
            # The key with another input names the same run: a conflict, nothing started.
            headers = {"authorization": f"Bearer {stack.api_key}"}
            async with httpx.AsyncClient(base_url=stack.url, headers=headers) as http:
                answer = await http.post(
                    "/v1/runs",
                    json={"workflow": "keyed", "input": {"n": 2}, "runKey": "order-1"},
                )
                assert answer.status_code == 409, answer.text
                assert answer.json()["error"]["code"] == "run_key_conflict"
                listed = (await http.get("/v1/runs", params={"workflow": "keyed"})).json()
            assert [r["id"] for r in listed["runs"]] == [once["id"]]
    await sl.aclose()


@pytest.mark.skipif(
    bool(os.environ.get("STEPLINE_TEST_CITUS")),
    reason="plain PostgreSQL only: on Citus the unique index on the key is not unique, and a run"
    " keyed with a random id (one moved there from a single PostgreSQL) does not hold its key"
    " (docs/scaling.md, runKey uniqueness)",
)
async def test_a_run_keyed_before_ids_were_derived_is_found_by_its_key(
    database_url: str,
) -> None:
    """On plain PostgreSQL the unique index on (environment, runKey) stays: a run made with a
    random id and a key (as runs were before) is what a start with that key answers."""
    sl = _keyed_app()
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        async with stack.orchestrator.pool.acquire() as conn:
            production = await keys.find_environment(conn, keys.DEFAULT_PROJECT, "production")
            assert production is not None
            old = runs.NewRun(ids.new_id(), production["id"], "keyed", {"n": 1}, run_key="old-1")
            assert await runs.insert(conn, old) is not None
        started = await stack.client.start_run("keyed", {"n": 1}, run_key="old-1")
        assert started["id"] == str(old.id) and started.get("deduplicated") is True
        assert started["id"] != str(ids.run_key_id(production["id"], "old-1"))
        done = await stack.client.wait_run(started["id"], timeout=30)
        assert done["status"] == "completed"
    await sl.aclose()
