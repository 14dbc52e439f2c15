"""The folder ``serve --workers`` shares metrics through; set before prometheus-client loads.

prometheus-client picks how it stores values when it is imported, from its own variable
``PROMETHEUS_MULTIPROC_DIR``: this module must not import it at the top.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

ENV = "PROMETHEUS_MULTIPROC_DIR"


def multiprocess_mode() -> bool:
    """Whether metric values are shared through a multiprocess folder."""
    return bool(os.environ.get(ENV))


@contextmanager
def folder(workers: int) -> Iterator[None]:
    """For ``serve --workers N`` (N > 1) with no folder set: a fresh folder for the workers'
    values for as long as they serve, removed afterwards (child workers inherit the variable).
    A folder the operator set is used as it is."""
    if workers <= 1 or multiprocess_mode():
        yield
        return
    path = tempfile.mkdtemp(prefix="stepline-metrics-")
    os.environ[ENV] = path
    try:
        yield
    finally:
        os.environ.pop(ENV, None)
        shutil.rmtree(path, ignore_errors=True)


def worker_exited(pid: int) -> None:
    """Forget a dead worker's live gauges (its counters still count)."""
    if multiprocess_mode():
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]
