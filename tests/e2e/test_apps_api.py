"""Apps over HTTP: renaming onto a taken name, and app URLs the orchestrator could not call."""

from __future__ import annotations

from typing import Any

import httpx

from stepline_server.engine.egress import app_url
from stepline_server.store import apps, keys
from tests.support import Stack, free_port, orchestrator_stack

# Each is refused at registration and at PATCH: the orchestrator could not send a request to it.
UNCALLABLE = [
    "ftp://127.0.0.1/stepline",
    "file:///etc/passwd",
    "127.0.0.1:8401/stepline",
    "http:///stepline",
    "http://127.0.0.1:99999/stepline",
    "http://127.0.0.1:0/stepline",
    "http://127.0.0.1:-1/stepline",
    "http://127.0.0.1:http/stepline",
    "http://127.0.0.1/step\x00line",
    "http://127.0.0.1/step line",
    "http://127.0.0.1/step\r\nX-Injected: 1",
    "http://127.0.0.1/\x7f",
    "http://exa..mple/",
    "http://ex<ample/",
    "http://" + "a" * 64 + ".example/",
    "http://[::1/",
    "http://[not-ipv6]/",
    "http://127.0.0.1/" + "x" * 2100,
]


def _client(stack: Stack) -> httpx.AsyncClient:
    headers = {"authorization": f"Bearer {stack.api_key}"}
    return httpx.AsyncClient(base_url=stack.url, headers=headers)


def _refused(response: httpx.Response, field: str) -> None:
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "validation_failed" and field in error["details"]["fields"], error


async def _create(http: httpx.AsyncClient, name: str, url: str) -> dict[str, Any]:
    response = await http.post("/v1/apps", json={"name": name, "url": url})
    assert response.status_code == 201, response.text
    return response.json()  # type: ignore[no-any-return]


async def test_renaming_an_app_to_a_taken_name_is_a_conflict_that_changes_nothing(
    database_url: str,
) -> None:
    """PATCH an app to another app's name answers 409 invalid_state and changes neither app,
    not even the URL sent with the name."""
    async with orchestrator_stack(database_url) as stack, _client(stack) as http:
        first = await _create(http, "first", "http://127.0.0.1:9/first")
        second = await _create(http, "second", "http://127.0.0.1:9/second")
        response = await http.patch(
            f"/v1/apps/{first['slug']}", json={"name": "second", "url": "http://127.0.0.1:9/new"}
        )
        assert response.status_code == 409, response.text
        error = response.json()["error"]
        assert error["code"] == "invalid_state" and "second" in error["message"]
        for app, name in ((first, "first"), (second, "second")):
            now = (await http.get(f"/v1/apps/{app['slug']}")).json()
            assert (now["name"], now["url"]) == (name, app["url"])
        renamed = await http.patch(f"/v1/apps/{first['slug']}", json={"name": "third"})
        assert renamed.status_code == 200 and renamed.json()["name"] == "third"


async def test_app_urls_the_orchestrator_cannot_call_are_refused(database_url: str) -> None:
    """A URL that is not http(s), has no host, a port outside 1-65535, whitespace, a NUL or
    another control character, or a host that is not a host name is 422 validation_failed
    naming url, at registration and at PATCH; nothing is created or changed."""
    async with orchestrator_stack(database_url) as stack, _client(stack) as http:
        app = await _create(http, "kept", "http://127.0.0.1:9/kept")
        for url in UNCALLABLE:
            _refused(await http.post("/v1/apps", json={"name": "bad", "url": url}), "url")
            _refused(await http.patch(f"/v1/apps/{app['slug']}", json={"url": url}), "url")
        listed = (await http.get("/v1/apps")).json()["apps"]
        assert [(a["name"], a["url"]) for a in listed] == [("kept", "http://127.0.0.1:9/kept")]


async def test_non_ascii_app_urls_are_stored_encoded_and_sync_answers_502(
    database_url: str,
) -> None:
    """A non-ASCII host is written in its IDNA form and a non-ASCII path percent-encoded, so the
    orchestrator can send the request: syncing an app that is not there is 502, not 500. (The
    host is checked as a value only: registering it would resolve a name that is not loopback.)"""
    idna = app_url("https://bücher.example:8443/päth?q=é")
    assert idna == "https://xn--bcher-kva.example:8443/p%C3%A4th?q=%C3%A9"
    async with orchestrator_stack(database_url) as stack, _client(stack) as http:
        port = free_port()  # nothing listens there
        app = await _create(http, "away", f"http://127.0.0.1:{port}/ステップ")
        assert app["url"] == f"http://127.0.0.1:{port}/%E3%82%B9%E3%83%86%E3%83%83%E3%83%97"
        patched = await http.patch(
            f"/v1/apps/{app['slug']}", json={"url": f"http://127.0.0.1:{port}/ĉapo"}
        )
        assert patched.status_code == 200 and patched.json()["url"].endswith("/%C4%89apo")
        synced = await http.post(f"/v1/apps/{app['slug']}/sync")
        assert synced.status_code == 502, synced.text
        assert synced.json()["error"]["code"] == "app_unreachable"


async def test_syncing_an_app_stored_with_an_uncallable_url_is_502(database_url: str) -> None:
    """An app whose stored URL cannot be called (registered before URLs were checked) answers
    sync with 502 app_unreachable saying why, not 500."""
    async with orchestrator_stack(database_url) as stack, _client(stack) as http:
        async with stack.orchestrator.pool.acquire() as conn:
            row = await apps.create(conn, keys.DEFAULT_PROJECT, "old", "http://127.0.0.1:99999/")
        synced = await http.post(f"/v1/apps/{row['slug']}/sync")
        assert synced.status_code == 502, synced.text
        error = synced.json()["error"]
        assert error["code"] == "app_unreachable" and "port" in error["message"]
