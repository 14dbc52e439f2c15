"""Rotating an app's signing secret: the new one signs from then on, and no run fails."""

from __future__ import annotations

from typing import Any

import httpx

import stepline
from tests.support import app_server, orchestrator_stack


async def test_rotation_fails_no_run(database_url: str) -> None:
    """Runs started before, during and after a rotation all complete; the secret shows once."""
    sl = stepline.Stepline("old-secret")

    @sl.workflow("nap")
    async def nap(ctx: stepline.Context, input: Any) -> Any:
        await ctx.sleep("nap", "1s")
        return await ctx.step("done", lambda: input)

    async with orchestrator_stack(database_url) as stack, app_server(sl) as app_url:
        slug = await stack.register(sl, app_url)
        before = await stack.client.start_run("nap", 1)
        async with httpx.AsyncClient(base_url=stack.url) as http:
            auth = {"authorization": f"Bearer {stack.api_key}"}
            rotated = await http.post(f"/v1/apps/{slug}/rotate-secret", headers=auth)
            assert rotated.status_code == 200, rotated.text
            new = rotated.json()["signingSecret"]
            assert new != "old-secret"
            assert "signingSecret" not in (await http.get(f"/v1/apps/{slug}", headers=auth)).json()
        # The app learns the new secret (and keeps the old one) as a deploy would.
        sl.signing_secrets = (new, "old-secret")
        during = await stack.client.start_run("nap", 2)
        for run in (before, during):
            ended = await stack.client.wait_run(run["id"], timeout=30)
            assert ended["status"] == "completed", ended
        sl.signing_secrets = (new,)
        after = await stack.client.start_run("nap", 3)
        assert (await stack.client.wait_run(after["id"], timeout=30))["status"] == "completed"
