"""``stepline dev MODULE:ATTR`` and ``stepline dev URL``: a user's app on disk served, registered,
synced, and synced again when its code changes, with what changed and which runs in flight the
new code would break printed."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from stepline_server.cli import devloop
from tests.support import free_port

APP_V1 = """
import stepline

sl = stepline.Stepline()

@sl.workflow("checkout", retries=stepline.Retries(attempts=3))
async def checkout(ctx, input):
    await ctx.step("reserve", lambda: "held")
    approval = await ctx.callback("approval", timeout="1h")
    return await approval.wait()

@sl.workflow("refund")
async def refund(ctx, input):
    return await ctx.step("pay-back", lambda: "ok")
"""

# "refund" gone, "ship" new, checkout's retries changed and its first step renamed.
APP_V2 = """
import stepline

sl = stepline.Stepline()

@sl.workflow("checkout", retries=stepline.Retries(attempts=5))
async def checkout(ctx, input):
    await ctx.step("hold", lambda: "held")
    approval = await ctx.callback("approval", timeout="1h")
    return await approval.wait()

@sl.workflow("ship")
async def ship(ctx, input):
    return await ctx.step("label", lambda: "ok")
"""


class Output:
    """A process's stdout, line by line, read in a thread so a test can wait with a limit."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        assert proc.stdout is not None
        self.stream = proc.stdout
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.stream:
            self.lines.put(line)

    def close(self) -> None:
        """After the process ended: the rest read, the pipe closed (unless something still
        holds it open, when the reading thread is left to end with the test run)."""
        self.reader.join(timeout=10)
        if not self.reader.is_alive():
            self.stream.close()

    def until(self, text: str, timeout: float = 60) -> list[str]:
        """The lines printed up to and including the first one holding ``text``."""
        got: list[str] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                continue
            got.append(line.rstrip("\n"))
            self.seen.append(got[-1])
            if text in line:
                return got
        raise AssertionError(f"{text!r} never printed; printed: {self.seen}")


@contextmanager
def dev(args: list[str], cwd: Path, database_url: str) -> Iterator[tuple[Output, str]]:
    """``stepline dev ARGS`` running in ``cwd``; yields its output and the orchestrator's URL.
    Stopped with Ctrl-C on leaving (SIGINT to its process group, as a terminal sends it),
    which must end it with status 0; killed with its children if it does not."""
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "STEPLINE_PORT": str(port),
        "STEPLINE_LOG_LEVEL": "warning",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "stepline_server.cli.main", "dev", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    out = Output(proc)
    try:
        yield out, f"http://127.0.0.1:{port}"
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of it (its app) goes too
        proc.wait()
        out.close()


def test_an_edited_app_is_synced_again_with_what_changed_and_the_runs_it_breaks(
    tmp_path: Path, database_url: str
) -> None:
    """`stepline dev shop:sl` serves the module, registers and syncs it (its workflows printed
    as added); editing the file syncs it again and prints the workflow removed, the one added,
    the option changed, and that the run waiting in flight would break."""
    (tmp_path / "shop.py").write_text(APP_V1)
    app_port = free_port()
    with dev(["shop:sl", "--app-port", str(app_port)], tmp_path, database_url) as (out, url):
        first = out.until("Watching")
        text = "\n".join(first)
        assert "App shop (" in text and f"http://127.0.0.1:{app_port}/" in text
        assert "+ added checkout" in text and "+ added refund" in text
        assert "replay-check: no runs in flight" in text
        key = next(x.split("API key (dev): ")[1] for x in first if "API key (dev): " in x)
        headers = {"authorization": f"Bearer {key}"}
        run = httpx.post(
            f"{url}/v1/runs", json={"workflow": "checkout", "input": {}}, headers=headers
        ).json()
        for _ in range(200):  # until it waits on its callback, so it is in flight
            got = httpx.get(f"{url}/v1/runs/{run['id']}", headers=headers).json()
            if any(s["status"] == "waiting" for s in got["steps"]):
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"the run never waited: {got}")

        (tmp_path / "shop.py").write_text(APP_V2)
        text = "\n".join(out.until("replay-check:"))
        assert "Changed: shop.py" in text
        assert "- removed refund" in text and "+ added ship" in text
        assert "~ changed checkout: retries.attempts 3 -> 5" in text
        assert "1 would break" in text
        breaking = out.until(run["id"])[-1]
        assert breaking.strip().startswith("differs") and "reserve" in breaking
        workflows = httpx.get(f"{url}/v1/workflows", headers=headers).json()["workflows"]
        assert {w["name"] for w in workflows} >= {"checkout", "ship"}


def test_an_app_that_does_not_import_is_reported_and_picked_up_once_fixed(
    tmp_path: Path, database_url: str
) -> None:
    """A syntax error in the edited module is shown and nothing is synced; saving a fixed
    version syncs it."""
    (tmp_path / "shop.py").write_text(APP_V1)
    with dev(["shop:sl", "--app-port", str(free_port())], tmp_path, database_url) as (out, _):
        out.until("Watching")
        (tmp_path / "shop.py").write_text(APP_V1 + "\ndef broken(:\n")
        out.until("The app did not start")
        (tmp_path / "shop.py").write_text(APP_V2)
        assert any("+ added ship" in x for x in out.until("replay-check:"))


def test_an_app_reached_by_url_is_synced_with_the_dev_secret(
    tmp_path: Path, database_url: str
) -> None:
    """`stepline dev http://127.0.0.1:PORT/` syncs an app the user runs with the dev secret;
    `--once` exits after that sync. A URL off loopback is refused."""
    (tmp_path / "shop.py").write_text(APP_V1)
    app_port = free_port()
    env = {**os.environ, "STEPLINE_SIGNING_SECRET": devloop.DEV_SECRET}
    argv = [sys.executable, "-m", "stepline_server.cli.devapp", "shop:sl"]
    app = subprocess.Popen([*argv, "--port", str(app_port)], cwd=tmp_path, env=env)
    try:
        with dev([f"http://127.0.0.1:{app_port}/", "--name", "mine"], tmp_path, database_url) as (
            out,
            _,
        ):
            text = "\n".join(out.until("Watching"))
            assert "Synced mine: workflows checkout, refund" in text
            assert "replay-check" not in text  # no code given to check against
    finally:
        app.terminate()
        app.wait()
    refused = subprocess.run(
        [sys.executable, "-m", "stepline_server.cli.main", "dev", "http://example.com/", "--once"],
        env={**os.environ, "DATABASE_URL": database_url, "STEPLINE_PORT": str(free_port())},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1 and "loopback only" in refused.stderr


def test_changes_lists_added_removed_and_changed_options() -> None:
    """The change report names each workflow added or removed and each option changed, and
    names a schema change without printing it."""
    before = {"a": {"retries": {"attempts": 3}}, "b": {}, "c": {"inputSchema": {"x": 1}}}
    after = {
        "a": {"retries": {"attempts": 5}, "timeoutMs": 60000},
        "d": {},
        "c": {"inputSchema": {"x": 2}},
    }
    assert devloop.changes(before, after) == [
        "  + added d",
        "  - removed b (no longer in the code; its runs in flight cannot go on)",
        "  ~ changed a: retries.attempts 3 -> 5",
        "  ~ changed a: timeoutMs - -> 60000",
        "  ~ changed c: inputSchema",
    ]
