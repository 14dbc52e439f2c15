"""Who may make keys: an environment's admin makes keys of its own environment only (roles up
to admin); an owner key (the project's) manages every environment, on the API and on the
dashboard's Keys page."""

from __future__ import annotations

from typing import Any

import httpx

from stepline_server.store import keys
from tests.dashboard_forms import Dashboard
from tests.support import Stack, orchestrator_stack


async def _key(stack: Stack, role: str, environment: str) -> str:
    async with stack.orchestrator.pool.acquire() as conn:
        env = await keys.find_environment(conn, keys.DEFAULT_PROJECT, environment)
        assert env is not None
        return await keys.create_key(conn, f"{environment} {role}", env["id"], role)


def _http(stack: Stack, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=stack.url, headers={"authorization": f"Bearer {key}"})


async def _production_keys(stack: Stack) -> list[Any]:
    async with stack.orchestrator.pool.acquire() as conn:
        return await keys.environment_keys(conn, keys.DEFAULT_ENVIRONMENT)


async def test_an_environment_admin_cannot_make_keys_of_another_environment(
    database_url: str,
) -> None:
    """A staging admin asking for a production admin key (or an owner key, or an environment)
    is 403 and nothing is made; it still makes keys of staging."""
    async with orchestrator_stack(database_url) as stack:
        staging = await _key(stack, "admin", "staging")
        before = len(await _production_keys(stack))
        async with _http(stack, staging) as http:
            for body in [
                {"name": "escalate", "role": "admin", "environment": "production"},
                {"name": "escalate", "role": "read", "environment": "production"},
                {"name": "escalate", "role": "owner"},
            ]:
                answer = await http.post("/v1/keys", json=body)
                assert answer.status_code == 403, answer.text
                assert answer.json()["error"]["code"] == "forbidden"
            made = await http.post("/v1/environments", json={"name": "mine"})
            assert made.status_code == 403, made.text
            message = made.json()["error"]["message"]
            assert message == "an admin key cannot do this; it needs an owner key", message
            ok = await http.post("/v1/keys", json={"name": "ci", "role": "write"})
            assert ok.status_code == 201 and ok.json()["environment"] == "staging", ok.text
            listed = (await http.get("/v1/keys")).json()["keys"]
            assert {k["environment"] for k in listed} == {"staging"}
        assert len(await _production_keys(stack)) == before


async def test_an_owner_key_manages_every_environment(database_url: str) -> None:
    """An owner key makes keys of any environment and role, makes environments, lists and
    revokes every environment's keys; an admin cannot revoke it."""
    async with orchestrator_stack(database_url) as stack:
        owner = await _key(stack, "owner", "production")
        async with _http(stack, owner) as http:
            made = await http.post(
                "/v1/keys", json={"name": "stg", "role": "admin", "environment": "staging"}
            )
            assert made.status_code == 201 and made.json()["environment"] == "staging", made.text
            env = await http.post("/v1/environments", json={"name": "preview"})
            assert env.status_code == 201, env.text
            listed = (await http.get("/v1/keys")).json()["keys"]
            assert {"production", "staging"} <= {k["environment"] for k in listed}
            owner_id = next(k["id"] for k in listed if k["role"] == "owner")
            async with _http(stack, made.json()["key"]) as staging_admin:
                answer = await staging_admin.delete(f"/v1/keys/{owner_id}")
                assert answer.status_code == 404, answer.text
            async with _http(stack, stack.api_key) as production_admin:
                answer = await production_admin.delete(f"/v1/keys/{owner_id}")
                assert answer.status_code == 404, answer.text
            gone = await http.delete(f"/v1/keys/{made.json()['id']}")
            assert gone.status_code == 204, gone.text


async def test_the_keys_page_follows_the_same_roles(database_url: str) -> None:
    """On the Keys page a staging admin is offered roles up to admin of staging only, and a
    forged request for another environment makes nothing; an owner picks the environment."""
    async with orchestrator_stack(database_url) as stack:
        staging = await _key(stack, "admin", "staging")
        owner = await _key(stack, "owner", "production")
        before = len(await _production_keys(stack))
        async with Dashboard(stack.url) as ui:
            await ui.sign_in(staging)
            page = await ui.get("/ui/keys")
            assert "<option>owner</option>" not in page.text
            assert 'name="environment"' not in page.text
            page = await ui.post("/ui/keys", name="x", role="admin", environment="production")
            assert ui.flash(page) == "Not made: an admin key makes keys of its environment."
            page = await ui.post("/ui/keys", name="x", role="owner")
            assert ui.flash(page).startswith("Not made:")
        assert len(await _production_keys(stack)) == before
        async with Dashboard(stack.url) as ui:
            await ui.sign_in(owner)
            page = await ui.get("/ui/keys")
            assert "<option>owner</option>" in page.text and 'name="environment"' in page.text
            page = await ui.post("/ui/keys", name="prod-ci", role="write", environment="staging")
            assert page.status_code == 201, page.text[:300]
            assert "Key prod-ci (write, staging) made" in page.text
