"""``python -m tests.failover [--size small|default] [--async] [--runs N] [--keep]``: one
failover run; prints the invariant table, exits 1 when an invariant fails."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys

from tests.chaos import checks
from tests.chaos.config import Config
from tests.failover import scenario
from tests.failover.formation import available


async def _run(config: Config, asynchronous: bool) -> checks.Report:
    """The failover run; SIGTERM cancels it, so its cleanup still kills every child."""
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await scenario.run(config, asynchronous=asynchronous)


def main(argv: list[str] | None = None) -> int:
    env = os.environ
    p = argparse.ArgumentParser(prog="python -m tests.failover", description=__doc__)
    p.add_argument(
        "--size", choices=sorted(scenario.SIZES), default=env.get("FAILOVER_SIZE", "default")
    )
    p.add_argument(
        "--async",
        dest="asynchronous",
        action="store_true",
        default=env.get("FAILOVER_ASYNC") == "1",
    )
    p.add_argument("--runs", type=int, default=env.get("FAILOVER_RUNS"))
    p.add_argument("--keep", action="store_true", default=env.get("FAILOVER_KEEP") == "1")
    a = p.parse_args(argv)
    if not available():
        print(
            "pg_autoctl is not installed: apt-get install postgresql-15-auto-failover "
            "pg-auto-failover-cli",
            file=sys.stderr,
        )
        return 2
    changes = {"keep": a.keep} | ({"runs": int(a.runs)} if a.runs else {})
    report = asyncio.run(_run(scenario.sized(a.size, **changes), a.asynchronous))
    print(report.table(), flush=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
