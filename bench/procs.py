"""The benchmark's processes: PostgreSQL, the orchestrator and the app, and their CPU and memory.

- :func:`database`: ``--database-url`` as given; else a fresh ``stepline_bench_<random>``
  database on the machine's PostgreSQL (127.0.0.1:5432), dropped afterwards; else an embedded
  PostgreSQL in a temporary folder, stopped afterwards.
- :class:`Service`: a child process (``stepline serve`` or uvicorn) with its log in a file,
  ended with SIGTERM (then SIGKILL) and, on Linux, killed when this process dies.
- :class:`Monitor`: samples the resident memory of each process tree in a thread and reads CPU
  times at the edges of each workload.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import psutil

MACHINE_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def database_dsn(dsn: str, database: str) -> str:
    """``dsn`` pointed at another database on the same server."""
    return urlunsplit(urlsplit(dsn)._replace(path=f"/{database}"))


@dataclass
class Database:
    """Where the orchestrator keeps its data, and who runs that server."""

    dsn: str
    kind: str  # "given", "machine" or "embedded"
    postmaster_pid: int | None = None
    version: str = ""

    @property
    def name(self) -> str:
        """The database's name (from the DSN's path)."""
        return urlsplit(self.dsn).path.lstrip("/") or "postgres"


async def _reachable(dsn: str) -> bool:
    try:
        conn = await asyncpg.connect(dsn, timeout=2)
    except (TimeoutError, OSError, asyncpg.PostgresError):
        return False
    await conn.close()
    return True


async def _execute(dsn: str, sql: str) -> None:
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def _describe(dsn: str, kind: str) -> Database:
    """The server's postmaster (the parent of our backend) and version."""
    conn = await asyncpg.connect(dsn, timeout=10)
    pid: int | None = None
    try:
        backend = int(await conn.fetchval("SELECT pg_backend_pid()"))
        version = str(await conn.fetchval("SHOW server_version"))
        # Ask while the backend lives: its parent is the postmaster.
        with contextlib.suppress(psutil.Error):
            parent = psutil.Process(backend).parent()
            pid = parent.pid if parent is not None else None
    finally:
        await conn.close()
    return Database(dsn, kind, pid, version)


