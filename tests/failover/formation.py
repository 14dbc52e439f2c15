"""A pg_auto_failover formation the failover test owns: a monitor and three PostgreSQL nodes on
loopback, in a temporary folder, each node a ``pg_autoctl`` keeper in its own process group
(its PostgreSQL runs in that group too, so ``kill -9`` of the group is the node dying whole).

Debian's ``postgresql-15-auto-failover`` and ``pg-auto-failover-cli`` provide ``pg_autoctl``.
Every command runs as the ``postgres`` system user (PostgreSQL refuses root), with the XDG
folders (where pg_autoctl keeps its state) inside the temporary folder. Nodes listen on
127.0.0.1 only, with ``--auth trust --no-ssl``. By default one standby must confirm each commit
(``synchronous_standby_names = 'ANY 1 (...)'``); :meth:`Formation.make_asynchronous` takes every
node out of the write quorum.

It offers what :class:`tests.chaos.postgres.PrivateCluster` does (``init``, ``start``,
``admin_dsn``, ``deadlocks``, ``tail``, ``remove``), so the chaos set-up runs on it unchanged;
``admin_dsn`` is the multi-host DSN with ``target_session_attrs=read-write``.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.ports import free_port

__all__ = ["Formation", "available"]

_BIN = Path("/usr/lib/postgresql/15/bin")


def available() -> bool:
    """Whether pg_autoctl and its PostgreSQL are installed, and a ``postgres`` user exists."""
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return False
    return shutil.which("pg_autoctl") is not None and (_BIN / "pg_ctl").exists()


class Node:
    """One keeper (and its PostgreSQL), started with ``pg_autoctl create postgres --run``."""

    def __init__(self, name: str, root: Path, monitor: str) -> None:
        self.name = name
        self.port = free_port()
        self.pgdata = root / name
        self.log_path = root / f"{name}.log"
        self.monitor = monitor
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def argv(self) -> list[str]:
        if self.starts > 0:  # created already: run its keeper again
            return ["pg_autoctl", "run", "--pgdata", str(self.pgdata)]
        return [
            "pg_autoctl", "create", "postgres", "--pgdata", str(self.pgdata),
            "--pgport", str(self.port), "--hostname", "127.0.0.1", "--listen", "127.0.0.1",
            "--name", self.name, "--auth", "trust", "--no-ssl", "--pgctl", str(_BIN / "pg_ctl"),
            "--monitor", self.monitor, "--run",
        ]  # fmt: skip

    def postmaster_pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int((self.pgdata / "postmaster.pid").read_text().split()[0])
        return None


class Formation:
    """The monitor and three nodes; :meth:`primary` names the node the monitor calls primary."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="stepline-failover-"))
        self.root.chmod(0o755)
        shutil.chown(self.root, "postgres")
        self.monitor_port = free_port()
        self.monitor = f"postgres://autoctl_node@127.0.0.1:{self.monitor_port}/pg_auto_failover"
        self.monitor_proc: subprocess.Popen[bytes] | None = None
        self.nodes = [Node(f"node{n}", self.root, self.monitor) for n in (1, 2, 3)]
        self.log_path = self.root / "monitor.log"

    # -- what the chaos set-up uses ---------------------------------------------------------

    @property
    def admin_dsn(self) -> str:
        hosts = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)
        return f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write"

    def init(self) -> None:
        """The monitor, then the nodes one by one; waits for a primary and two standbys."""
        argv = [
            "pg_autoctl", "create", "monitor", "--pgdata", str(self.root / "monitor"),
            "--pgport", str(self.monitor_port), "--hostname", "127.0.0.1",
            "--listen", "127.0.0.1", "--auth", "trust", "--no-ssl",
            "--pgctl", str(_BIN / "pg_ctl"), "--run",
        ]  # fmt: skip
        self.monitor_proc = self._spawn(argv, self.log_path)
        self._until(lambda: self._cli("show", "state", "--json") is not None, 60, "the monitor")
        for node in self.nodes:
            self.start_node(node)
            self.wait_formed(120, members=self.nodes.index(node) + 1)

    def start(self) -> None:
        """Formed by :meth:`init` already."""

    def deadlocks(self) -> int:
        count = 0
        for node in self.nodes:
            for log in (node.pgdata / "log").glob("*"):
                with contextlib.suppress(OSError):
                    count += log.read_text(errors="replace").count("deadlock detected")
        return count

    def tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def remove(self, *, delete: bool = True) -> None:
        """Kill every keeper, PostgreSQL and the monitor; delete the folder (unless not
        ``delete``: its logs are kept). Never raises."""
        for node in self.nodes:
            self.kill_node(node)
        _kill_group(self.monitor_proc)
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int((self.root / "monitor" / "postmaster.pid").read_text().split()[0])
            os.kill(pid, signal.SIGKILL)
        if delete:
            shutil.rmtree(self.root, ignore_errors=True)

    # -- faults -------------------------------------------------------------------------------

    def states(self) -> list[dict[str, Any]]:
        """The monitor's view of each node (``pg_autoctl show state --json``)."""
        return self._cli("show", "state", "--json") or []

    def primary(self) -> Node | None:
        for state in self.states():
            if state.get("current_group_state") in ("primary", "wait_primary", "single"):
                return next((n for n in self.nodes if n.port == state["nodeport"]), None)
        return None

    def wait_formed(self, timeout: float, members: int = 3) -> None:
        """Until ``members`` nodes report: one primary, the others secondaries."""

        def formed() -> bool:
            states = [s.get("current_group_state") for s in self.states()]
            want = ["primary"] + ["secondary"] * (members - 1) if members > 1 else ["single"]
            return sorted(states) == sorted(want)

        self._until(formed, timeout, f"a formation of {members}")

    def timeline(self) -> int:
        """The highest timeline a node reports (1, then 2 after a promotion, ...)."""
        return max((int(s.get("reported_tli") or 0) for s in self.states()), default=0)

    def wait_timeline(self, timeline: int, timeout: float) -> bool:
        """Until a node reports ``timeline`` or later (False when none did in time)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.timeline() >= timeline:
                return True
            time.sleep(0.2)
        return False

    def kill_postmaster(self, node: Node) -> None:
        """``kill -9`` of the node's PostgreSQL alone (its keeper lives on)."""
        pid = node.postmaster_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def kill_node(self, node: Node) -> None:
        """``kill -9`` of the keeper's process group: the node dies whole."""
        _kill_group(node.proc)
        self.kill_postmaster(node)

    def start_node(self, node: Node) -> None:
        node.proc = self._spawn(node.argv(), node.log_path)
        node.starts += 1

    def make_asynchronous(self) -> None:
        """No standby confirms commits any more: none is required, and every node leaves the
        write quorum (the first alone keeps ``ANY 1 (...)``)."""
        # Each change is refused while the primary applies the one before: try until it holds.
        self._until(
            lambda: self._cli("set", "formation", "number-sync-standbys", "0") is not None,
            60,
            "number-sync-standbys 0",
        )
        for node in self.nodes:
            pgdata = str(node.pgdata)
            self._until(
                lambda pgdata=pgdata: (
                    self._cli(  # type: ignore[misc]
                        "set", "node", "replication-quorum", "false", "--pgdata", pgdata
                    )
                    is not None
                ),
                60,
                f"replication-quorum false on {node.name}",
            )
        self._until(self._asynchronous, 60, "asynchronous replication")

    def _asynchronous(self) -> bool:
        primary = self.primary()
        if primary is None:
            return False
        done = subprocess.run(
            [str(_BIN / "psql"), "-XAtq", "-h", "127.0.0.1", "-p", str(primary.port),
             "-U", "postgres", "-c", "SHOW synchronous_standby_names", "postgres"],
            capture_output=True, text=True, errors="replace", timeout=10, check=False,
        )  # fmt: skip
        return done.returncode == 0 and done.stdout.strip() == ""

    # -- plumbing -----------------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "XDG_"))}
        env.update(
            XDG_CONFIG_HOME=str(self.root / "config"),
            XDG_DATA_HOME=str(self.root / "data"),
            XDG_RUNTIME_DIR=str(self.root / "run"),
            PATH=f"{_BIN}:{env.get('PATH', '')}",
            HOME=str(self.root),
        )
        return env

    def _spawn(self, argv: list[str], log_path: Path) -> subprocess.Popen[bytes]:
        log = log_path.open("ab")
        shutil.chown(log_path, "postgres")
        return subprocess.Popen(
            argv,
            user="postgres",
            env=self._env(),
            cwd=self.root,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _cli(self, *args: str) -> Any:
        argv = ["pg_autoctl", *args]
        if "--pgdata" not in args:
            argv += ["--monitor", self.monitor]
        done = subprocess.run(
            argv, user="postgres", env=self._env(), cwd=self.root, capture_output=True,
            text=True, errors="replace", timeout=90, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            return None
        with contextlib.suppress(ValueError):
            return json.loads(done.stdout) if "--json" in args else done.stdout
        return None

    def _until(self, probe: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if probe():
                return
            time.sleep(0.5)
        raise RuntimeError(f"pg_auto_failover: no {what} within {timeout:g} s\n{self.tail()}")


def _kill_group(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)
