"""An idle keep-alive connection outlives a client's own idle limit: the server never closes a
connection a client is about to send its next request on (that request would get no answer)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from stepline_server.cli import servers
from tests.ports import free_port


async def _ok(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def test_an_idle_connection_is_kept_past_the_clients_expiry() -> None:
    """httpx keeps an idle connection 5 s by default; the orchestrator's server keeps it longer,
    so a request sent on it after 6 s idle goes on the same connection."""
    port = free_port()
    server = servers.server(_ok, "127.0.0.1", port)
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        limits = httpx.Limits(keepalive_expiry=30)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", limits=limits) as http:
            first = _peer(await http.get("/"))
            await asyncio.sleep(6)
            second = _peer(await http.get("/"))
        assert first == second, "the server closed the idle connection"
    finally:
        server.should_exit = True
        await task


def _peer(response: httpx.Response) -> Any:
    return response.extensions["network_stream"].get_extra_info("client_addr")