@contextlib.asynccontextmanager
async def database(url: str | None) -> AsyncIterator[Database]:
    """The database the benchmark uses (see the module docstring), cleaned up afterwards."""
    if url:
        yield await _describe(url, "given")
        return
    if await _reachable(MACHINE_ADMIN_URL):
        name = f"stepline_bench_{uuid.uuid4().hex[:12]}"
        await _execute(MACHINE_ADMIN_URL, f'CREATE DATABASE "{name}"')
        try:
            yield await _describe(database_dsn(MACHINE_ADMIN_URL, name), "machine")
        finally:
            await _execute(MACHINE_ADMIN_URL, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        return
    import asyncio

    from stepline_server.store.embedded import EmbeddedPostgres

    # mkdtemp makes a private folder; PostgreSQL's own user must traverse it when we are root.
    tmp = Path(tempfile.mkdtemp(prefix="stepline-bench-pg-"))
    tmp.chmod(0o755)
    server = EmbeddedPostgres(tmp / "data")
    try:
        dsn = await asyncio.to_thread(server.start)
        yield await _describe(dsn, "embedded")
    finally:
        await asyncio.to_thread(server.stop)
        shutil.rmtree(tmp, ignore_errors=True)


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the benchmark dies (Linux only)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Service:
    """A child process serving HTTP on ``url``, with its output in ``log_path``."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str]
    url: str
    log_path: Path
    cwd: Path = ROOT
    proc: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = None

    def start(self) -> None:
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            list(self.argv),
            env=dict(self.env),
            cwd=self.cwd,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def wait_ready(self, path: str, timeout: float = 60.0) -> None:
        """Poll ``GET url+path`` until it answers 200; fail if the process exits first."""
        import asyncio

        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=2.0) as client:
            while time.monotonic() < deadline:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    response = await client.get(self.url + path)
                    if response.status_code == 200:
                        return
                await asyncio.sleep(0.1)
        raise RuntimeError(f"{self.name} was not ready within {timeout} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (a graceful uvicorn shutdown), then SIGKILL after ``timeout`` seconds."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self._log is not None:
            self._log.close()
            self._log = None


def orchestrator_argv() -> list[str]:
    """``stepline serve``: the console script beside this Python, else the module."""
    script = Path(sys.executable).parent / "stepline"
    if script.exists():
        return [str(script), "serve"]
    return [sys.executable, "-m", "stepline_server.cli.main", "serve"]


def app_argv(port: int) -> list[str]:
    """uvicorn serving :mod:`bench.app` (uvloop and httptools, as in production)."""
    return [
        sys.executable,
        "-m",
        "uvicorn",
        "bench.app:app",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--loop",
        "uvloop",
        "--http",
        "httptools",
        "--log-level",
        "warning",
        "--no-access-log",
    ]


def create_key(env: Mapping[str, str], cwd: Path) -> str:
    """An API key from ``stepline keys create`` (the key alone is its last line)."""
    argv = [*orchestrator_argv()[:-1], "keys", "create", "--name", "bench"]
    done = subprocess.run(
        argv, env=dict(env), cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"stepline keys create failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout.strip().splitlines()[-1].strip()


# -- measuring -------------------------------------------------------------------------------


_CLIENT_BACKEND = re.compile(r"\d+\.\d+\.\d+\.\d+\(\d+\)|\[local\]|::1\(\d+\)")


def backend_filter(database: str) -> Callable[[psutil.Process], bool | None]:
    """For a shared server: keep the auxiliary processes and the backends of ``database``.

    A client backend's title is ``postgres: [cluster: ]user database host(port) state``; those
    of other databases (another benchmark, a test suite) are left out. Answers None (ask again
    later) for a process that does not show a client backend's title yet.
    """
    mark = f" {database} "

    def keep(proc: psutil.Process) -> bool | None:
        try:
            title = " ".join(proc.cmdline()) + " "
        except psutil.Error:
            return False
        if _CLIENT_BACKEND.search(title):
            return mark in title
        return None

    return keep


class Tree:
    """A process and (optionally) its descendants, summed: CPU seconds and resident memory.

    For a PostgreSQL server, shared memory would be counted once per backend; the root's RSS
    plus each descendant's private part (RSS minus shared) avoids that. With ``keep``, the
    descendants it rejects (False) do not count, nor does the CPU of reaped children (which
    ``keep`` cannot judge).
    """

    def __init__(
        self,
        pid: int,
        *,
        children: bool,
        keep: Callable[[psutil.Process], bool | None] | None = None,
    ) -> None:
        self.root = psutil.Process(pid)
        self.children = children
        self.keep = keep
        self._known: dict[int, psutil.Process] = {}
        self._kept: dict[int, bool] = {}
        self._cached: tuple[float, list[psutil.Process]] = (0.0, [])

    def _recent_members(self) -> list[psutil.Process]:
        """The members as found at most a second ago: finding them scans every process, which
        would cost this process (and the machine) more than the sampling itself."""
        at, members = self._cached
        if time.monotonic() - at > 1.0:
            members = self._members()
            self._cached = (time.monotonic(), members)
        return members

    def _members(self) -> list[psutil.Process]:
        if not self.children:
            return [self.root]
        try:
            found = self.root.children(recursive=True)
        except psutil.Error:
            return [self.root]
        members = [self.root]
        for proc in found:
            # Keep one Process object per pid, so cpu_times keeps working on it.
            known = self._known.setdefault(proc.pid, proc)
            if self.keep is not None:
                kept = self._kept.get(proc.pid)
                if kept is None:
                    kept = self.keep(known)
                    if kept is not None:  # a client backend: decided for good
                        self._kept[proc.pid] = kept
                if kept is False:
                    continue
            members.append(known)
        return members

    def cpu(self) -> float:
        """CPU seconds so far (user + system), including reaped children when not filtered."""
        total = 0.0
        for i, proc in enumerate(self._members()):
            with contextlib.suppress(psutil.Error):
                t = proc.cpu_times()
                total += t.user + t.system
                if i == 0 and self.children and self.keep is None:
                    total += t.children_user + t.children_system
        return total

    def rss(self) -> int:
        total = 0
        for i, proc in enumerate(self._recent_members()):
            with contextlib.suppress(psutil.Error):
                mem = proc.memory_info()
                total += mem.rss if i == 0 else max(0, mem.rss - getattr(mem, "shared", 0))
        return total

    def alive(self) -> bool:
        return bool(self.root.is_running())


@dataclass
class Usage:
    """What one process tree used during a measured span."""

    cpu_s: float
    peak_rss_mb: float
    end_rss_mb: float


@dataclass
class Span:
    """A measured span: CPU at its start and the peak memory seen since."""

    start: float
    cpu_start: dict[str, float]
    peaks: dict[str, int] = field(default_factory=dict)


class Monitor:
    """Samples every tree's RSS every ``interval`` seconds in a daemon thread."""

    def __init__(self, interval: float = 0.25) -> None:
        self.trees: dict[str, Tree] = {}
        self.interval = interval
        self._spans: list[Span] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-monitor", daemon=True)

    def add(
        self,
        name: str,
        pid: int,
        *,
        children: bool = False,
        keep: Callable[[psutil.Process], bool | None] | None = None,
    ) -> None:
        with contextlib.suppress(psutil.Error):
            self.trees[name] = Tree(pid, children=children, keep=keep)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self) -> dict[str, int]:
        now = {name: tree.rss() for name, tree in self.trees.items()}
        with self._lock:
            for span in self._spans:
                for name, rss in now.items():
                    span.peaks[name] = max(span.peaks.get(name, 0), rss)
        return now

    def begin(self) -> Span:
        """Start measuring a span."""
        span = Span(time.monotonic(), {n: t.cpu() for n, t in self.trees.items()})
        with self._lock:
            self._spans.append(span)
        self._sample()
        return span

    def end(self, span: Span) -> dict[str, Usage]:
        """Stop measuring ``span``: each tree's CPU seconds, peak and final RSS in it."""
        now = self._sample()
        with self._lock:
            self._spans.remove(span)
        usage: dict[str, Usage] = {}
        for name, tree in self.trees.items():
            cpu = tree.cpu() - span.cpu_start.get(name, 0.0)
            usage[name] = Usage(
                cpu_s=round(max(0.0, cpu), 2),
                peak_rss_mb=round(span.peaks.get(name, 0) / 2**20, 1),
                end_rss_mb=round(now.get(name, 0) / 2**20, 1),
            )
        return usage

    @contextlib.contextmanager
    def measure(self) -> Iterator[dict[str, Usage]]:
        """``with monitor.measure() as usage:`` fills ``usage`` when the block ends."""
        span = self.begin()
        usage: dict[str, Usage] = {}
        try:
            yield usage
        finally:
            usage.update(self.end(span))


def tool_env(base: Mapping[str, str], **changes: str) -> dict[str, str]:
    """The environment for a child: ours, with ``changes``."""
    env = dict(base)
    env.update(changes)
    return env


def describe_machine() -> dict[str, Any]:
    """CPU count, memory and Python, for the JSON's meta."""
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": sys.version.split()[0],
        "platform": sys.platform,
    }
