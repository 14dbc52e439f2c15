"""The failed-authentication limit: per client address (X-Forwarded-For only from trusted
proxies) and across all addresses, on the API and the dashboard's sign-in; a valid key is
never refused by it."""

from __future__ import annotations

import httpx

from tests.dashboard_forms import Dashboard
from tests.support import orchestrator_stack

BAD = {"authorization": "Bearer sl_wrong"}


def _from(address: str, key: str = "sl_wrong") -> dict[str, str]:
    return {"authorization": f"Bearer {key}", "x-forwarded-for": address}


def _limited(answer: httpx.Response) -> None:
    assert answer.status_code == 429, answer.text
    assert answer.json()["error"]["code"] == "rate_limited"
    assert 1 <= int(answer.headers["retry-after"]) <= 60


async def test_past_its_limit_an_address_gets_429_for_bad_keys_and_200_for_its_key(
    database_url: str,
) -> None:
    """Past 20 failures a minute an address's bad keys are 429 with Retry-After, while its
    valid key goes on working (one misconfigured client behind a NAT locks nobody out)."""
    async with (
        orchestrator_stack(database_url) as stack,
        httpx.AsyncClient(base_url=stack.url) as http,
    ):
        for _ in range(20):
            assert (await http.get("/v1/runs", headers=BAD)).status_code == 401
        _limited(await http.get("/v1/runs", headers=BAD))
        good = {"authorization": f"Bearer {stack.api_key}"}
        for _ in range(3):
            assert (await http.get("/v1/runs", headers=good)).status_code == 200
        _limited(await http.get("/v1/runs", headers=BAD))
        assert (await http.get("/healthz")).status_code == 200


async def test_x_forwarded_for_names_the_client_only_behind_a_trusted_proxy(
    database_url: str,
) -> None:
    """Behind a trusted proxy each forwarded client has its own count; without one the header
    is ignored and the peer is the client."""
    async with (
        orchestrator_stack(
            database_url, auth_failure_limit=3, trusted_proxies=("127.0.0.1/32",)
        ) as stack,
        httpx.AsyncClient(base_url=stack.url) as http,
    ):
        for _ in range(3):
            assert (await http.get("/v1/runs", headers=_from("192.0.2.1"))).status_code == 401
        _limited(await http.get("/v1/runs", headers=_from("192.0.2.1")))
        _limited(await http.get("/v1/runs", headers=_from("192.0.2.1, 127.0.0.1")))
        assert (await http.get("/v1/runs", headers=_from("192.0.2.2"))).status_code == 401
        forged = _from("192.0.2.1, 192.0.2.3")  # the proxy appended the real client last
        assert (await http.get("/v1/runs", headers=forged)).status_code == 401
    async with (
        orchestrator_stack(database_url, auth_failure_limit=3) as stack,
        httpx.AsyncClient(base_url=stack.url) as http,
    ):
        for n in range(3):
            answer = await http.get("/v1/runs", headers=_from(f"192.0.2.{n + 10}"))
            assert answer.status_code == 401
        _limited(await http.get("/v1/runs", headers=_from("192.0.2.99")))


async def test_guessing_spread_over_many_addresses_meets_the_global_budget(
    database_url: str,
) -> None:
    """Past the budget of failures over all addresses, a guess from a fresh address is 429
    too; a valid key from a fresh address still works."""
    async with (
        orchestrator_stack(
            database_url,
            auth_failure_limit=1000,
            auth_failure_budget=10,
            auth_failure_delay_seconds=0.0,
            trusted_proxies=("127.0.0.1/32",),
        ) as stack,
        httpx.AsyncClient(base_url=stack.url) as http,
    ):
        for n in range(10):
            answer = await http.get("/v1/runs", headers=_from(f"198.51.100.{n}"))
            assert answer.status_code == 401
        _limited(await http.get("/v1/runs", headers=_from("198.51.100.200")))
        good = await http.get("/v1/runs", headers=_from("198.51.100.201", stack.api_key))
        assert good.status_code == 200


async def test_dashboard_sign_in_is_limited_the_same_way(database_url: str) -> None:
    """Past the limit, a sign-in with a wrong key says to wait (429, Retry-After); the right
    key still signs in."""
    async with (
        orchestrator_stack(database_url, auth_failure_limit=3) as stack,
        Dashboard(stack.url) as ui,
    ):
        for _ in range(3):
            page = await ui.sign_in("sl_guess")
            assert page.status_code == 401 and "That API key is not valid." in page.text
        page = await ui.sign_in("sl_guess")
        assert page.status_code == 429, page.text[:300]
        assert "too many sign-ins failed" in page.text
        assert 1 <= int(page.headers["retry-after"]) <= 60
        page = await ui.sign_in(stack.api_key)
        assert page.url.path == "/ui/runs" and "Sign out" in page.text
