"""Run logs: ``ctx.log`` and the ``logging`` records of a step's execution, kept on the run.

Lines gather in the invocation's :class:`LogBuffer` and go to the orchestrator with its next
progress call or its answer, so a line is committed with the steps around it and costs no
request of its own. A step's execution runs under :func:`capturing`: a contextvar names the
buffer and the step, and one handler on the root logger copies the records of that task (and of
the thread a sync step runs in, which inherits the contextvar) into the buffer; concurrent steps,
runs and invocations in one process never mix. While steps run, the root logger lets ``INFO``
through (``WARNING`` is Python's default), so a step's ``INFO`` records are kept whatever the
app's root level; the app's own handlers on the root logger still get only what that level let
through, and a logger's own level (``setLevel``) still applies.

Workflow code between steps runs again on every replay, so :class:`RunLog` keeps a line only
when the code writing it runs for the first time: once the branch has met a step that is not in
the recorded history (or runs again), or once every recorded step has been met. A kept line
also goes to the app's own logging (logger ``stepline.run``), which the capture leaves out.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, Protocol

from stepline import _json
from stepline.protocol import (
    MAX_LOG_MESSAGE,
    MAX_RUN_LOG_BYTES,
    MAX_RUN_LOG_LINES,
    LogLevel,
    LogLine,
)

__all__ = ["LogBuffer", "RunLog", "capturing", "level_of"]

MAX_FIELDS_BYTES = 16 * 1024
"""A line's fields are at most this much JSON; larger ones are replaced by a note saying so."""

app_logger = logging.getLogger("stepline.run")
"""Where ``ctx.log`` lines go in the app's own logging too (once, never on replay)."""

_LEVELNO = {
    LogLevel.DEBUG: logging.DEBUG,
    LogLevel.INFO: logging.INFO,
    LogLevel.WARNING: logging.WARNING,
    LogLevel.ERROR: logging.ERROR,
}

_step: contextvars.ContextVar[tuple[LogBuffer, str] | None] = contextvars.ContextVar(
    "stepline_log_step", default=None
)

# The attributes every LogRecord has: anything else on a record came from ``extra=``.
_RECORD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}


def level_of(levelno: int) -> LogLevel:
    """The run log level of a ``logging`` level number."""
    if levelno < logging.INFO:
        return LogLevel.DEBUG
    if levelno < logging.WARNING:
        return LogLevel.INFO
    if levelno < logging.ERROR:
        return LogLevel.WARNING
    return LogLevel.ERROR


def _message(text: str) -> str:
    text = text.replace("\x00", "\ufffd")
    if len(text) > MAX_LOG_MESSAGE:
        cut = "… (cut)"
        text = text[: MAX_LOG_MESSAGE - len(cut)] + cut
    return text


def _fields(fields: dict[str, Any]) -> tuple[dict[str, Any] | None, int]:
    """Fields as JSON (values JSON cannot hold as their ``repr``) and the size of that JSON."""
    if not fields:
        return None, 0
    try:
        value, size = _json.round_trip(fields)
    except (TypeError, ValueError):
        safe = {}
        for key, item in fields.items():
            try:
                safe[str(key)] = _json.round_trip(item)[0]
            except (TypeError, ValueError):
                safe[str(key)] = _message(repr(item))
        value, size = _json.round_trip(safe)
    if size > MAX_FIELDS_BYTES:
        value = {"fieldsCut": f"the fields were {size} bytes of JSON, over {MAX_FIELDS_BYTES}"}
        size = len(_json.dumps(value))
    return value, size


class LogBuffer:
    """One invocation's lines not yet sent, and those it dropped past the run's cap (an
    invocation never keeps more than a run may)."""

    def __init__(self) -> None:
        self._lines: list[LogLine] = []
        self._dropped = 0
        self._count = 0
        self._bytes = 0
        self._lock = threading.Lock()  # sync steps log from their threads

    def add(
        self, level: LogLevel, message: str, fields: dict[str, Any], step_name: str | None
    ) -> None:
        text = _message(message)
        values, size = _fields(fields)
        size += len(text.encode("utf-8", "replace"))
        with self._lock:
            full = (
                self._dropped > 0
                or self._count >= MAX_RUN_LOG_LINES
                or self._bytes + size > MAX_RUN_LOG_BYTES
            )
            if full:
                self._dropped += 1
                return
            self._count += 1
            self._bytes += size
            self._lines.append(
                LogLine.model_construct(
                    at=datetime.now(UTC), level=level, message=text, fields=values,
                    step_name=step_name,
                )
            )  # fmt: skip

    def take(self) -> tuple[list[LogLine], int]:
        """The lines written since the last take, and how many were dropped since."""
        with self._lock:
            lines, dropped = self._lines, self._dropped
            self._lines = []
            if dropped:
                self._dropped = -1  # counted once; still full
            return lines, max(dropped, 0)


class _Run(Protocol):
    """What a run log reads of its run's context (:class:`stepline.Context`)."""

    run_id: str
    workflow: str

    def replaying(self) -> bool: ...


