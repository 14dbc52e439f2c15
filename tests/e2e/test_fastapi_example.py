"""The FastAPI example app works as shipped: registered, synced and run end to end."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import httpx
import pytest

from tests.support import orchestrator_stack, serve

pytest.importorskip("fastapi")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fastapi_app.py"


async def test_fastapi_example_runs_a_workflow(database_url: str) -> None:
    """examples/fastapi_app.py mounted in FastAPI is synced and runs fulfil-order to the end,
    and the app's own route still answers."""
    spec = importlib.util.spec_from_file_location("fastapi_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.sl.signing_secrets = ("whsec_fastapi_example",)
    async with orchestrator_stack(database_url) as stack, serve(module.app) as url:
        async with httpx.AsyncClient() as plain:
            assert (await plain.get(url + "/")).json()["workflows"] == ["fulfil-order"]
        await stack.register(module.sl, url + "/stepline/")
        run = await stack.client.start_run("fulfil-order", {"orderId": "o1", "settle": "10ms"})
        ended = await stack.client.wait_run(run["id"], timeout=20)
        assert ended["status"] == "completed", ended
        assert ended["output"]["shipped"] == "shipped o1"
