"""Apps over HTTP: renaming onto a taken name."""

from __future__ import annotations

from typing import Any

import httpx

from tests.support import Stack, orchestrator_stack


def _client(stack: Stack) -> httpx.AsyncClient:
    headers = {"authorization": f"Bearer {stack.api_key}"}
    return httpx.AsyncClient(base_url=stack.url, headers=headers)


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
