"""A request body that trickles in too slowly is refused with 408, and the orchestrator goes on."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlsplit

from tests.support import orchestrator_stack


async def test_a_body_that_stops_arriving_is_refused(database_url: str) -> None:
    """A POST whose body stops after 10 of 100 bytes is answered 408 request_timeout in the
    error shape within the body timeout; the API goes on answering."""
    async with orchestrator_stack(database_url, body_timeout_seconds=0.5) as stack:
        parts = urlsplit(stack.url)
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        head = (
            "POST /v1/runs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {stack.api_key}\r\nContent-Length: 100\r\n\r\n"
        )
        writer.write(head.encode() + b'{"workflow')
        await writer.drain()
        async with asyncio.timeout(10):
            status = await reader.readline()
            answer = await reader.read(4096)
        writer.close()
        assert status.startswith(b"HTTP/1.1 408"), status
        body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
        assert body["error"]["code"] == "request_timeout"
        assert (await stack.client.list_runs())["runs"] == []
