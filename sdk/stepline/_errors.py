"""The SDK's exceptions: what a workflow may raise or catch, and what the handler rejects.

The tree::

    SteplineError (Exception)
    ├── TerminalError           raise it in a step or workflow: never retried
    ├── RetryableError          raise it in a step to choose the retry delay (retry_after)
    ├── Cancelled               raised into the workflow after a cancel request
    ├── CallbackTimeout         Callback.wait() after the callback's timeout
    ├── ChildWorkflowFailed     ctx.invoke() when the child run failed
    ├── StepFailed              a step failed for good (terminal error or attempts spent)
    ├── NondeterminismError     the code no longer matches the recorded history
    ├── DuplicateStepError      two steps of one run share a name (also a ValueError)
    ├── StateError              ctx.set_state refused: bad key, value too large, no support
    └── SignatureError          a request's Stepline-Signature did not verify

    _Suspended (BaseException)  internal: ends an execution; never catch it
    _ContinueAsNew (BaseException)  internal: ctx.continue_as_new ends the generation

Every exception carries its data as attributes, so code that catches one can act on it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import traceback
from types import TracebackType
from typing import Any

from stepline import protocol

# Frames of these folders are the machinery around a user's code (the SDK's engine, asyncio's
# task steps, the thread of a sync step): a recorded traceback leaves them out, so that it
# begins at the user's frames.
_HIDDEN_FOLDERS = (
    os.path.dirname(os.path.abspath(__file__)) + os.sep,
    os.path.dirname(os.path.abspath(asyncio.__file__)) + os.sep,
    os.path.dirname(os.path.abspath(concurrent.futures.__file__)) + os.sep,  # a sync step's thread
)


class SteplineError(Exception):
    """Base of every Stepline exception."""

    def __init__(self, message: str | None = None) -> None:
        self.message = message if message is not None else (type(self).__doc__ or "").strip()
        super().__init__(self.message)


class TerminalError(SteplineError):
    """A failure that must not be retried."""

    def __init__(self, message: str = "terminal error", code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class RetryableError(SteplineError):
    """A failure to retry, optionally after ``retry_after`` (a duration) instead of backoff."""

    def __init__(self, message: str = "retryable error", retry_after: Any = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Cancelled(SteplineError):
    """The run was cancelled; cleanup steps may still run in ``except``/``finally``."""


class CallbackTimeout(SteplineError):
    """The callback was not completed before its timeout."""

    def __init__(self, step: str) -> None:
        super().__init__(f"callback {step!r} timed out before it was completed")
        self.step = step


class ChildWorkflowFailed(SteplineError):
    """A child workflow started with ``ctx.invoke`` failed."""

    def __init__(
        self, step: str, error: protocol.ErrorInfo, child_run_id: str | None = None
    ) -> None:
        super().__init__(f"child workflow of step {step!r} failed: {error.type}: {error.message}")
        self.step = step
        self.error = error
        self.child_run_id = child_run_id


class StepFailed(SteplineError):
    """A step failed for good: a terminal error, or every attempt failed."""

    def __init__(
        self,
        step: str,
        error_type: str,
        message: str,
        code: str | None = None,
        traceback: str | None = None,
    ) -> None:
        super().__init__(f"step {step!r} failed: {error_type}: {message}")
        self.step = step
        self.error_type = error_type
        self.error_message = message
        self.code = code
        self.traceback = traceback  # the step's own, when known

    @classmethod
    def from_info(cls, step: str, error: protocol.ErrorInfo | None) -> StepFailed:
        """Build from a recorded error."""
        info = error or protocol.ErrorInfo()
        return cls(step, info.type, info.message, info.code, info.traceback)

    def info(self) -> protocol.ErrorInfo:
        """The step's error as recorded."""
        return protocol.ErrorInfo(
            type=self.error_type,
            message=self.error_message,
            code=self.code,
            traceback=self.traceback,
        )


class NondeterminismError(SteplineError):
    """The workflow code does not match the run's recorded history."""

    code = "nondeterminism"

    def __init__(self, message: str, step: str, expected: str | None = None) -> None:
        super().__init__(message)
        self.step = step
        self.expected = expected


class DuplicateStepError(SteplineError, ValueError):
    """Two steps of one run have the same name."""

    code = "duplicate_step"

    def __init__(self, step: str) -> None:
        super().__init__(f"step name {step!r} is used twice in this run; step names must be unique")
        self.step = step


