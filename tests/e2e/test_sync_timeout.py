"""A sync gives up in seconds (the describe timeout), not after the invocation timeout."""

from __future__ import annotations

import asyncio
import time

import pytest

import stepline
from stepline_server.store import apps, keys
from tests.support import free_port, orchestrator_stack


async def test_sync_of_a_silent_app_gives_up_after_the_describe_timeout(
    database_url: str,
) -> None:
    """An app that accepts the connection and never answers fails the sync with
    app_unreachable after the describe timeout, though invocations may wait much longer."""
    port = free_port()
    held: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # read nothing, answer nothing

    server = await asyncio.start_server(silent, "127.0.0.1", port)
    try:
        async with orchestrator_stack(
            database_url, invoke_timeout_seconds=300.0, describe_timeout_seconds=1.0
        ) as stack:
            async with stack.orchestrator.pool.acquire() as conn:
                row = await apps.create(
                    conn, keys.DEFAULT_PROJECT, "silent", f"http://127.0.0.1:{port}/"
                )
                assert row is not None
            started = time.monotonic()
            with pytest.raises(stepline.ApiError) as info:
                await stack.client.sync_app("silent")
            assert time.monotonic() - started < 5
            assert info.value.code == "app_unreachable"
            assert "did not answer in time" in info.value.message
    finally:
        for w in held:
            w.close()
        server.close()
        await server.wait_closed()
