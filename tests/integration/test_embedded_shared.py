"""One embedded PostgreSQL used by several processes: stopped only by the last one to leave."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import psutil
import pytest

from stepline_server.store.embedded import EmbeddedPostgres

pytestmark = pytest.mark.slow

_USER = """
import sys
from pathlib import Path
from stepline_server.store.embedded import EmbeddedPostgres
pg = EmbeddedPostgres(Path(sys.argv[1]))
print("DSN", pg.start(), flush=True)
sys.stdin.readline()
pg.stop()
print("STOPPED", flush=True)
"""


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """A data folder PostgreSQL's own user can reach (as root it runs as another user)."""
    folder = Path(tempfile.mkdtemp(prefix="stepline-embedded-"))
    folder.chmod(0o755)
    yield folder / "data"
    EmbeddedPostgres(folder / "data").stop()
    shutil.rmtree(folder, ignore_errors=True)


def _user(data_dir: Path) -> tuple[subprocess.Popen[str], str]:
    """A process that starts (or adopts) the server and stops it when told; and the DSN."""
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_USER), str(data_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = next(line for line in proc.stdout if line.startswith("DSN "))  # after the log lines
    return proc, line.split()[1]


def _leave(proc: subprocess.Popen[str]) -> None:
    out, _ = proc.communicate("\n", timeout=60)
    assert proc.returncode == 0 and "STOPPED" in out


def _server_pid(data_dir: Path) -> int | None:
    pid_file = data_dir / "postmaster.pid"
    if not pid_file.exists():
        return None
    pid = int(pid_file.read_text().splitlines()[0])
    return pid if psutil.pid_exists(pid) else None


def _answers(dsn: str) -> bool:
    async def ask() -> bool:
        conn = await asyncpg.connect(dsn)
        try:
            return bool(await conn.fetchval("SELECT true"))
        finally:
            await conn.close()

    return asyncio.run(ask())


def test_the_process_that_started_the_server_leaves_it_to_a_later_user(data_dir: Path) -> None:
    """When the process that started the server stops while another still uses it, the server
    keeps running for that other process, which stops it when it leaves."""
    starter, dsn = _user(data_dir)
    pid = _server_pid(data_dir)
    guest, guest_dsn = _user(data_dir)
    try:
        assert guest_dsn == dsn and _server_pid(data_dir) == pid  # adopted, not restarted
        _leave(starter)
        assert _server_pid(data_dir) == pid and _answers(guest_dsn)
        _leave(guest)
        assert _server_pid(data_dir) is None
    finally:
        for proc in (starter, guest):
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def test_a_user_killed_with_kill_9_does_not_keep_the_server_running(data_dir: Path) -> None:
    """A user killed without stopping no longer counts: the next user to stop stops it."""
    killed, _ = _user(data_dir)
    killed.kill()
    killed.communicate()
    pg = EmbeddedPostgres(data_dir)
    assert _answers(pg.start())
    pg.stop()
    assert _server_pid(data_dir) is None
