"""``STEPLINE_DATABASE_READ_URL``: lists, searches and metrics read from the replica it names,
while a client's own writes are read back from the primary. The replica here is a proxy in
front of the test database, cut to show which reads go to it."""

from __future__ import annotations

import httpx

import stepline
from stepline_server.settings import from_env
from tests.dbproxy import proxied
from tests.support import app_server, orchestrator_stack


def test_the_read_url_is_read_from_the_environment() -> None:
    """``STEPLINE_DATABASE_READ_URL`` sets the replica; unset, reads go to the primary."""
    url = "postgresql://replica.invalid/db"
    assert from_env({"STEPLINE_DATABASE_READ_URL": url}).database_read_url == url
    assert from_env({}).database_read_url is None


async def test_lists_read_the_replica_and_a_client_reads_its_own_writes(database_url: str) -> None:
    """With the replica away, run lists and searches answer 503 while a start and the started
    run's read (from the primary) answer; with it back, the list finds the run."""
    sl = stepline.Stepline("read-replica-secret")

    @sl.workflow("read")
    async def read(ctx: stepline.Context, input: int) -> int:
        return input

    async with (
        proxied(database_url) as (replica, read_dsn),
        orchestrator_stack(database_url, database_read_url=read_dsn) as stack,
        app_server(sl) as url,
    ):
        await stack.register(sl, url)
        headers = {"authorization": f"Bearer {stack.api_key}"}
        async with httpx.AsyncClient(base_url=stack.url, headers=headers) as http:
            await replica.cut()
            started = await http.post("/v1/runs", json={"workflow": "read", "input": 7})
            assert started.status_code == 201, started.text
            run_id = started.json()["id"]
            mine = await http.get(f"/v1/runs/{run_id}")
            assert mine.status_code == 200 and mine.json()["id"] == run_id
            for path in ("/v1/runs", "/v1/workflows", "/v1/schedules", "/v1/operations"):
                away = await http.get(path)
                assert away.status_code == 503, (path, away.text)
                assert away.json()["error"]["code"] == "unavailable"
            assert (await http.get("/readyz")).status_code == 200  # the primary is there
            await replica.restore()
            listed = await http.get("/v1/runs", params={"workflow": "read"})
            assert [r["id"] for r in listed.json()["runs"]] == [run_id]
