"""A small keep-alive HTTP/1.1 client for the two hot paths: progress calls and invocations.

Each step costs one POST from the SDK to the orchestrator, and each invocation one POST the other
way, so the client's own CPU is paid once per step. Measured on a 2-core machine against
uvicorn, httpx's pooled ``AsyncClient`` spent about 1-2 ms of CPU per request, aiohttp about
0.1 ms, and this client about 0.015 ms; it needs nothing beyond the standard library, which
keeps the SDK light. It does only what these calls need: a request with a body, HTTP and HTTPS,
``Content-Length`` or chunked answers, keep-alive, 307/308 redirects, and a total timeout.

A request is sent once. Only when it is safe is it sent again on a fresh connection: the pooled
connection was seen closed before anything was written, or the caller marked the request
``idempotent`` (the answer to a request written to a reused connection may be lost after the
server acted on it, so resending a plain POST could run it twice). Connections are pooled per
event loop: a host that runs each request on a fresh loop gets fresh connections on each, and
those of closed loops are let go (see :mod:`stepline._loops`).
:class:`AsyncTransport` puts it under ``httpx.AsyncClient`` (the REST client's default).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

import httpx

from stepline import _loops

__all__ = ["AsyncTransport", "HttpClient", "HttpError", "Response"]

_MAX_HEAD = 64 * 1024
_IDLE_SECONDS = 4.0  # below uvicorn's default keep-alive of 5 s
_REDIRECTS = frozenset({307, 308})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
"""Methods that change nothing on the server: a lost answer may be asked for again."""

Origin = tuple[str, str, int]
Resolve = Callable[[str, int], Awaitable[str]]
"""Given a host and a port, the address to connect to (or :class:`HttpError` refusing it)."""


class HttpError(Exception):
    """The request could not be sent or its answer not read (connection, protocol, timeout)."""


class TooLarge(HttpError):
    """The answer's body is longer than the client's ``max_body``; the rest was not read."""


@dataclass(frozen=True)
class Response:
    """A whole answer: status, lower-cased headers, body."""

    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


class _Conn:
    __slots__ = ("reader", "used", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer, self.used = reader, writer, time.monotonic()

    def close(self) -> None:
        self.writer.close()


class HttpClient:
    """POSTs over pooled keep-alive connections, one pool per event loop and origin.

    Three options guard a caller that talks to hosts it does not trust: ``resolve`` picks (and
    may refuse) the address each new connection is made to, which is then connected to with
    the URL's host in the Host header and TLS's server name, so the address checked is the one
    used; ``max_body`` cuts off an answer longer than that many bytes (:class:`TooLarge`,
    without reading the rest); ``same_origin_redirects`` follows a redirect only to the same
    scheme, host and port."""

    def __init__(
        self,
        *,
        timeout: float = 30.0,
        max_idle: int = 64,
        resolve: Resolve | None = None,
        max_body: int | None = None,
        same_origin_redirects: bool = False,
    ) -> None:
        self.timeout = timeout
        self.max_idle = max_idle
        self.resolve = resolve
        self.max_body = max_body
        self.same_origin_redirects = same_origin_redirects
        self._pools: dict[asyncio.AbstractEventLoop, dict[Origin, list[_Conn]]] = {}
        self._ssl: ssl.SSLContext | None = None

    async def post(
        self,
        url: str,
        body: bytes,
        headers: dict[str, str],
        *,
        timeout: float | None = None,
        follow_redirects: bool = False,
        idempotent: bool = False,
    ) -> Response:
        """POST ``body`` to ``url``; raise :class:`HttpError` when there is no answer.

        ``idempotent``: sending the request twice does no harm, so an answer lost on a reused
        connection may be asked for again on a fresh one."""
        return await self.request(
            "POST",
            url,
            body,
            headers,
            timeout=timeout,
            follow_redirects=follow_redirects,
            idempotent=idempotent,
        )

    async def request(
        self,
        method: str,
        url: str,
        body: bytes,
        headers: dict[str, str],
        *,
        timeout: float | None = None,
        follow_redirects: bool = False,
        idempotent: bool = False,
    ) -> Response:
        """Send one request; raise :class:`HttpError` when there is no answer (see
        :meth:`post` for ``idempotent``)."""
        try:
            async with asyncio.timeout(timeout or self.timeout):
                for _ in range(6):
                    response = await self._send(method, url, body, headers, idempotent)
                    location = response.headers.get("location")
                    if not (follow_redirects and response.status in _REDIRECTS and location):
                        return response
                    target = urljoin(url, location)
                    if self.same_origin_redirects and _origin(target) != _origin(url):
                        raise HttpError("a redirect to another origin was not followed")
                    url = target
                raise HttpError(f"too many redirects (last to {url})")
        except TimeoutError:
            raise HttpError("timed out") from None

    async def _send(
        self, method: str, url: str, body: bytes, headers: dict[str, str], idempotent: bool
    ) -> Response:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise HttpError(f"not an http(s) URL: {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        origin = (parts.scheme, parts.hostname, port)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host = parts.netloc.rsplit("@", 1)[-1]
        lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
        conn = self._take(origin)
        if conn is not None:
            try:
                return await self._exchange(origin, conn, request)
            except _FAILURES as exc:
                if not idempotent:
                    # Written, so perhaps acted on: sending it again could do it twice.
                    raise _failed(exc, "on a reused connection; not sent again") from None
        conn = await self._open(origin)
        try:
            return await self._exchange(origin, conn, request)
        except _FAILURES as exc:
            raise _failed(exc) from None

    def _idle(self) -> dict[Origin, list[_Conn]]:
        """The running loop's idle connections (a new loop starts a pool of its own, and lets
        go of those of closed loops)."""
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None:
            for other in [other for other in list(self._pools) if other.is_closed()]:
                for idle in self._pools.pop(other, {}).values():
                    for conn in idle:
                        _loops.release_transport(conn.writer.transport)
            pool = self._pools[loop] = defaultdict(list)
        return pool

    def _take(self, origin: Origin) -> _Conn | None:
        idle = self._idle().get(origin)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            # Only a connection that is not known dead is used: a request written to one
            # whose answer then fails is not sent again (unless idempotent).
            alive = not conn.reader.at_eof() and not conn.writer.is_closing()
            if alive and now - conn.used < _IDLE_SECONDS:
                return conn
            conn.close()
        return None

    async def _open(self, origin: Origin) -> _Conn:
        scheme, host, port = origin
        context = None
        if scheme == "https":
            context = self._ssl = self._ssl or ssl.create_default_context()
        address = host if self.resolve is None else await self.resolve(host, port)
        try:
            if context is None:
                reader, writer = await asyncio.open_connection(address, port)
            else:  # the name the certificate must carry: the URL's host, not the address
                reader, writer = await asyncio.open_connection(
                    address, port, ssl=context, server_hostname=host
                )
        except OSError as exc:
            raise HttpError(f"could not connect to {host}:{port}: {exc}") from None
        return _Conn(reader, writer)

    async def _exchange(self, origin: Origin, conn: _Conn, request: bytes) -> Response:
        ok = False
        try:
            conn.writer.write(request)
            head = await conn.reader.readuntil(b"\r\n\r\n")
            while head[9:10] == b"1":  # 1xx: an interim answer, the real one follows
                head = await conn.reader.readuntil(b"\r\n\r\n")
            status, headers, keep = _parse_head(head)
            limit = self.max_body
            if status in (204, 304) or request.startswith(b"HEAD "):
                body = b""
            elif "content-length" in headers:
                length = int(headers["content-length"])
                if limit is not None and length > limit:
                    raise _too_large(limit)
                body = await conn.reader.readexactly(length)
            elif "chunked" in headers.get("transfer-encoding", ""):
                body = await _read_chunked(conn.reader, limit)
            else:
                body, keep = await _read_to_end(conn.reader, limit), False
            ok = keep
            return Response(status, headers, body)
        finally:
            if ok:
                self._release(origin, conn)
            else:
                conn.close()

    def _release(self, origin: Origin, conn: _Conn) -> None:
        idle = self._idle()[origin]
        if len(idle) >= self.max_idle:
            conn.close()
            return
        conn.used = time.monotonic()
        idle.append(conn)

    async def aclose(self) -> None:
        """Close every idle connection (those of another loop that still runs, on that loop)."""
        here = _loops.running()
        for loop in list(self._pools):
            conns = [conn for idle in self._pools.pop(loop, {}).values() for conn in idle]
            for conn in conns:
                if loop is here:
                    conn.close()
                elif loop.is_closed():
                    _loops.release_transport(conn.writer.transport)
                else:
                    with contextlib.suppress(RuntimeError):  # closed meanwhile: it is gone
                        loop.call_soon_threadsafe(conn.close)


class _Stale(Exception):
    """The connection ended before an answer began."""


_FAILURES = (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, _Stale)


def _failed(exc: BaseException, where: str = "") -> HttpError:
    detail = f"{type(exc).__name__}: {exc or 'connection closed'}"
    return HttpError(f"{detail} ({where})" if where else detail)


def _parse_head(head: bytes) -> tuple[int, dict[str, str], bool]:
    if not head.startswith(b"HTTP/1."):
        raise _Stale(f"not an HTTP/1.x answer: {head[:40]!r}")
    lines = head[:-4].decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    try:
        status = int(rest[:3])
    except ValueError:
        raise _Stale(f"bad status line: {lines[0][:80]!r}") from None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    connection = headers.get("connection", "").lower()
    keep = "close" not in connection and (version == "HTTP/1.1" or "keep-alive" in connection)
    return status, headers, keep


def _origin(url: str) -> Origin:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    default = 443 if parts.scheme == "https" else 80
    return (parts.scheme, (parts.hostname or "").lower(), port or default)


def _too_large(limit: int) -> TooLarge:
    return TooLarge(f"the answer is longer than {limit} bytes; cut off")


async def _read_to_end(reader: asyncio.StreamReader, limit: int | None) -> bytes:
    if limit is None:
        return await reader.read()
    chunks: list[bytes] = []
    total = 0
    while chunk := await reader.read(min(65536, limit + 1 - total)):
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:
            raise _too_large(limit)
    return b"".join(chunks)


async def _read_chunked(reader: asyncio.StreamReader, limit: int | None = None) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
        total += size
        if limit is not None and total > limit:
            raise _too_large(limit)
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":
                pass  # trailers
            return b"".join(chunks)
        chunks.append(await reader.readexactly(size))
        await reader.readexactly(2)


class AsyncTransport(httpx.AsyncBaseTransport):
    """An httpx transport over :class:`HttpClient`: httpx's API without its pool's CPU cost."""

    def __init__(self, timeout: float = 30.0) -> None:
        self._client = HttpClient(timeout=timeout)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeouts = request.extensions.get("timeout") or {}
        total = max((t for t in timeouts.values() if t), default=None)
        body = await request.aread()
        headers = {
            k.decode("latin-1"): v.decode("latin-1")
            for k, v in request.headers.raw
            if k.lower() not in (b"host", b"content-length", b"transfer-encoding")
        }
        try:
            answer = await self._client.request(
                request.method,
                str(request.url),
                body,
                headers,
                timeout=total,
                idempotent=request.method in SAFE_METHODS,
            )
        except HttpError as exc:
            if str(exc) == "timed out":
                raise httpx.ReadTimeout(str(exc), request=request) from None
            raise httpx.ConnectError(str(exc), request=request) from None
        headers_out = [(k, v) for k, v in answer.headers.items() if k != "transfer-encoding"]
        return httpx.Response(
            answer.status, headers=headers_out, content=answer.body, request=request
        )

    async def aclose(self) -> None:
        await self._client.aclose()
