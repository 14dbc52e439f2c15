"""Where the orchestrator's calls may go, with loopback stand-ins only: an "internal service" on
127.0.0.1 outside STEPLINE_APP_NETWORKS, a redirect to another local port, a 17 MiB answer, an
HTML answer holding a (fake) secret. No test here calls or registers any other address."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import httpx
import pytest

import stepline
from stepline_server.store import apps, keys
from tests.support import Stack, app_server, orchestrator_stack, read_body, serve

FAKE_SECRET = "AWS_SECRET_ACCESS_KEY=fake0123456789abcdefEXAMPLEKEY"
ONLY_TEN = ("10.0.0.0/8",)  # does not list loopback


def _http(stack: Stack) -> httpx.AsyncClient:
    headers = {"authorization": f"Bearer {stack.api_key}"}
    return httpx.AsyncClient(base_url=stack.url, headers=headers)


def internal_service(
    calls: Counter[str], status: int = 500, body: bytes = b"", *, protocol: bool = False
) -> Any:
    """A raw ASGI server counting its requests and answering ``status`` with ``body`` as HTML
    (with the SDK's protocol header when ``protocol``)."""
    answer = body or f"<html><pre>{FAKE_SECRET}</pre></html>".encode()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await read_body(receive)
        calls[scope["path"]] += 1
        headers = [(b"content-type", b"text/html")]
        if protocol:
            headers.append((b"stepline-protocol", b"1"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": answer})

    return app


async def _store(stack: Stack, name: str, url: str, secret: str | None = None) -> str:
    """An app row written straight to the store, as if registered under other rules."""
    async with stack.orchestrator.pool.acquire() as conn:
        row = await apps.create(conn, keys.DEFAULT_PROJECT, name, url, secret)
    assert row is not None
    return str(row["slug"])


def _refused_url(response: httpx.Response) -> str:
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "validation_failed" and "url" in error["details"]["fields"], error
    return str(error["details"]["fields"]["url"])


async def test_an_internal_service_outside_the_app_networks_is_refused_and_never_called(
    database_url: str,
) -> None:
    """With STEPLINE_APP_NETWORKS not listing loopback, registering or PATCHing an app at a
    127.0.0.1 or [::1] service is 422 naming url, and syncing one stored anyway is 502 that
    quotes nothing of it: the service receives no request."""
    calls: Counter[str] = Counter()
    async with (
        orchestrator_stack(database_url, app_networks=ONLY_TEN) as stack,
        serve(internal_service(calls)) as url,
        _http(stack) as http,
    ):
        port = url.rsplit(":", 1)[1]
        for target in (f"{url}/internal", f"http://[::1]:{port}/internal"):
            reason = _refused_url(await http.post("/v1/apps", json={"name": "x", "url": target}))
            assert "outside the networks" in reason
        slug = await _store(stack, "internal", f"{url}/internal")
        reason = _refused_url(await http.patch(f"/v1/apps/{slug}", json={"url": f"{url}/other"}))
        assert "outside the networks" in reason
        assert (await http.get(f"/v1/apps/{slug}")).json()["url"] == f"{url}/internal"
        synced = await http.post(f"/v1/apps/{slug}/sync")
        assert synced.status_code == 502, synced.text
        message = synced.json()["error"]["message"]
        assert "refused to connect" in message and "AWS_SECRET" not in message
        assert (await http.get("/v1/apps")).json()["apps"][0]["name"] == "internal"
    assert calls == Counter()


async def test_loopback_is_allowed_when_listed_and_by_default(database_url: str) -> None:
    """127.0.0.1 apps register and sync when STEPLINE_APP_NETWORKS lists 127.0.0.0/8, and with
    no list at all (every address but link-local)."""
    sl = stepline.Stepline("egress-secret")

    @sl.workflow("noop")
    async def noop(ctx: stepline.Context, input: Any) -> None:
        return None

    for networks in (("127.0.0.0/8",), ()):
        async with (
            orchestrator_stack(database_url, app_networks=networks) as stack,
            app_server(sl) as url,
            _http(stack) as http,
        ):
            name = f"ok{len(networks)}"
            made = await http.post("/v1/apps", json={"name": name, "url": url})
            assert made.status_code == 201, made.text
            slug = made.json()["slug"]
            sl.signing_secrets = (made.json()["signingSecret"],)
            # the second app takes the workflow the first one synced
            synced = await http.post(f"/v1/apps/{slug}/sync", params={"takeOver": "true"})
            assert synced.status_code == 200, synced.text


async def test_an_invocation_to_a_refused_address_is_a_delivery_failure_not_a_call(
    database_url: str,
) -> None:
    """An app synced under the default rules, then invoked by an orchestrator whose
    STEPLINE_APP_NETWORKS leaves loopback out, is never called: every delivery fails with the
    refusal and the run fails app_unreachable."""
    ran: list[int] = []
    sl = stepline.Stepline("egress-secret")

    @sl.workflow("guarded")
    async def guarded(ctx: stepline.Context, input: Any) -> None:
        ran.append(1)

    async with app_server(sl) as url:
        async with orchestrator_stack(database_url) as stack:
            await stack.register(sl, url, "guarded")
        async with orchestrator_stack(
            database_url, app_networks=ONLY_TEN, delivery_window_seconds=1.5
        ) as stack:
            run = await stack.client.start_run("guarded", {})
            done = await stack.client.wait_run(run["id"], timeout=30)
            assert done["status"] == "failed", done
            assert done["error"]["code"] == "app_unreachable"
            assert "refused to connect" in done["error"]["message"]
            events = [e async for e in stack.client.iter_run_events(run["id"])]
            ended = [e for e in events if e["type"] == "invocation.ended"]
            assert ended and all("refused to connect" in e["data"]["error"] for e in ended)
    assert ran == []


def _redirecting(to: str, sdk_app: Any) -> Any:
    """Answers ``/old`` with a 307 to ``to``; hands every other path to ``sdk_app``."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/old":
            await read_body(receive)
            headers = [(b"location", to.encode())]
            await send({"type": "http.response.start", "status": 307, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
            return
        await sdk_app(scope, receive, send)

    return app


async def test_redirects_are_followed_within_the_same_origin_only(database_url: str) -> None:
    """A 307 to another local port is not followed (the other server receives nothing and the
    sync is 502); a 307 to another path of the same origin is followed and the sync works."""
    sl = stepline.Stepline("redirect-secret")

    @sl.workflow("here")
    async def here(ctx: stepline.Context, input: Any) -> None:
        return None

    calls: Counter[str] = Counter()
    async with (
        orchestrator_stack(database_url) as stack,
        serve(internal_service(calls, status=200, body=b"{}")) as elsewhere,
        serve(_redirecting(f"{elsewhere}/stolen", sl.asgi())) as away,
        _http(stack) as http,
    ):
        slug = await _store(stack, "away", f"{away}/old", sl.signing_secrets[0])
        synced = await http.post(f"/v1/apps/{slug}/sync")
        assert synced.status_code == 502, synced.text
        assert "another origin" in synced.json()["error"]["message"]
        assert calls == Counter()
    async with (
        orchestrator_stack(database_url) as stack,
        serve(_redirecting("/stepline/", sl.asgi())) as near,
        _http(stack) as http,
    ):
        slug = await _store(stack, "near", f"{near}/old", sl.signing_secrets[0])
        synced = await http.post(f"/v1/apps/{slug}/sync")
        assert synced.status_code == 200, synced.text
        assert [w["name"] for w in synced.json()["workflows"]] == ["here"]


def _huge(framing: str, sent: list[int]) -> Any:
    """Answers 200 with 17 MiB (announced with Content-Length, or chunked), counting bytes sent."""
    size, piece = 17 * 1024 * 1024, b"x" * (1024 * 1024)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await read_body(receive)
        headers = [(b"content-type", b"application/json")]
        if framing == "length":
            headers.append((b"content-length", str(size).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for _ in range(size // len(piece)):
            await send({"type": "http.response.body", "body": piece, "more_body": True})
            sent[0] += len(piece)
        await send({"type": "http.response.body", "body": b""})

    return app


@pytest.mark.parametrize("framing", ["length", "chunked"])
async def test_an_answer_over_16_mib_is_cut_off(database_url: str, framing: str) -> None:
    """A 17 MiB answer (Content-Length or chunked) is cut off without being read whole: the
    sync is 502 saying so, and the orchestrator still answers."""
    sent = [0]
    async with (
        orchestrator_stack(database_url) as stack,
        serve(_huge(framing, sent)) as url,
        _http(stack) as http,
    ):
        slug = await _store(stack, "huge", f"{url}/")
        synced = await http.post(f"/v1/apps/{slug}/sync")
        assert synced.status_code == 502, synced.text
        assert "cut off" in synced.json()["error"]["message"]
        assert (await http.get("/v1/apps")).status_code == 200


@pytest.mark.parametrize("status", [500, 200])
async def test_an_app_answer_that_is_not_the_sdk_error_is_not_echoed(
    database_url: str, status: int
) -> None:
    """An HTML answer holding a secret (as an error or as a 200) is reported by its status
    alone: none of it reaches the caller."""
    calls: Counter[str] = Counter()
    async with (
        orchestrator_stack(database_url) as stack,
        serve(internal_service(calls, status=status)) as url,
        _http(stack) as http,
    ):
        slug = await _store(stack, "leaky", f"{url}/")
        synced = await http.post(f"/v1/apps/{slug}/sync")
        assert synced.status_code == 502, synced.text
        assert f"HTTP {status}" in synced.text
        assert "AWS_SECRET" not in synced.text and "fake0123" not in synced.text
    assert calls["/"] == 1


async def test_the_sdk_json_error_is_quoted_briefly(database_url: str) -> None:
    """The SDK's own JSON error (here a signature refused) is quoted as code and message, at
    most 200 characters of it."""
    sl = stepline.Stepline("the-real-secret")
    long_message = json.dumps({"error": {"code": "teapot", "message": "m" * 500}}).encode()
    calls: Counter[str] = Counter()
    async with (
        orchestrator_stack(database_url) as stack,
        app_server(sl) as url,
        serve(internal_service(calls, status=418, body=long_message, protocol=True)) as chatty,
        _http(stack) as http,
    ):
        slug = await _store(stack, "wrong", url, "not-the-secret")
        message = (await http.post(f"/v1/apps/{slug}/sync")).json()["error"]["message"]
        assert "HTTP 401: unauthorized: " in message
        slug = await _store(stack, "chatty", f"{chatty}/")
        message = (await http.post(f"/v1/apps/{slug}/sync")).json()["error"]["message"]
        quoted = message.split("HTTP 418: ", 1)[1]
        assert quoted.startswith("teapot: mmm") and len(quoted) == 200


async def test_a_described_workflow_name_is_quoted_briefly(database_url: str) -> None:
    """A describe answer naming an invalid workflow of 5,000 characters is refused with at most
    64 of them quoted."""
    calls: Counter[str] = Counter()
    name = "x" * 5000 + "!"
    body = json.dumps({"workflows": [{"name": name}]}).encode()
    async with (
        orchestrator_stack(database_url) as stack,
        serve(internal_service(calls, status=200, body=body)) as url,
        _http(stack) as http,
    ):
        slug = await _store(stack, "long", f"{url}/")
        synced = await http.post(f"/v1/apps/{slug}/sync")
        assert synced.status_code == 502, synced.text
        message = synced.json()["error"]["message"]
        assert "invalid name" in message and len(message) < 300
