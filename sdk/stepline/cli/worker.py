"""``stepline worker MODULE:ATTR --app NAME``: run a pull app's worker from the command line."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import logging
import os
import signal
import sys

from stepline._worker import Worker, WorkerError
from stepline._workflow import Stepline

HELP = (
    "Run a pull app's workflows: sync the app, then poll the orchestrator for its invocations"
    " (no inbound port)."
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="stepline worker", description=HELP)
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The worker's arguments, on ``p``."""
    p.add_argument("target", metavar="MODULE:ATTR", help="the Stepline object, e.g. app:sl")
    p.add_argument("--app", required=True, help="the pull app's name, id or slug")
    p.add_argument(
        "--url",
        default=os.environ.get("STEPLINE_URL", "http://127.0.0.1:8400"),
        help="the orchestrator (STEPLINE_URL; default http://127.0.0.1:8400)",
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("STEPLINE_API_KEY"),
        help="a write key of the app's environment (STEPLINE_API_KEY)",
    )
    p.add_argument(
        "--concurrency", type=int, default=10, help="invocations run at once (default 10)"
    )
    p.add_argument("--wait", type=float, default=30.0, help="seconds each poll waits (30)")
    p.add_argument(
        "--drain",
        type=float,
        default=30.0,
        help="on SIGINT or SIGTERM, seconds the invocations running may take to finish (30)",
    )
    p.add_argument(
        "--take-over",
        action="store_true",
        help="move to this app the workflows it hosts that another app registered (its sync"
        " is refused otherwise)",
    )
    p.add_argument(
        "--deployment",
        metavar="ID",
        help="the app's deployment this worker runs (its deploymentId, registered with"
        " stepline apps deployments create): it gets only the runs on it (default: the app's"
        " current deployment)",
    )


def load(target: str) -> Stepline:
    """The Stepline object ``MODULE:ATTR`` names (the current folder is on the import path)."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise SystemExit(f"stepline worker: {target!r} is not MODULE:ATTR")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    obj = getattr(importlib.import_module(module_name), attr, None)
    if not isinstance(obj, Stepline):
        raise SystemExit(f"stepline worker: {target} is not a stepline.Stepline")
    return obj


async def _serve(worker: Worker) -> None:
    task = asyncio.create_task(worker.run())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, worker.stop)  # what runs answers first
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        await worker.aclose()
        await worker.stepline.aclose()


def main(argv: list[str]) -> int:
    return run(_parser().parse_args(argv))


def configure_logging() -> None:
    """The worker's own lines at INFO on stderr; httpx's request lines only when they warn (one
    line per poll would drown what matters)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def run(a: argparse.Namespace) -> int:
    """Run the worker the parsed arguments ``a`` describe until SIGINT or SIGTERM."""
    if not a.api_key:
        print("stepline worker: give an API key (--api-key or STEPLINE_API_KEY)", file=sys.stderr)
        return 2
    if a.concurrency < 1:
        print("stepline worker: --concurrency must be at least 1", file=sys.stderr)
        return 2
    configure_logging()
    sl = load(a.target)
    worker = Worker(
        sl,
        a.url,
        a.api_key,
        a.app,
        concurrency=a.concurrency,
        wait=a.wait,
        drain=a.drain,
        take_over=a.take_over,
        deployment=a.deployment,
    )
    print(f"stepline worker: app {a.app}, polling {a.url}", file=sys.stderr, flush=True)
    try:
        asyncio.run(_serve(worker))
    except WorkerError as exc:
        print(f"stepline worker: {exc}", file=sys.stderr)
        return 1
    return 0
