"""The transport floor benchmark at a tiny size, so it never rots: both transports answer every
exchange and a line is printed for each. No timing is asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_both_transports_answer_every_exchange() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.transport", "--calls", "20", "--rounds", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    rows = [line.split() for line in done.stdout.splitlines()]
    assert rows[0][0] == "transport"
    assert [(row[0], row[1]) for row in rows[1:]] == [("http", "20"), ("websocket", "20")]
    assert all(float(value) >= 0 for row in rows[1:] for value in row[2:])
