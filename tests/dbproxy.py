"""A TCP proxy on loopback in front of the test PostgreSQL: the database as the orchestrator
sees it when its primary fails. :meth:`DbProxy.cut` resets every connection and refuses new
ones (a server killed, a node gone), :meth:`DbProxy.restore` accepts them again (the promoted
standby), and :meth:`DbProxy.lose_commit` lets the commit of a chosen write reach the server
and drops the connection before its answer comes back: a commit whose outcome the client never
learns."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

from tests.ports import free_port

__all__ = ["DbProxy", "proxied"]


class DbProxy:
    """Forwards 127.0.0.1:``port`` to ``target`` (host, port) while it is up."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._armed: list[tuple[bytes, bytes | None]] = []
        self.commits_lost = 0

    def dsn(self, database_url: str) -> str:
        """``database_url`` pointed at the proxy, without TLS: the proxy reads the statements
        it watches for (a server with TLS on, such as a Citus node, would otherwise be
        asked for it by the client's default ``sslmode=prefer``)."""
        parts = urlsplit(database_url)
        user = f"{parts.username}@" if parts.username else ""
        query = "&".join(
            [q for q in parts.query.split("&") if q and not q.startswith("sslmode=")]
            + ["sslmode=disable"]
        )
        return urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{self.port}", query=query))

    async def restore(self) -> None:
        """Accept connections (again)."""
        if self._server is None:
            self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def cut(self) -> None:
        """Reset every open connection and refuse new ones."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for pair in list(self._pairs):
            self._drop(pair)

    def lose_commit(self, marker: bytes, *, transaction: bool = True) -> None:
        """Once: on the connection that next sends ``marker`` (a value of the write's), let its
        ``COMMIT`` (with ``transaction=False``: the statement itself, which commits on its own)
        reach the server, then drop the connection before the server's answer reaches the
        client."""
        self._armed.append((marker, b"COMMIT" if transaction else None))

    def _drop(self, pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter]) -> None:
        self._pairs.discard(pair)
        for writer in pair:
            sock = writer.get_extra_info("socket")
            if sock is not None:  # RST rather than FIN, as a dead server's kernel would
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
            writer.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        pair = (writer, up_writer)
        self._pairs.add(pair)
        state = _Losing()
        await asyncio.gather(
            self._pipe(reader, up_writer, pair, state, upstream=True),
            self._pipe(up_reader, writer, pair, state, upstream=False),
            return_exceptions=True,
        )
        self._drop(pair)

    def _watch(self, data: bytes, state: _Losing) -> None:
        """Arm ``state`` when ``data`` (from the client) carries an armed marker; note that
        the commit to lose went to the server."""
        if state.waiting_for is None and not state.sent:
            for armed in self._armed:
                if armed[0] in data:
                    self._armed.remove(armed)
                    state.waiting_for = armed[1] or armed[0]
                    break
        if state.waiting_for is not None and state.waiting_for in data:
            state.sent = True

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
        state: _Losing,
        *,
        upstream: bool,
    ) -> None:
        while pair in self._pairs:
            data = await reader.read(65536)
            if not data:
                break
            if upstream:
                self._watch(data, state)
            elif state.sent:
                # The server answered the commit: the client never hears it.
                self.commits_lost += 1
                self._drop(pair)
                return
            writer.write(data)
            await writer.drain()
        self._drop(pair)


class _Losing:
    """One proxied connection's progress towards losing a commit's answer."""

    def __init__(self) -> None:
        self.waiting_for: bytes | None = None  # COMMIT, or the marked statement itself
        self.sent = False


@contextlib.asynccontextmanager
async def proxied(database_url: str) -> AsyncIterator[tuple[DbProxy, str]]:
    """A proxy in front of ``database_url``'s server; yields it and the DSN through it."""
    parts = urlsplit(database_url)
    proxy = DbProxy((parts.hostname or "127.0.0.1", parts.port or 5432))
    await proxy.restore()
    try:
        yield proxy, proxy.dsn(database_url)
    finally:
        await proxy.cut()