class RunLog:
    """``ctx.log``: ``ctx.log.info("charged", amount=5)`` keeps a line on the run (also
    ``debug``, ``warning`` and ``error``); keyword arguments become its ``fields``."""

    def __init__(self, ctx: _Run, buffer: LogBuffer) -> None:
        self._ctx = ctx
        self._buffer = buffer

    def rebind(self, buffer: LogBuffer) -> None:
        """Keep lines in ``buffer`` from now on (the execution goes on as another invocation)."""
        self._buffer = buffer

    def debug(self, message: str, **fields: Any) -> None:
        """Keep a ``debug`` line."""
        self._write(LogLevel.DEBUG, message, fields)

    def info(self, message: str, **fields: Any) -> None:
        """Keep an ``info`` line."""
        self._write(LogLevel.INFO, message, fields)

    def warning(self, message: str, **fields: Any) -> None:
        """Keep a ``warning`` line."""
        self._write(LogLevel.WARNING, message, fields)

    def error(self, message: str, **fields: Any) -> None:
        """Keep an ``error`` line."""
        self._write(LogLevel.ERROR, message, fields)

    def _write(self, level: LogLevel, message: str, fields: dict[str, Any]) -> None:
        current = _step.get()
        if current is not None and current[0] is self._buffer:
            step_name: str | None = current[1]  # inside a step's execution: always new
        elif self._ctx.replaying():
            return  # this code ran before, and its lines were kept then
        else:
            step_name = None
        self._buffer.add(level, str(message), fields, step_name)
        if app_logger.isEnabledFor(_LEVELNO[level]):
            extra = {"run_id": self._ctx.run_id, "workflow": self._ctx.workflow}
            app_logger.log(
                _LEVELNO[level], "%s", message,
                extra={**extra, "step": step_name, "fields": fields},
            )  # fmt: skip


class _Capture(logging.Handler):
    """Copies records emitted under :func:`capturing` into that step's buffer."""

    def handle(self, record: logging.LogRecord) -> bool:
        if _no_other_handler(record):
            # Being on the root logger must not silence Python's last resort (records printed
            # to stderr when the app configured no logging).
            last = logging.lastResort
            if last is not None and record.levelno >= last.level and _as_before(record):
                last.handle(record)
        return super().handle(record)

    def emit(self, record: logging.LogRecord) -> None:
        current = _step.get()
        if current is None or record.name == "stepline" or record.name.startswith("stepline."):
            return  # the SDK's own records say what the step's outcome already says
        buffer, step_name = current
        try:
            fields: dict[str, Any] = {"logger": record.name}
            fields.update((k, v) for k, v in record.__dict__.items() if k not in _RECORD_ATTRS)
            if record.exc_info:
                fields["exception"] = self.formatter_exception(record)
            buffer.add(level_of(record.levelno), record.getMessage(), fields, step_name)
        except Exception:
            self.handleError(record)

    def formatter_exception(self, record: logging.LogRecord) -> str:
        assert record.exc_info is not None
        return logging.Formatter().formatException(record.exc_info)[-MAX_LOG_MESSAGE:]


def _no_other_handler(record: logging.LogRecord) -> bool:
    """Whether no handler but ours sees ``record`` (it reached the root logger)."""
    logger: logging.Logger | None = logging.getLogger(record.name)
    while logger is not None:
        if any(h is not _handler for h in logger.handlers):
            return False
        logger = logger.parent
    return True


def _as_before(record: logging.LogRecord) -> bool:
    """Whether ``record`` would have been made with the root logger at the level it had before
    steps lowered it: its logger, or an ancestor below the root, has a level it passes, or it
    passes that root level."""
    logger: logging.Logger | None = logging.getLogger(record.name)
    while logger is not None and logger.parent is not None:
        if logger.level:
            return record.levelno >= logger.level
        logger = logger.parent
    return _root_level is None or record.levelno >= _root_level


class _AsBefore(logging.Filter):
    """On the app's handlers of the root logger while steps run: only what they got before."""

    def filter(self, record: logging.LogRecord) -> bool:
        return _as_before(record)


_handler = _Capture()
_filter = _AsBefore()
_active = 0
_active_lock = threading.Lock()
_root_level: int | None = None  # the root logger's own level, while steps lowered it to INFO
_filtered: list[logging.Handler] = []


def _lower_root(root: logging.Logger) -> None:
    """Let ``INFO`` records be made while steps run, the app's root handlers filtered."""
    global _root_level
    if root.level <= logging.INFO:
        return
    _root_level = root.level
    for handler in root.handlers:
        if handler is not _handler:
            handler.addFilter(_filter)
            _filtered.append(handler)
    root.setLevel(logging.INFO)


def _restore_root(root: logging.Logger) -> None:
    global _root_level
    if _root_level is None:
        return
    if root.level == logging.INFO:  # unless the app set another level meanwhile
        root.setLevel(_root_level)
    for handler in _filtered:
        handler.removeFilter(_filter)
    _filtered.clear()
    _root_level = None


@contextlib.contextmanager
def capturing(buffer: LogBuffer, step_name: str) -> Iterator[None]:
    """While a step executes: its task's ``logging`` records go to ``buffer``. The handler is
    on the root logger while any step executes in the process."""
    global _active
    with _active_lock:
        _active += 1
        root = logging.getLogger()
        if _handler not in root.handlers:
            root.addHandler(_handler)
            _lower_root(root)
    token = _step.set((buffer, step_name))
    try:
        yield
    finally:
        _step.reset(token)
        with _active_lock:
            _active -= 1
            if _active == 0:
                root = logging.getLogger()
                root.removeHandler(_handler)
                _restore_root(root)
