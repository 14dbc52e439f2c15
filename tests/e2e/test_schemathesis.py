"""Schemathesis over every operation of openapi.yaml against a live orchestrator on loopback,
with an admin key and without one: no 500, every answer of a documented status and schema.

A few examples per operation here; ``make fuzz`` sets STEPLINE_FUZZ_EXAMPLES and
STEPLINE_FUZZ_SECONDS higher. Generated app URLs are kept to loopback (tests/schemathesis_hooks.py)
and the orchestrator allows only 127.0.0.1/32, so nothing else is ever resolved or called.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import httpx
import pytest

from stepline_server.store import keys
from tests.support import orchestrator_stack

ROOT = Path(__file__).parents[2]
EXAMPLES = int(os.environ.get("STEPLINE_FUZZ_EXAMPLES", "3"))
SECONDS = int(os.environ.get("STEPLINE_FUZZ_SECONDS", "45"))
CHECKS = ",".join(
    [
        "no_500",
        "status_code_conformance",
        "content_type_conformance",
        "response_schema_conformance",
    ]
)


async def _schemathesis(url: str, report: Path, *headers: str) -> tuple[int, str]:
    args = [
        "run",
        str(ROOT / "openapi.yaml"),
        "--url",
        url,
        "--checks",
        CHECKS,
        "--max-examples",
        str(EXAMPLES),
        "--phases",
        "examples,coverage,fuzzing",
        "--workers",
        "1",
        "--seed",
        os.environ.get("STEPLINE_FUZZ_SEED", "1"),
        "--no-shrink",
        "--request-timeout",
        "15",
        "--max-time",
        str(SECONDS),
        "--report",
        "junit",
        "--report-junit-path",
        str(report),
        "--continue-on-failure",
    ]
    for header in headers:
        args += ["--header", header]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.schemathesis_hooks", "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "schemathesis"),
        *args,
        cwd=report.parent,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), SECONDS + 120)
    except TimeoutError:
        proc.kill()
        raise
    return proc.returncode or 0, out.decode("utf-8", "replace")


@pytest.mark.parametrize("keyed", [True, False], ids=["with-key", "without-key"])
async def test_schemathesis_finds_no_500_and_no_answer_outside_the_contract(
    database_url: str, tmp_path: Path, keyed: bool
) -> None:
    """Every operation of openapi.yaml, fuzzed with an admin key and with none, answers no 500
    and only documented statuses, content types and schemas."""
    async with orchestrator_stack(
        database_url, app_networks=("127.0.0.1/32",), auth_failure_limit=1_000_000
    ) as stack:
        headers = []
        if keyed:
            async with stack.orchestrator.pool.acquire() as conn:
                admin = await keys.create_key(conn, "fuzz", keys.DEFAULT_PROJECT, "admin")
            headers.append(f"Authorization: Bearer {admin}")
        code, out = await _schemathesis(stack.url, tmp_path / "junit.xml", *headers)
        async with httpx.AsyncClient(base_url=stack.url) as http:  # it still answers
            assert (await http.get("/readyz")).status_code == 200
    print(out[-4000:])
    assert code == 0, out[-20000:]
