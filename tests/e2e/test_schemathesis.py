"""Schemathesis over every operation of openapi.yaml, and over the dashboard's pages and forms
(tests/e2e/dashboard_forms.yaml), against a live orchestrator on loopback, with an admin key (a
signed-in session for the dashboard) and without one: no 500, every answer of a documented
status and schema, no accepted NaN or Infinity; the stateful phase chains operations through
the resources they make.

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
from tests.dashboard_forms import Dashboard
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
        "no_accepted_nonfinite",
    ]
)
UI_CHECKS = "no_500,status_code_conformance,content_type_conformance,no_accepted_nonfinite"


async def _schemathesis(
    url: str,
    report: Path,
    *headers: str,
    spec: Path = ROOT / "openapi.yaml",
    checks: str = CHECKS,
    env: dict[str, str] | None = None,
) -> tuple[int, str]:
    args = [
        "run",
        str(spec),
        "--url",
        url,
        "--checks",
        checks,
        "--max-examples",
        str(EXAMPLES),
        "--phases",
        "examples,coverage,fuzzing,stateful",
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
    env = {
        **os.environ,
        **(env or {}),
        "SCHEMATHESIS_HOOKS": "tests.schemathesis_hooks",
        "PYTHONPATH": str(ROOT),
    }
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
    """Every operation of openapi.yaml, and the dashboard's pages and forms, fuzzed with an
    admin key (a signed-in session) and with none, answer no 500, only documented statuses,
    content types and schemas, and never accept NaN or Infinity."""
    async with orchestrator_stack(
        database_url,
        app_networks=("127.0.0.1/32",),
        auth_failure_limit=1_000_000,
        auth_failure_budget=1_000_000,
    ) as stack:
        headers, ui_env = [], {}
        if keyed:
            async with stack.orchestrator.pool.acquire() as conn:
                admin = await keys.create_key(conn, "fuzz", keys.DEFAULT_PROJECT, "admin")
            headers.append(f"Authorization: Bearer {admin}")
            async with Dashboard(stack.url) as ui:
                await ui.sign_in(admin)
                cookie = f"stepline_session={ui.http.cookies['stepline_session']}"
                ui_env = {"STEPLINE_FUZZ_UI_COOKIE": cookie, "STEPLINE_FUZZ_UI_CSRF": ui.csrf}
        code, out = await _schemathesis(stack.url, tmp_path / "junit.xml", *headers)
        ui_code, ui_out = await _schemathesis(
            stack.url,
            tmp_path / "junit-ui.xml",
            spec=ROOT / "tests" / "e2e" / "dashboard_forms.yaml",
            checks=UI_CHECKS,
            env=ui_env,
        )
        async with httpx.AsyncClient(base_url=stack.url) as http:  # it still answers
            assert (await http.get("/readyz")).status_code == 200
    print(out[-4000:])
    print(ui_out[-4000:])
    assert code == 0, out[-20000:]
    assert ui_code == 0, ui_out[-20000:]
