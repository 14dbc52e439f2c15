"""``python -m tests.chaos [flags]``: one chaos run; prints the table, exits 1 on a failure."""

from __future__ import annotations

import asyncio
import sys

from tests.chaos import scenario
from tests.chaos.config import parse


def main(argv: list[str] | None = None) -> int:
    config = parse(argv)
    report = asyncio.run(scenario.run(config))
    print(report.table(), flush=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
