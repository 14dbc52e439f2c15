"""The ``stepline`` command as installed: the orchestrator's CLI, or a clear hint without it."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from stepline.cli import main as sdk_cli

ROOT = Path(__file__).resolve().parents[2]

# Runs the entry point the way the installed script does, with structlog made unimportable.
WITHOUT_STRUCTLOG = """
import sys
sys.modules["structlog"] = None
from stepline.cli.main import main
sys.exit(main())
"""


def _run(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_command_points_at_the_sdk_shim() -> None:
    """pyproject's ``stepline`` script is the SDK's shim, not the orchestrator's module."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    assert scripts["stepline"] == "stepline.cli.main:main"


def test_without_the_server_extra_help_works_and_server_commands_say_what_to_install() -> None:
    """With a server-extra module missing, ``stepline --help`` lists every command (``worker``
    too) and exits 0; ``serve``, ``dev`` and ``migrate`` exit 2 with an install hint, no
    traceback."""
    helped = _run(WITHOUT_STRUCTLOG, "--help")
    assert helped.returncode == 0, helped.stderr
    for command in ("runs", "apps", "schedules", "events", "workflows", "worker", "serve"):
        assert f"    {command}" in helped.stdout
    for command in ("serve", "dev", "migrate"):
        done = _run(WITHOUT_STRUCTLOG, command)
        assert done.returncode == 2
        assert done.stderr.strip() == sdk_cli.MISSING_EXTRA.format(command=command)
        assert "pip install 'stepline[server]'" in done.stderr
        assert "Traceback" not in done.stderr


def test_with_the_server_extra_the_command_runs() -> None:
    """With everything installed, ``stepline --help`` prints the orchestrator's help, exit 0."""
    done = _run("import sys; from stepline.cli.main import main; sys.exit(main())", "--help")
    assert done.returncode == 0, done.stderr
    assert "migrate" in done.stdout and "worker" in done.stdout
