"""Definition versions: a sync that changes an app's workflows makes the environment's next
version; a sync that changes nothing keeps it; each run records the version it started under."""

from __future__ import annotations

from typing import Any

import stepline
from tests.support import app_server, free_port, orchestrator_stack


def app_with(retries: int) -> stepline.Stepline:
    sl = stepline.Stepline("versions-secret")

    @sl.workflow("versioned", retries=retries)
    async def versioned(ctx: stepline.Context, input: Any) -> Any:
        return input

    return sl


async def test_a_changing_sync_makes_the_next_version_and_runs_keep_theirs(
    database_url: str,
) -> None:
    """v1 at the first sync; the same code synced again stays v1; changed options make v2; a
    run started before keeps 1, one started after has 2."""
    port = free_port()
    async with orchestrator_stack(database_url) as stack:
        first = app_with(2)
        async with app_server(first, port) as url:
            slug = await stack.register(first, url)
            await stack.client.sync_app(slug)
            [wf] = (await stack.client.list_workflows())["workflows"]
            assert wf["version"] == 1
            before = await stack.client.start_run("versioned", 1)
            await stack.client.wait_run(before["id"], timeout=30)
        changed = app_with(5)
        async with app_server(changed, port):
            await stack.client.sync_app(slug)
            [wf] = (await stack.client.list_workflows())["workflows"]
            assert wf["version"] == 2
            after = await stack.client.start_run("versioned", 2)
            await stack.client.wait_run(after["id"], timeout=30)
        assert (await stack.client.get_run(before["id"]))["version"] == 1
        assert (await stack.client.get_run(after["id"]))["version"] == 2
