"""`stepline alerts create|list|test|delete|deliveries` against a real orchestrator and a
real receiver on loopback."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from stepline_server.cli import main as cli_main
from stepline_server.cli import operate
from tests.receiver import Receiver
from tests.support import Stack, orchestrator_stack


@pytest.fixture
async def stack(database_url: str) -> AsyncIterator[Stack]:
    async with orchestrator_stack(database_url) as s:
        yield s


def _call(argv: list[str]) -> tuple[int, str, str]:
    args = cli_main.parser().parse_args(argv)
    out, err = io.StringIO(), io.StringIO()
    code = operate.run(args, out, err)
    return code, out.getvalue(), err.getvalue()


async def cli(stack: Stack, *argv: str) -> tuple[int, str, str]:
    full = [*argv, "--url", stack.url, "--api-key", stack.api_key]
    return await asyncio.to_thread(_call, full)


async def ok_json(stack: Stack, *argv: str) -> Any:
    code, out, err = await cli(stack, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


async def test_create_list_test_deliveries_and_delete(stack: Stack) -> None:
    """create prints the alert and its secret once; list shows it; test sends alert.test and
    says it was delivered (the receiver got it); deliveries lists it; delete removes it."""
    async with Receiver().running() as rx:
        code, out, err = await cli(
            stack, "alerts", "create", "ops", "--on", "run.failed", "--on", "run.timedOut",
            "--workflow", "checkout", "--webhook", rx.url,
        )  # fmt: skip
        assert code == 0, err
        assert "sends run.failed, run.timedOut of workflow checkout" in out
        assert "signing secret (shown once): whsec_" in out
        [alert] = (await ok_json(stack, "alerts", "list"))["alerts"]
        code, out, _ = await cli(stack, "alerts", "list")
        assert out.split()[:6] == ["ID", "NAME", "ON", "WORKFLOW", "TYPE", "URL"]
        assert alert["id"] in out and "run.failed,run.timedOut" in out
        code, out, err = await cli(stack, "alerts", "test", alert["id"])
        assert code == 0, err
        assert "delivered (HTTP 200)" in out
        assert rx.received[0].json["type"] == "alert.test"
        code, out, _ = await cli(stack, "alerts", "deliveries", alert["id"])
        assert "alert.test" in out and "delivered" in out
    code, out, _ = await cli(stack, "alerts", "delete", alert["id"])
    assert code == 0 and f"alert {alert['id']} deleted" in out
    assert (await ok_json(stack, "alerts", "list"))["alerts"] == []


async def test_a_test_to_a_receiver_that_refuses_says_so(stack: Stack) -> None:
    """A receiver answering 503 makes `alerts test` print the attempt and its error."""
    async with Receiver(answers=[503] * 5).running() as rx:
        made = await ok_json(
            stack, "alerts", "create", "chat", "--on", "run.failed", "--slack", rx.url
        )
        assert "secret" not in made
        code, out, _ = await cli(stack, "alerts", "test", made["id"])
    assert code == 0 and "pending after 1 attempt(s)" in out and "HTTP 503" in out


async def test_bad_usage_and_api_errors(stack: Stack) -> None:
    """No destination or both is a usage error (2); an unknown alert is an API error (1)."""
    code, _, err = await cli(stack, "alerts", "create", "x", "--on", "run.failed")
    assert code == 2 and "--webhook URL or --slack URL" in err
    code, _, err = await cli(
        stack, "alerts", "create", "x", "--on", "run.failed", "--webhook", "http://127.0.0.1:9/",
        "--slack", "http://127.0.0.1:9/",
    )  # fmt: skip
    assert code == 2
    code, _, err = await cli(stack, "alerts", "delete", "00000000-0000-0000-0000-000000000000")
    assert code == 1 and "not_found" in err
    code, _, err = await cli(
        stack, "alerts", "create", "x", "--on", "run.failed", "--webhook", "ftp://x/"
    )
    assert code == 1 and "validation_failed" in err
