"""The lean HTTP client used for progress calls and invocations, against a real uvicorn."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from stepline._http import HttpClient, HttpError
from tests.support import free_port, read_body, serve

Scope = dict[str, Any]


async def app(scope: Scope, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = await read_body(receive)
    path = scope["path"]
    if path == "/redirect":
        await send(
            {
                "type": "http.response.start",
                "status": 307,
                "headers": [(b"location", b"/echo?via=redirect")],
            }
        )
        await send({"type": "http.response.body", "body": b""})
        return
    if path == "/slow":
        await asyncio.sleep(2)
    if path == "/chunked":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for part in (b"one,", b"two,", b"three"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    query = scope["query_string"]
    await send(
        {
            "type": "http.response.start",
            "status": 201,
            "headers": [(b"x-query", query), (b"content-type", b"text/plain")],
        }
    )
    await send({"type": "http.response.body", "body": b"got:" + body})


async def test_post_reuses_connections_and_reads_both_body_kinds() -> None:
    """Content-Length and chunked answers are read whole, over one kept-alive connection."""
    async with serve(app) as url:
        client = HttpClient()
        first = await client.post(url + "/echo", b"hello", {"x-a": "1"})
        assert (first.status, first.body) == (201, b"got:hello")
        chunked = await client.post(url + "/chunked", b"", {})
        assert chunked.body == b"one,two,three"
        assert sum(len(c) for c in client._idle.values()) == 1
        await client.aclose()


async def test_redirects_are_followed_with_the_body_when_asked() -> None:
    """307 is followed (same method and body) only when asked."""
    async with serve(app) as url:
        client = HttpClient()
        plain = await client.post(url + "/redirect", b"x", {})
        assert plain.status == 307
        followed = await client.post(url + "/redirect", b"x", {}, follow_redirects=True)
        assert (followed.status, followed.body) == (201, b"got:x")
        assert followed.headers["x-query"] == "via=redirect"
        await client.aclose()


async def test_failures_raise_http_error() -> None:
    """A refused connection, a timeout and a bad URL raise HttpError."""
    client = HttpClient(timeout=0.5)
    with pytest.raises(HttpError):
        await client.post(f"http://127.0.0.1:{free_port()}/", b"", {})
    with pytest.raises(HttpError):
        await client.post("ftp://example/", b"", {})
    async with serve(app) as url:
        with pytest.raises(HttpError, match="timed out"):
            await client.post(url + "/slow", b"", {})
        again = await client.post(url + "/echo", b"after", {})
        assert again.body == b"got:after"
    await client.aclose()


async def test_a_connection_closed_by_the_server_is_replaced() -> None:
    """When the server closed an idle connection, the next request opens a new one."""
    port = free_port()
    client = HttpClient()
    async with serve(app, port) as url:
        assert (await client.post(url + "/echo", b"1", {})).status == 201
    async with serve(app, port) as url:
        assert (await client.post(url + "/echo", b"2", {})).body == b"got:2"
    await client.aclose()
