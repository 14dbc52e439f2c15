"""Dashboard sessions live in the database: the cookie holds an opaque id; signing out and
revoking the key end the session for every copy of the cookie; a key made on the Keys page is
shown once in the page and never travels in a cookie."""

from __future__ import annotations

import json
from typing import Any

import httpx

from stepline_server.store import keys
from tests.dashboard_forms import Dashboard, cookie_payload
from tests.support import Stack, orchestrator_stack


def _cookie_payload(value: str) -> dict[str, Any]:
    """What the signed (not encrypted) cookie says, as anyone holding it can read."""
    payload: dict[str, Any] = cookie_payload(value)
    return payload


async def _key(stack: Stack, role: str) -> str:
    async with stack.orchestrator.pool.acquire() as conn:
        return await keys.create_key(conn, f"a {role} key", keys.DEFAULT_PROJECT, role)


async def _signed_in(url: str, cookies: httpx.Cookies) -> bool:
    async with httpx.AsyncClient(base_url=url, cookies=cookies, follow_redirects=True) as http:
        page = await http.get("/ui/runs")
    return page.url.path == "/ui/runs" and "Sign out" in page.text


async def test_a_copied_cookie_stops_working_at_sign_out(database_url: str) -> None:
    """The cookie carries an opaque session id, not the key nor its hash; once its owner signs
    out, a copy of the cookie taken before is signed out too."""
    async with orchestrator_stack(database_url) as stack, Dashboard(stack.url) as ui:
        await ui.sign_in(stack.api_key)
        copied = httpx.Cookies(ui.http.cookies)
        payload = _cookie_payload(ui.http.cookies["stepline_session"])
        assert set(payload) == {"c", "s", "f"}, payload
        assert keys.hash_key(stack.api_key) not in json.dumps(payload)
        assert stack.api_key not in json.dumps(payload)
        assert await _signed_in(stack.url, copied)
        page = await ui.post("/ui/logout")
        assert page.url.path == "/ui/login"
        assert not await _signed_in(stack.url, copied)


async def test_revoking_a_key_ends_its_dashboard_sessions(database_url: str) -> None:
    """A person signed in with a key is signed out as soon as the key is revoked."""
    async with orchestrator_stack(database_url) as stack, Dashboard(stack.url) as ui:
        write = await _key(stack, "write")
        await ui.sign_in(write)
        assert await _signed_in(stack.url, ui.http.cookies)
        key_id = next(k["id"] for k in await _list_keys(stack) if k["role"] == "write")
        async with httpx.AsyncClient(
            base_url=stack.url, headers={"authorization": f"Bearer {stack.api_key}"}
        ) as http:
            assert (await http.delete(f"/v1/keys/{key_id}")).status_code == 204
        page = await ui.get("/ui/runs")
        assert page.url.path == "/ui/login"


async def _list_keys(stack: Stack) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(
        base_url=stack.url, headers={"authorization": f"Bearer {stack.api_key}"}
    ) as http:
        listed: list[dict[str, Any]] = (await http.get("/v1/keys")).json()["keys"]
    return listed


async def test_a_key_made_on_the_keys_page_is_shown_once_and_never_in_a_cookie(
    database_url: str,
) -> None:
    """The new key is in the page that answers the form, in no Set-Cookie header and in no
    later page; it works on the API."""
    async with orchestrator_stack(database_url) as stack, Dashboard(stack.url) as ui:
        await ui.sign_in(stack.api_key)
        await ui.get("/ui/keys")
        page = await ui.post("/ui/keys", name="viewer", role="read")
        assert page.status_code == 201, page.text[:300]
        made = page.text.split('id="new-key">', 1)[1].split("<", 1)[0]
        assert made.startswith("sl_")
        for response in [*page.history, page]:
            for header in response.headers.get_list("set-cookie"):
                assert made not in header
                value = header.split("=", 1)[1].split(";", 1)[0]
                assert made not in json.dumps(_cookie_payload(value))
        again = await ui.get("/ui/keys")
        assert made not in again.text and "viewer" in again.text
        async with httpx.AsyncClient(
            base_url=stack.url, headers={"authorization": f"Bearer {made}"}
        ) as http:
            assert (await http.get("/v1/runs")).status_code == 200