class StateError(SteplineError, ValueError):
    """``ctx.set_state`` refused a key or value (raised before anything is sent) or the
    orchestrator cannot record state; ``code`` says which: ``state_key_invalid``,
    ``state_too_large``, ``state_not_json``, ``state_keys_exceeded``, ``state_not_supported``."""

    def __init__(self, message: str, code: str, key: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.key = key


class SignatureError(SteplineError):
    """A request's signature is missing, malformed, forged or too old."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"invalid Stepline-Signature: {reason}")
        self.reason = reason


class _Suspended(BaseException):
    """Internal signal: this execution of the workflow is over.

    Do not catch it: Stepline raises it from a ctx call once the invocation has been answered
    (the run suspended, ended, or another invocation owns it). It derives from BaseException
    so that ``except Exception`` lets it through; re-raise it if you catch BaseException.
    """

    def __init__(self) -> None:
        super().__init__(
            "this workflow execution has ended (suspended or superseded); "
            "stepline._Suspended must not be caught"
        )


class _ContinueAsNew(BaseException):
    """Internal signal raised by :meth:`stepline.Context.continue_as_new`: this generation of
    the run is over and the next starts with a fresh history.

    Do not catch it (it derives from BaseException so that ``except Exception`` lets it
    through); re-raise it if you catch BaseException.
    """

    def __init__(self, input: Any) -> None:
        super().__init__("the run continues as new; stepline._ContinueAsNew must not be caught")
        self.input = input


MAX_TRACEBACK_BYTES = 16 * 1024
"""A recorded traceback is at most this much UTF-8 (openapi.yaml); past it, its start is cut."""

_CUT = "[traceback cut to its last 16 KiB]\n"


def format_traceback(exc: BaseException) -> str:
    """``exc``'s Python traceback as text, the user's frames only (the SDK's and asyncio's left
    out, unless nothing else is left), cut to its last 16 KiB: the end holds the raise site."""
    te = traceback.TracebackException.from_exception(exc)
    seen: set[int] = set()
    stack: list[traceback.TracebackException] = [te]
    while stack:  # every exception of the chain (causes, contexts, groups)
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        frames = [f for f in current.stack if not f.filename.startswith(_HIDDEN_FOLDERS)]
        if frames:
            current.stack = traceback.StackSummary.from_list(frames)
        stack.extend(e for e in (current.__cause__, current.__context__) if e is not None)
        stack.extend(getattr(current, "exceptions", None) or [])
    text = "".join(te.format())
    data = text.encode()
    if len(data) <= MAX_TRACEBACK_BYTES:
        return text
    keep = MAX_TRACEBACK_BYTES - len(_CUT.encode())
    return _CUT + data[-keep:].decode("utf-8", "ignore")


def users_exc_info(
    exc: BaseException,
) -> tuple[type[BaseException], BaseException, TracebackType | None]:
    """``exc`` as ``logging``'s ``exc_info`` with a traceback of the user's frames only (as
    :func:`format_traceback` records it; all of them when none is the user's), so the app's
    log shows where the user's code failed. ``exc`` itself is left as it is."""
    kept: list[TracebackType] = []
    tb = exc.__traceback__
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(_HIDDEN_FOLDERS):
            kept.append(tb)
        tb = tb.tb_next
    if not kept:
        return type(exc), exc, exc.__traceback__
    trimmed: TracebackType | None = None
    for tb in reversed(kept):
        trimmed = TracebackType(trimmed, tb.tb_frame, tb.tb_lasti, tb.tb_lineno)
    return type(exc), exc, trimmed


STEP_FAILED = "step_failed"
"""The code of a step's error when the exception raised carries none."""

WORKFLOW_FAILED = "workflow_failed"
"""The code of a run's error when the exception the workflow raised carries none."""


def error_info(exc: BaseException, default_code: str = STEP_FAILED) -> protocol.ErrorInfo:
    """How an exception is recorded: type, message (bounded), a code (always a string:
    ``default_code`` when the exception has none of its own) and the traceback."""
    if isinstance(exc, StepFailed):
        info = exc.info()
        return info if info.code else info.model_copy(update={"code": STEP_FAILED})
    code = default_code
    if isinstance(exc, TerminalError):
        code = exc.code or "terminal"
    elif isinstance(exc, NondeterminismError | DuplicateStepError | StateError):
        code = exc.code
    elif isinstance(exc, ChildWorkflowFailed):
        code = exc.error.code or "child_failed"
    elif isinstance(exc, CallbackTimeout):
        code = "callback_timeout"
    elif isinstance(exc, Cancelled):
        code = "cancelled"
    message = _storable(str(exc) or repr(exc))
    if len(message) > 4000:
        message = message[:4000] + "…"
    return protocol.ErrorInfo(
        type=type(exc).__name__,
        message=message,
        code=code,
        traceback=_storable(format_traceback(exc)),
    )


def _storable(text: str) -> str:
    """``text`` with what cannot be stored (NUL, lone surrogates) replaced by U+FFFD."""
    text = text.replace("\x00", "\ufffd")
    return text.encode("utf-8", "replace").decode("utf-8")
