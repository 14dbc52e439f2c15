"""The lean HTTP client used for progress calls and invocations, against a real uvicorn."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from stepline._http import HttpClient, HttpError, TooLarge
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
        assert sum(len(c) for c in client._idle().values()) == 1
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


class ResettingServer:
    """A raw HTTP/1.1 server on loopback that answers the first request on each connection
    and, per ``mode``, treats the second one: ``drop`` reads it whole and closes without an
    answer (a proxy resetting a long request); ``close_idle`` never gets one, as it closes
    the connection right after the first answer."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.received: list[str] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc_info: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            for served in range(2):
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                await reader.readexactly(length)
                self.received.append(head.split(b" ", 2)[1].decode())
                if served == 1 and self.mode == "drop":
                    break
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
                if self.mode == "close_idle":
                    break
        except asyncio.IncompleteReadError:
            pass
        finally:
            writer.close()


async def test_a_post_written_to_a_reused_connection_is_not_sent_again() -> None:
    """A plain POST whose answer is lost on a kept-alive connection raises HttpError and
    reaches the server once."""
    server = ResettingServer("drop")
    async with server as url:
        client = HttpClient(timeout=5)
        assert (await client.post(url + "/first", b"1", {})).body == b"ok"
        with pytest.raises(HttpError, match="not sent again"):
            await client.post(url + "/second", b"2", {})
        await client.aclose()
    assert server.received.count("/second") == 1


async def test_an_idempotent_post_is_sent_again_on_a_fresh_connection() -> None:
    """A request marked idempotent whose answer is lost is sent again, and answered."""
    server = ResettingServer("drop")
    async with server as url:
        client = HttpClient(timeout=5)
        await client.post(url + "/first", b"1", {})
        again = await client.post(url + "/second", b"2", {}, idempotent=True)
        assert again.body == b"ok"
        await client.aclose()
    assert server.received.count("/second") == 2


async def test_a_connection_seen_closed_before_writing_is_replaced_for_any_request() -> None:
    """A pooled connection the server already closed is not used: a plain POST goes out once,
    on a fresh connection, and is answered."""
    server = ResettingServer("close_idle")
    async with server as url:
        client = HttpClient(timeout=5)
        await client.post(url + "/first", b"1", {})
        await asyncio.sleep(0.05)  # the server's close reaches the client
        assert (await client.post(url + "/second", b"2", {})).body == b"ok"
        await client.aclose()
    assert server.received == ["/first", "/second"]


async def _raw_server(answer: bytes) -> tuple[asyncio.Server, list[int]]:
    """A TCP server on 127.0.0.1 that writes ``answer`` then 17 MiB of body, counting bytes
    written before the client went away."""
    written = [0]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        try:
            for _ in range(17 * 16):
                writer.write(b"x" * 65536)
                await writer.drain()
                written[0] += 65536
        except (ConnectionError, OSError):
            pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, written


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 17825792\r\n\r\n",
    ],
)
async def test_max_body_cuts_an_answer_off_without_reading_it_all(head: bytes) -> None:
    """With max_body, an answer longer than it (read to the end or with a Content-Length) is
    TooLarge, and the client stops reading: the server cannot write it all."""

    server, written = await _raw_server(head)
    port = server.sockets[0].getsockname()[1]
    client = HttpClient(max_body=1024 * 1024)
    with pytest.raises(TooLarge, match="cut off"):
        await client.post(f"http://127.0.0.1:{port}/", b"", {})
    await asyncio.sleep(0.3)
    server.close()
    await server.wait_closed()
    assert written[0] < 17 * 1024 * 1024
    plain = HttpClient()  # without max_body (the SDK's own calls) nothing is cut off
    server, written = await _raw_server(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n")
    port = server.sockets[0].getsockname()[1]
    answer = await plain.post(f"http://127.0.0.1:{port}/", b"", {})
    assert len(answer.body) == 17 * 1024 * 1024
    server.close()
    await server.wait_closed()


async def test_resolve_picks_the_address_and_keeps_the_host_header() -> None:
    """A resolve hook is asked for each new connection's address, may refuse it, and the
    request still carries the URL's host in its Host header."""
    seen: list[tuple[str, int]] = []
    hosts: list[bytes] = []

    async def resolve(host: str, port: int) -> str:
        seen.append((host, port))
        if host == "127.0.0.3":
            raise HttpError("refused")
        return "127.0.0.1"

    async def host_app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await read_body(receive)
        hosts.append(dict(scope["headers"])[b"host"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async with serve(host_app) as url:
        port = int(url.rsplit(":", 1)[1])
        client = HttpClient(resolve=resolve)
        answer = await client.post(f"http://localhost:{port}/", b"", {})
        assert answer.body == b"ok" and hosts == [f"localhost:{port}".encode()]
        with pytest.raises(HttpError, match="refused"):
            await client.post(f"http://127.0.0.3:{port}/", b"", {})
        assert seen == [("localhost", port), ("127.0.0.3", port)]
        await client.aclose()
