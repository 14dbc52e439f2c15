"""The orchestrator's part of the ``stepline`` command: ``serve``, ``dev``, ``migrate`` and
``projects``/``environments``/``keys`` on the local database. The command itself (its parser,
the REST-only commands) is the SDK's :mod:`stepline.cli.main`, so that it works without the
server extra."""

from __future__ import annotations

import argparse
import sys

from stepline.cli import main as sdk_cli
from stepline_server import logs, multiproc
from stepline_server.cli import tenancy
from stepline_server.cli.runtime import database, run_async
from stepline_server.settings import Settings, from_env
from stepline_server.store import db, keys
from stepline_server.store.migrate import apply_migrations


async def _serve(settings: Settings) -> None:
    from stepline_server.asgi import build_app
    from stepline_server.cli import servers, workers
    from stepline_server.orchestrator import Orchestrator

    async with database(settings) as (dsn, where):
        app = build_app(Orchestrator(settings, dsn))
        if not workers.is_child():
            print(
                f"Stepline orchestrator on {settings.base_url} ({where})\n"
                f"  dashboard: {settings.base_url}/ui/\n"
                "  API keys: `stepline keys create` makes one (run it beside this server,"
                " with the same DATABASE_URL or data folder)",
                file=sys.stderr,
                flush=True,
            )
        api = servers.server(app, settings.host, settings.port, log_level=settings.log_level)
        servers.stop_on_signals(api)
        servers.tune_gc()
        # A child worker serves the socket it inherited; the first of several binds one and
        # starts the others (each applies the migrations too: the runner takes a lock).
        sock, children = workers.inherited(), None
        if sock is None and settings.workers > 1:
            sock = workers.bind(settings.host, settings.port)
            children = workers.Children(settings.workers - 1, sock, dsn)
            children.start()
        try:
            await api.serve(sockets=[sock] if sock is not None else None)
        finally:
            if children is not None:
                await children.stop()


async def _migrate(settings: Settings) -> None:
    async with database(settings) as (dsn, _):
        conn = await db.connect(dsn)
        try:
            applied = await apply_migrations(conn)
            await keys.bootstrap(conn)
        finally:
            await conn.close()
    print("applied: " + (", ".join(applied) if applied else "nothing (up to date)"))


def add_server_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``serve``, ``dev`` and ``migrate``."""
    serve = sub.add_parser("serve", help=sdk_cli.SERVER_COMMANDS["serve"])
    serve.add_argument("--host", help="address to listen on [STEPLINE_HOST, 127.0.0.1]")
    serve.add_argument("--port", type=int, help="port to listen on [STEPLINE_PORT, 8400]")
    serve.add_argument(
        "--workers", type=int, help="orchestrator processes on this port [STEPLINE_WORKERS, 1]"
    )
    dev = sub.add_parser(
        "dev",
        help="embedded PostgreSQL + orchestrator + your app (MODULE:ATTR or a loopback URL),"
        " re-synced on every code change; without one, the example app and a demo run",
    )
    dev.add_argument(
        "app",
        nargs="?",
        metavar="MODULE:ATTR|URL",
        help="your app's Stepline (served here) or the loopback URL of its handler",
    )
    dev.add_argument("--port", type=int, help="orchestrator port [STEPLINE_PORT, 8400]")
    dev.add_argument("--app-port", type=int, default=8401, help="port the app is served on [8401]")
    dev.add_argument("--name", help="the app's name [the module's, or dev for a URL]")
    dev.add_argument("--watch", action="append", default=[], help="folder to watch (repeatable)")
    dev.add_argument("--check", metavar="MODULE:ATTR", help="code replay-check runs against")
    dev.add_argument("--once", action="store_true", help="exit after the demo run or first sync")
    sub.add_parser("migrate", help=sdk_cli.SERVER_COMMANDS["migrate"])


def parser() -> argparse.ArgumentParser:
    """The whole ``stepline`` command's parser, this module's commands included."""
    return sdk_cli.parser(sys.modules[__name__])


def main(argv: list[str] | None = None) -> int:
    """Run a ``stepline`` command (see :func:`stepline.cli.main.main`)."""
    return sdk_cli.main(argv)


def run(args: argparse.Namespace) -> int:
    """Carry out ``serve``, ``dev``, ``migrate``, or a local ``projects``, ``environments`` or
    ``keys`` command."""
    try:
        settings = from_env()
    except ValueError as exc:  # a setting that does not parse, e.g. STEPLINE_APP_NETWORKS
        print(f"stepline: {exc}", file=sys.stderr)
        return 1
    if getattr(args, "host", None):
        settings = settings.with_(host=args.host)
    if getattr(args, "port", None):
        settings = settings.with_(port=args.port)
    if getattr(args, "workers", None):
        settings = settings.with_(workers=max(1, args.workers))
    if args.command in ("projects", "environments", "keys"):
        # They print what they made and nothing else (the embedded database logs warnings).
        logs.configure("warning", settings.log_format, data_dir=settings.data_dir)
    else:
        logs.configure(settings.log_level, settings.log_format, data_dir=settings.data_dir)
    if args.command in ("serve", "dev"):
        from stepline_server.cli import servers, workers

        if not workers.is_child() and servers.port_in_use(settings.host, settings.port):
            print(servers.busy_port_message(settings.host, settings.port), file=sys.stderr)
            return 1
        by_url = args.command == "dev" and (args.app or "").startswith(("http://", "https://"))
        if args.command == "dev" and not by_url and servers.port_in_use("127.0.0.1", args.app_port):
            print(
                f"stepline: 127.0.0.1:{args.app_port} (the app's port) is already in use;"
                " choose another with --app-port",
                file=sys.stderr,
            )
            return 1
    try:
        if args.command == "serve":
            with multiproc.folder(settings.workers):  # before prometheus-client is imported
                run_async(_serve(settings))
        elif args.command == "migrate":
            run_async(_migrate(settings))
        elif args.command in ("projects", "environments", "keys"):
            try:
                run_async(tenancy.run(settings, args))
            except tenancy.UsageError as exc:
                print(f"stepline: {exc}", file=sys.stderr)
                return 1
        elif args.command == "dev":
            from stepline_server.cli import dev

            if args.app:
                return dev.run_loop(settings, args)
            return dev.run(settings, app_port=args.app_port, once=args.once)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
