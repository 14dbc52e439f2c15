"""``python -m tests.chaos [flags]``: one chaos run; prints the table, exits 1 on a failure."""

from __future__ import annotations

import asyncio
import signal
import sys

from tests.chaos import checks, scenario
from tests.chaos.config import Config, parse


async def _run(config: Config) -> checks.Report:
    """The chaos run; SIGTERM cancels it, so its cleanup still kills every child."""
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await scenario.run(config)


def main(argv: list[str] | None = None) -> int:
    config = parse(argv)
    report = asyncio.run(_run(config))
    print(report.table(), flush=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
