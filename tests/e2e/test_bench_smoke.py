"""The benchmark at a tiny size, so it never rots: every workload runs and every run completes.

It runs ``python -m bench`` as a user does (``stepline serve``, the bench app under uvicorn,
the load generator over the REST API) against the test's own database. No timing is asserted.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = {
    "steps",
    "steps-1",
    "keyed",
    "fanout",
    "sleep",
    "callback",
    "long-10",
    "long-20",
    "long-sleep-10",
    "long-sleep-20",
    "long-sleep-10-can5",
    "long-sleep-20-can5",
    "big",
    "idle",
}


@pytest.mark.slow
def test_every_workload_runs_at_a_tiny_size(database_url: str, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    argv = [
        sys.executable,
        "-m",
        "bench",
        "--quick",
        "--runs=5",
        "--steps=3",
        "--latency-repeats=2",
        "--keyed-runs=8",
        "--keyed-keys=2",
        "--fanout=5",
        "--sleep-ms=200",
        "--long=10,20",
        "--long-every=5",
        "--big-steps=3",
        "--big-kb=300",
        "--idle-runs=20",
        "--idle-window=2",
        "--timeout=60",
        "--log-level=warning",
        f"--database-url={database_url}",
        f"--json={out}",
    ]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=110, check=False)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    for name in EXPECTED:
        assert f"\n{name} " in done.stdout, done.stdout

    rows = {row["workload"]: row for row in json.loads(out.read_text())["workloads"]}
    assert set(rows) == EXPECTED
    for name, row in rows.items():
        assert row["runs_attempted"] > 0, name
        assert row["runs_completed"] == row["runs_attempted"], row
        assert set(row["processes"]) >= {"orchestrator", "app", "loadgen"}, row
    assert rows["steps"]["runs_completed"] == 5
    assert rows["steps"]["steps"] == 5 * 3
    assert rows["fanout"]["steps"] == 5
    assert rows["sleep"]["extra"]["lateness_ms"]["p50"] is not None
    assert rows["callback"]["extra"]["completion_to_ended_ms"]["p50"] is not None
    assert rows["long-20"]["extra"]["bytes_to_app"] > rows["long-10"]["extra"]["bytes_to_app"]
    assert rows["long-sleep-20"]["extra"]["invocations"] >= 20
    assert rows["big"]["extra"]["largest_invoke_body"] < 300_000  # the results went by reference
    assert rows["idle"]["extra"]["sleeping_runs"] == 20
    assert "orchestrator" in rows["idle"]["extra"]["cpu_s_per_min"]


@pytest.mark.slow
def test_the_scale_workload_runs_before_and_after_filling_the_database(
    database_url: str, tmp_path: Path
) -> None:
    """`--workloads scale` at a tiny size: the core workloads on the database as it was and
    after the fill, and while the sweeper deletes runs past retention; every run completed,
    every expired run deleted, and the claim reads runs through an index."""
    out = tmp_path / "scale.json"
    argv = [sys.executable, "-m", "bench", "--workloads=scale", "--runs=5", "--steps=3",
            "--sleep-ms=200", "--scale-ended=3000", "--scale-sleeping=300", "--timeout=60",
            "--log-level=warning", f"--database-url={database_url}", f"--json={out}"]  # fmt: skip
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=110, check=False)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    rows = {row["workload"]: row for row in json.loads(out.read_text())["workloads"]}
    core = ["steps", "steps-1", "sleep", "callback"]
    dbs = ("empty", "3k+300", "sweep")
    assert set(rows) == {f"{w}@{db}" for w in core for db in dbs} | {"fill", "sweep"}
    for name, row in rows.items():
        assert row["runs_completed"] == row["runs_attempted"] > 0, name
    fill = rows["fill"]["extra"]
    assert fill["ended"] == 3000 and fill["sleeping"] == 300
    # plans: the run loop's statements whose generic plan reads a large table whole
    assert isinstance(fill["plans"], dict)
    assert "claim_due" not in fill["plans"], fill["plans"]
    assert set(fill["after_vs_empty"]) == set(core)
    sweep = rows["sweep"]
    # every run added past retention was deleted, while the workloads ran or just after
    assert sweep["runs_attempted"] == sweep["runs_completed"] == 3000
    assert 0 <= sweep["extra"]["during_workloads"] <= 3000
    assert set(sweep["extra"]["sweep_vs_empty"]) == set(core)


@pytest.mark.slow
def test_the_bulk_workload_runs_at_a_tiny_size(database_url: str, tmp_path: Path) -> None:
    """`--workloads bulk` at a tiny size: the failed runs are retried in bulk, every one, and
    the lone runs measured before and during it all complete."""
    out = tmp_path / "bench.json"
    argv = [sys.executable, "-m", "bench", "--workloads=bulk", "--bulk-runs=6", "--steps=2",
            "--latency-repeats=2", "--timeout=60", "--log-level=warning",
            f"--database-url={database_url}", f"--json={out}"]  # fmt: skip
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=110, check=False)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    rows = {row["workload"]: row for row in json.loads(out.read_text())["workloads"]}
    assert set(rows) == {"bulk-before", "bulk-during", "bulk-retry"}
    retry = rows["bulk-retry"]
    assert retry["extra"]["failed_runs"] == 6
    assert retry["extra"]["operation"] == {
        "status": "completed", "matched": 6, "succeeded": 6, "skipped": 0, "failed": 0
    }  # fmt: skip
    assert rows["bulk-before"]["runs_completed"] == 2
    assert rows["bulk-during"]["runs_completed"] >= 1
