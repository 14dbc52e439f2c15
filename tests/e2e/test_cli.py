"""The ``stepline`` command: dev runs the example end to end, migrate and keys create work."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from tests.support import free_port

ROOT = Path(__file__).resolve().parents[2]


def _stepline(*args: str, env: dict[str, str], cwd: Path, timeout: float = 120) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "stepline_server.cli.main", *args],
        env={**os.environ, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_dev_runs_the_example_on_embedded_postgres(tmp_path: Path) -> None:
    """`stepline dev --once` starts embedded PostgreSQL, registers the example app, runs a
    workflow to completion and prints an API key and curl lines; its data survives a restart."""
    tmp_path.chmod(0o755)
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "app.py").write_text((ROOT / "examples" / "app.py").read_text())
    env = {"STEPLINE_PORT": str(free_port()), "STEPLINE_LOG_LEVEL": "warning"}
    env.pop("DATABASE_URL", None)
    os.environ.pop("DATABASE_URL", None)
    args = ["dev", "--once", "--app-port", str(free_port())]
    out = _stepline(*args, env=env, cwd=tmp_path)
    assert "Run completed" in out and "send-welcome" in out
    assert "API key (dev): sl_" in out and "curl -s -X POST" in out
    assert "embedded PostgreSQL, data in" in out
    assert "Dashboard: http://127.0.0.1:" in out and "/ui/" in out
    assert "<id>" not in out and "?wait=30s'" in out  # a curl line that runs as pasted
    again = _stepline(*args, env=env, cwd=tmp_path)
    assert "Run completed" in again


@pytest.mark.slow
def test_dev_prints_a_stepline_line_that_runs_as_printed(tmp_path: Path) -> None:
    """The `stepline runs list` line `stepline dev` prints runs as printed in a shell whose
    PATH does not have the command (as after `make dev`, the virtualenv not activated), and
    lists the demo run."""
    tmp_path.chmod(0o755)
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "app.py").write_text((ROOT / "examples" / "app.py").read_text())
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env |= {
        "PATH": "/usr/bin:/bin",
        "PYTHONUNBUFFERED": "1",
        "STEPLINE_PORT": str(free_port()),
        "STEPLINE_LOG_LEVEL": "warning",
    }
    assert shutil.which("stepline", path=env["PATH"]) is None
    dev = subprocess.Popen(
        [sys.executable, "-m", "stepline_server.cli.main", "dev", "--app-port", str(free_port())],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert dev.stdout is not None
        printed = []
        for line in dev.stdout:
            printed.append(line)
            if "runs list" in line:
                break
        demo = next(line.split()[2] for line in printed if line.startswith("Demo run "))
        command = printed[-1].strip()
        assert "runs list" in command, "".join(printed)
        done = subprocess.run(
            ["sh", "-c", command], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, (command, done.stderr)
        assert demo in done.stdout and "completed" in done.stdout
    finally:
        dev.send_signal(signal.SIGINT)
        try:
            dev.wait(60)
        except subprocess.TimeoutExpired:
            dev.kill()
            dev.wait()
        if dev.stdout is not None:
            dev.stdout.close()


def test_migrate_and_keys_create(database_url: str, tmp_path: Path) -> None:
    """`stepline migrate` is idempotent and `stepline keys create` prints a working key last."""
    env = {"DATABASE_URL": database_url, "STEPLINE_LOG_LEVEL": "warning"}
    assert "nothing" in _stepline("migrate", env=env, cwd=tmp_path)
    key = _stepline("keys", "create", "--name", "ci", env=env, cwd=tmp_path).splitlines()[-1]
    assert key.startswith("sl_")
    port = free_port()
    serve = subprocess.Popen(
        [sys.executable, "-m", "stepline_server.cli.main", "serve", "--port", str(port)],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(200):
            try:
                answer = httpx.get(
                    f"http://127.0.0.1:{port}/v1/runs", headers={"authorization": f"Bearer {key}"}
                )
                break
            except httpx.HTTPError:
                if serve.poll() is not None:
                    raise
                time.sleep(0.05)
        assert answer.status_code == 200 and answer.json() == {"runs": [], "nextCursor": None}
    finally:
        serve.terminate()
        serve.wait(10)


@pytest.mark.slow
def test_serve_on_sigterm_stops_its_embedded_postgres() -> None:
    """`stepline serve` without DATABASE_URL exits cleanly on SIGTERM and stops the embedded
    PostgreSQL it started (no server is left running on the data folder)."""
    folder = Path(tempfile.mkdtemp(prefix="stepline-serve-", dir="/tmp"))
    folder.chmod(0o755)  # no private folder above the data, so it stays where it is put
    port = free_port()
    env = {
        **os.environ,
        "STEPLINE_PORT": str(port),
        "STEPLINE_LOG_LEVEL": "warning",
        "STEPLINE_DATA_DIR": str(folder / ".stepline"),
    }
    env.pop("DATABASE_URL", None)
    serve = subprocess.Popen(
        [sys.executable, "-m", "stepline_server.cli.main", "serve"],
        env=env,
        cwd=folder,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(600):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200:
                    break
            except httpx.HTTPError:
                assert serve.poll() is None, "stepline serve exited early"
                time.sleep(0.05)
        assert list(folder.rglob("postmaster.pid"))  # the embedded server runs here
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(30) == 0
        assert not list(folder.rglob("postmaster.pid"))
    finally:
        if serve.poll() is None:
            serve.kill()
        shutil.rmtree(folder, ignore_errors=True)
