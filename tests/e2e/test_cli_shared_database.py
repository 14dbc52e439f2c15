"""CLI commands beside a running ``stepline serve`` share its embedded PostgreSQL, never stop it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.support import free_port

pytestmark = pytest.mark.slow


@pytest.fixture
def folder() -> Iterator[Path]:
    """A folder PostgreSQL's own user can traverse (as root it runs as another user)."""
    path = Path(tempfile.mkdtemp(prefix="stepline-shared-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    for pid_file in path.rglob("postmaster.pid"):  # never leave a server behind
        with_pid = int(pid_file.read_text().splitlines()[0])
        if psutil.pid_exists(with_pid):
            os.kill(with_pid, signal.SIGTERM)
    shutil.rmtree(path, ignore_errors=True)


def _env(folder: Path, port: int) -> dict[str, str]:
    env = {
        **os.environ,
        "STEPLINE_PORT": str(port),
        "STEPLINE_LOG_LEVEL": "warning",
        "STEPLINE_DATA_DIR": str(folder / ".stepline"),
    }
    env.pop("DATABASE_URL", None)
    return env


def _command(*args: str, env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "stepline_server.cli.main", *args],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finished(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    return out


def _postmaster(folder: Path) -> int | None:
    """The pid of the live PostgreSQL server on the folder, if one runs."""
    for pid_file in folder.rglob("postmaster.pid"):
        pid = int(pid_file.read_text().splitlines()[0])
        if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            return pid
    return None


def _ready(base: str, serve: subprocess.Popen[str]) -> None:
    for _ in range(600):
        try:
            if httpx.get(f"{base}/readyz").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert serve.poll() is None, "stepline serve exited early"
        time.sleep(0.05)
    raise AssertionError("stepline serve did not become ready")


def test_keys_create_and_migrate_beside_serve_leave_its_database_running(folder: Path) -> None:
    """`stepline keys create` and `stepline migrate` on the data folder of a running
    `stepline serve` use its embedded PostgreSQL and leave it running: serve keeps answering
    and accepts the new key, and only serve stops the server when it exits."""
    port = free_port()
    env = _env(folder, port)
    base = f"http://127.0.0.1:{port}"
    serve = _command("serve", env=env, cwd=folder)
    try:
        _ready(base, serve)
        server_pid = _postmaster(folder)
        assert server_pid is not None
        key = _finished(_command("keys", "create", "--name", "beside", env=env, cwd=folder))
        key = key.splitlines()[-1]
        assert "nothing" in _finished(_command("migrate", env=env, cwd=folder))
        assert _postmaster(folder) == server_pid  # neither command stopped it
        runs = httpx.get(f"{base}/v1/runs", headers={"authorization": f"Bearer {key}"})
        assert runs.status_code == 200, runs.text
        assert runs.json() == {"runs": [], "nextCursor": None}
        assert httpx.get(f"{base}/readyz").status_code == 200
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(30) == 0
        assert _postmaster(folder) is None  # the last user stopped it
    finally:
        if serve.poll() is None:
            serve.kill()
        serve.communicate()


def test_commands_starting_at_once_share_one_server(folder: Path) -> None:
    """Several commands starting the embedded PostgreSQL of a fresh folder at once start one
    server, all succeed, and the last to finish stops it."""
    env = _env(folder, free_port())
    commands = [
        _command("migrate", env=env, cwd=folder),
        _command("keys", "create", env=env, cwd=folder),
        _command("keys", "create", env=env, cwd=folder),
        _command("migrate", env=env, cwd=folder),
    ]
    outputs = [_finished(c) for c in commands]
    assert sum(o.splitlines()[-1].startswith("sl_") for o in outputs) == 2
    assert _postmaster(folder) is None
