"""A private Citus cluster for the chaos test (``--citus``): a coordinator and two workers on
loopback, started by ``../shared/citus/cluster.sh`` (``CITUS_SCRIPTS`` names another folder of
it; Citus must be installed: ``build.sh``) in a temporary folder, with a database ``stepline``
made on every node with the extension and the workers added.

It answers what :class:`tests.chaos.postgres.PrivateCluster` answers, so the scenario runs the
same on it: the ``postgres-restart`` fault restarts every node at once, immediately (no
checkpoint, every connection cut, the coordinator's two-phase commits in flight left for
Citus's recovery), and the deadlocks counted are those every node logged.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

from tests.chaos.postgres import find_bin_dir, log_tail
from tests.ports import free_port

__all__ = ["CitusCluster", "cluster_script", "three_free_ports"]

WORKERS = 2
DATABASE = "stepline"
RECOVER_2PC = "2s"


def cluster_script() -> Path:
    """``cluster.sh``: in ``CITUS_SCRIPTS``, else ``../shared/citus/`` beside the project."""
    folder = os.environ.get("CITUS_SCRIPTS")
    root = Path(__file__).resolve().parents[2]
    return Path(folder) / "cluster.sh" if folder else root.parent / "shared/citus/cluster.sh"


def three_free_ports() -> int:
    """A port with the next ``WORKERS`` free too (the coordinator's, then the workers')."""
    while True:
        port = free_port()
        free = True
        for other in range(port + 1, port + 1 + WORKERS):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", other))
                except OSError:
                    free = False
                    break
        if free:
            return port


class CitusCluster:
    """A coordinator on ``port`` and its workers on the next ports, in a folder of its own."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.root = Path(tempfile.mkdtemp(prefix="stepline-chaos-citus-"))
        self.root.chmod(0o755)  # the postgres user the servers run as must traverse it
        self.folder = self.root / "cluster"
        self.bin_dir = find_bin_dir()
        self._started = False

    @property
    def admin_dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{DATABASE}"

    @property
    def log_path(self) -> Path:
        return self.folder / f"node{self.port}.log"

    def _nodes(self) -> list[int]:
        try:
            return [int(p) for p in (self.folder / "ports").read_text().split()]
        except OSError:
            return []

    def _call(self, argv: list[str], what: str, timeout: float = 180.0) -> None:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            start_new_session=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{what} failed: {done.stderr}{self.tail()}")

    def _script(self, *args: str, timeout: float = 180.0) -> None:
        self._call(["bash", str(cluster_script()), *args], f"cluster.sh {args[0]}", timeout)

    def init(self) -> None:
        """Start the nodes (initdb each first) and make the database on every one; the
        coordinator settles the two-phase commits a crash left in doubt every 2 s (Citus's
        default is every minute: until then their row locks hold runs still, and docs/scaling.md
        recommends the same setting)."""
        self._script("start", str(self.folder), str(self.port), str(WORKERS))
        self._started = True
        self._script("createdb", str(self.folder), DATABASE)
        self._call(
            ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(self.port),
             "-U", "postgres", "-d", "postgres",
             "-c", f"ALTER SYSTEM SET citus.recover_2pc_interval = '{RECOVER_2PC}'",
             "-c", "SELECT pg_reload_conf()"],
            "setting recover_2pc_interval", 60,
        )  # fmt: skip

    def start(self) -> None:
        """The nodes run from :meth:`init` on."""

    def restart_immediate(self) -> None:
        """``pg_ctl restart -m immediate`` on every node, the coordinator first."""
        user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        for port in self._nodes():
            self._call(
                [*user, str(self.bin_dir / "pg_ctl"), "-w", "-t", "60", "-m", "immediate",
                 "-D", str(self.folder / f"node{port}"),
                 "-l", str(self.folder / f"node{port}.log"), "restart"],
                f"pg_ctl restart of node {port}", 90,
            )  # fmt: skip

    def stop(self) -> None:
        """Stop every node; never raises."""
        if not self._started:
            return
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self._script("stop", str(self.folder), timeout=120)

    def deadlocks(self) -> int:
        """How many ``deadlock detected`` lines the nodes have logged."""
        count = 0
        for port in self._nodes():
            try:
                text = (self.folder / f"node{port}.log").read_text(errors="replace")
            except OSError:
                continue
            count += text.count("deadlock detected")
        return count

    def tail(self, lines: int = 20) -> str:
        return log_tail(self.log_path, lines)

    def remove(self) -> None:
        """Stop the nodes and delete the folder."""
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
