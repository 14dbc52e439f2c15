"""The async REST client without a transport sends over ``stepline._http``: the same contract
as through httpx, checked against a real uvicorn server on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from stepline import ApiError, AsyncClient
from tests.support import free_port, read_body, serve
from tests.unit.test_client import CASES, FakeApi, body_of


def asgi(fake: FakeApi, delay: float = 0.0) -> Any:
    """An ASGI app that hands each request to ``fake`` as an ``httpx.Request``."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        query = scope["query_string"].decode()
        url = "http://direct.test" + scope["raw_path"].decode() + (f"?{query}" if query else "")
        request = httpx.Request(scope["method"], url, headers=scope["headers"], content=body)
        await asyncio.sleep(delay)
        answer = fake(request)
        headers = [(k.encode(), v.encode()) for k, v in answer.headers.items()]
        start = {"type": "http.response.start", "status": answer.status_code, "headers": headers}
        await send(start)
        await send({"type": "http.response.body", "body": answer.content})

    return app


@pytest.fixture
async def direct() -> AsyncIterator[tuple[FakeApi, AsyncClient]]:
    fake = FakeApi()
    async with serve(asgi(fake)) as url, AsyncClient(url + "/", "sk-test") as client:
        assert client._direct is not None
        yield fake, client


@pytest.mark.parametrize(
    ("method", "args", "kwargs", "verb", "path", "query", "body"),
    CASES,
    ids=[f"{case[0]}-{i}" for i, case in enumerate(CASES)],
)
async def test_request_matches_contract(
    direct: tuple[FakeApi, AsyncClient],
    method: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    verb: str,
    path: str,
    query: dict[str, str],
    body: Any,
) -> None:
    """Each method sends openapi.yaml's verb, path, query, JSON body and bearer key, and answers the
    decoded JSON (None for 204)."""
    fake, client = direct
    result = await getattr(client, method)(*args, **kwargs)
    sent = fake.last
    assert (sent.method, sent.url.path, dict(sent.url.params)) == (verb, path, query)
    assert body_of(sent) == body
    assert sent.headers["authorization"] == "Bearer sk-test"
    assert sent.headers["user-agent"] == "stepline-python"
    assert result == (None if verb == "DELETE" else {"path": path})


async def test_errors_become_api_errors(direct: tuple[FakeApi, AsyncClient]) -> None:
    """The error shape raises ApiError with its fields; any other body ``http_<status>``."""
    fake, client = direct
    error = {"code": "run_key_conflict", "message": "Run key taken.", "details": {"runId": "r0"}}
    fake.routes["POST", "/v1/runs"] = lambda r: httpx.Response(409, json={"error": error})
    fake.routes["GET", "/v1/runs/r1"] = lambda r: httpx.Response(502, text="Bad gateway")
    with pytest.raises(ApiError) as caught:
        await client.start_run("onboard", {}, run_key="k")
    assert (caught.value.status, caught.value.code, caught.value.details) == (
        409,
        "run_key_conflict",
        {"runId": "r0"},
    )
    with pytest.raises(ApiError) as other:
        await client.get_run("r1")
    assert (other.value.status, other.value.code, other.value.message) == (
        502,
        "http_502",
        "Bad gateway",
    )


async def test_a_base_url_with_a_path_keeps_it() -> None:
    """Paths are added to the base URL's own path, as httpx does."""
    fake = FakeApi()
    async with serve(asgi(fake)) as url, AsyncClient(url + "/prefix", "k") as client:
        assert await client.get_run("r1") == {"path": "/prefix/v1/runs/r1"}


async def test_network_failures_are_httpx_errors() -> None:
    """Nobody listening is an ``httpx.ConnectError``; no answer in time an ``httpx.ReadTimeout``."""
    async with AsyncClient(f"http://127.0.0.1:{free_port()}", "k") as client:
        with pytest.raises(httpx.ConnectError):
            await client.get_run("r1")
    fake = FakeApi()
    async with serve(asgi(fake, delay=1.0)) as url, AsyncClient(url, "k", timeout=0.2) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.get_run("r1")
