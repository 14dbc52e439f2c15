"""Replaying a recorded run against local code without running any step, and what it shows.

:func:`replay` drives the same engine as an invocation (``stepline._engine``), with the same
nondeterminism checks, but nothing leaves the process and no step runs: every recorded step
answers its recorded result (sleeps, callbacks, events and children too), and the first
operation the history does not have stops the replay as what the run would do next.
:func:`judge` turns what the replay met into a verdict for ``stepline replay-check``: ``ok``,
``differs`` (the next invocation would fail the run) or ``warn`` (recorded steps no longer
reached: safe, their results are not read).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from stepline import protocol
from stepline._context import Context, _Op
from stepline._definitions import WorkflowDef
from stepline._engine import Invocation
from stepline._errors import DuplicateStepError, NondeterminismError, SteplineError
from stepline._payloads import Payloads
from stepline.protocol import InvokeStatus, StepKind, StepRecord, StepStatus

REPLAY_TIMEOUT = 30.0
"""Seconds a replay may take: longer, the workflow awaits something other than ctx."""

_WAITS = (StepStatus.SLEEPING, StepStatus.WAITING, StepStatus.RETRYING)


class End(StrEnum):
    """Where a replay stopped."""

    NEXT = "next"  # the code makes an operation the history does not have: it would run next
    WAITING = "waiting"  # every branch waits on a recorded sleep, callback, event, child or retry
    RETURNED = "returned"  # the workflow returned
    RAISED = "raised"  # the workflow raised
    CANCELLED = "cancelled"  # the workflow ended after the run's cancel request
    NONDETERMINISM = "nondeterminism"  # the code does not match the history (SDK's own checks)
    INVALID_INPUT = "invalid_input"  # the run's input does not validate against the code's model
    TIMEOUT = "timeout"  # the replay did not end in REPLAY_TIMEOUT


@dataclass(frozen=True)
class Replay:
    """What a replay met: how it ended, the recorded steps reached and skipped, what is next."""

    end: End
    history: list[StepRecord]
    reached: list[str] = field(default_factory=list)  # recorded steps met, in the order met
    passed: list[str] = field(default_factory=list)  # recorded before a reached one, not met
    ahead: list[str] = field(default_factory=list)  # recorded after every reached one, not met
    next: list[tuple[str, StepKind]] = field(default_factory=list)  # new operations, in order
    # Each patch the code asked about (ctx.patched), by id: True when the run takes its code
    # (its marker is recorded, or would be now), False when it is a run from before it.
    patches: dict[str, bool] = field(default_factory=dict)
    error: protocol.ErrorInfo | None = None  # what the run would fail with, or the code raised
    difference: Difference | None = None


@dataclass(frozen=True)
class Difference:
    """The first difference: the step, what the history has, what the code does now."""

    step: str | None
    history: str
    code: str
    message: str  # the error the next invocation would fail the run with


@dataclass(frozen=True)
class Verdict:
    """``ok``, ``differs`` or ``warn`` for one run, with a line for people."""

    result: Literal["ok", "differs", "warn"]
    summary: str
    difference: Difference | None = None
    unreached: list[str] = field(default_factory=list)


class _Stop(Exception):
    """The replay met an operation the history does not have: it ends there."""


class _NoProgress:
    """A replay never reports progress; this sender says so if anything tries."""

    async def progress(
        self,
        request: protocol.InvokeRequest,
        updates: list[protocol.StepUpdate],
        seq: int = 0,
        *,
        logs: list[protocol.LogLine] | None = None,
        logs_dropped: int = 0,
    ) -> protocol.ProgressResponse:
        raise RuntimeError("a replay check reports nothing to the orchestrator")

    async def result(self, request: protocol.InvokeRequest, record: protocol.StepRecord) -> Any:
        """The history a replay check fetched carries every result inline."""
        return record.output

    async def history(self, request: protocol.InvokeRequest) -> list[protocol.StepRecord]:
        """The history a replay check fetched is whole."""
        return list(request.steps)


class _ReplayContext(Context):
    """The invocation's Context, noting the kind of each operation the code makes."""

    def __init__(
        self,
        request: protocol.InvokeRequest,
        definition: WorkflowDef,
        payloads: Payloads | None = None,
    ) -> None:
        super().__init__(request, definition, payloads=payloads)
        self.met: dict[str, StepKind] = {}  # every operation the code made, by name, in order

    def replaying(self) -> bool:
        """Always: ``ctx.log`` is silent in a replay check (no line kept, none in the app's
        log), whatever code runs past the recorded steps."""
        return True

    def _enter(self, name: str, kind: StepKind) -> StepRecord | None:
        if not self.closed and isinstance(name, str):
            self.met.setdefault(name, kind)
        return super()._enter(name, kind)


class _ReplayInvocation(Invocation):
    """An invocation whose new operations are never sent nor run: the first ones stop it."""

    def __init__(
        self,
        definition: WorkflowDef,
        request: protocol.InvokeRequest,
        payloads: Payloads | None = None,
    ) -> None:
        super().__init__(definition, request, _NoProgress(), payloads=payloads)
        self.ctx: _ReplayContext = _ReplayContext(request, definition, payloads)
        self.stopped_at: list[_Op] = []

    async def _dispatch(self, fresh: list[_Op]) -> None:
        if all(op.update.patch is not None for op in fresh):
            self.buffer.extend(op.update for op in fresh)  # answers, not operations: go on
            return
        self.stopped_at = fresh
        raise _Stop()

    def _log_failed(self, exc: BaseException) -> None:
        """Silent: a replay check reports what it found, it does not log the run's failure."""


def request_of(history: dict[str, Any]) -> protocol.InvokeRequest:
    """An invocation of the run that ``GET /v1/runs/{id}/replay`` answered (no token)."""
    return protocol.InvokeRequest.model_validate(
        {
            "runId": history["runId"],
            "workflow": history["workflow"],
            "input": history.get("input"),
            "invocationId": "replay-check",
            "token": "",
            "apiUrl": "replay-check://",
            "cancelRequested": bool(history.get("cancelRequested")),
            "steps": history.get("steps") or [],
        }
    )


async def replay(
    definition: WorkflowDef,
    request: protocol.InvokeRequest,
    timeout: float = REPLAY_TIMEOUT,
    payloads: Payloads | None = None,
) -> Replay:
    """Replay the run ``request`` carries against ``definition`` without running any step;
    ``payloads``: the app's codec and store, which decode what it recorded encoded."""
    invocation = _ReplayInvocation(definition, request, payloads)
    # Patch markers are not steps the code meets: they answer ctx.patched.
    history = [
        r for r in sorted(request.steps, key=lambda s: s.position) if protocol.patch_of(r) is None
    ]
    try:
        answer = await asyncio.wait_for(invocation.run(), timeout)
    except _Stop:
        answer = None
    except TimeoutError:
        return _outcome(End.TIMEOUT, invocation, history)
    task = invocation.task
    if task is not None and not task.done():
        with contextlib.suppress(BaseException):
            await asyncio.wait({task}, timeout=1.0)  # let its finally blocks end here
    if answer is None:
        return _outcome(End.NEXT, invocation, history, next_ops=invocation.stopped_at)
    fatal = invocation.ctx.fatal
    if fatal is not None:
        diff = difference(fatal, history, invocation.ctx.met)
        return _outcome(End.NONDETERMINISM, invocation, history, error=answer.error, diff=diff)
    if answer.status is InvokeStatus.FAILED and task is None:
        return _outcome(End.INVALID_INPUT, invocation, history, error=answer.error)
    end = {
        InvokeStatus.SUSPENDED: End.WAITING,
        InvokeStatus.COMPLETED: End.RETURNED,
        InvokeStatus.CANCELLED: End.CANCELLED,
    }.get(answer.status, End.RAISED)
    # new values the workflow made (a patch marker is an answer, not an operation)
    values = [(u.name, u.kind) for u in answer.updates if u.patch is None]
    return _outcome(end, invocation, history, error=answer.error, values=values)


def _outcome(
    end: End,
    invocation: _ReplayInvocation,
    history: list[StepRecord],
    *,
    next_ops: list[_Op] | None = None,
    error: protocol.ErrorInfo | None = None,
    diff: Difference | None = None,
    values: list[tuple[str, StepKind]] | None = None,
) -> Replay:
    ctx = invocation.ctx
    recorded = {r.name for r in history}
    nxt = [(op.name, op.update.kind) for op in next_ops or [] if op.update.patch is None]
    nxt += values or []
    return Replay(
        end=end,
        history=history,
        reached=[name for name in ctx.met if name in recorded],
        passed=[r.name for r in ctx.passed()],
        ahead=[r.name for r in ctx.unreached()],
        next=nxt,
        error=error,
        difference=diff,
        patches=ctx.patch_answers(),
    )


def _step(kind: StepKind | str, name: str) -> str:
    return f"a {StepKind(kind).value} step {name!r}"


def difference(
    exc: SteplineError, history: list[StepRecord], met: dict[str, StepKind]
) -> Difference:
    """The difference the SDK's nondeterminism check ``exc`` found, as history against code."""
    records = {r.name: r for r in history}
    message = str(exc)
    if isinstance(exc, DuplicateStepError):
        return Difference(exc.step, f"one step {exc.step!r}", f"makes {exc.step!r} twice", message)
    if not isinstance(exc, NondeterminismError):
        return Difference(None, "steps the code does not match", f"raises {message}", message)
    step, expected = exc.step, exc.expected
    if step not in records and expected in records:
        # A new operation where the history goes on with a step the code did not reach.
        want = records[expected]
        kind = f"{met[step].value} " if step in met else ""
        now = f"makes a new {kind}step {step!r} there"
        return Difference(expected, f"{_step(want.kind, want.name)} next", now, message)
    record = records.get(step)
    if record is not None and expected is None:  # ctx.now met a value another call recorded
        return Difference(step, f"{_step(record.kind, step)} not made by ctx.now",
                          f"calls ctx.now({step!r})", message)  # fmt: skip
    if record is not None and expected == step:
        code = _step(met[step], step) if step in met else f"another kind of step {step!r}"
        return Difference(step, _step(record.kind, step), f"makes {code}", message)
    if record is not None and expected in records:
        return Difference(step, f"{step!r} recorded before {expected!r}",
                          f"meets {expected!r} before {step!r}", message)  # fmt: skip
    return Difference(step, "steps the code does not match", f"raises {message}", message)


def _names(names: list[str]) -> str:
    return ", ".join(repr(n) for n in names)


def _patches(r: Replay) -> str:
    """Which code of each patch the run takes, for people ("" when the code has none)."""
    return "".join(
        f"; patch {p!r}: {'new code' if taken else 'old code (a run from before it)'}"
        for p, taken in r.patches.items()
    )


def _where(r: Replay) -> str:
    """Where the replay stopped, for people."""
    if r.end is End.NEXT:
        first = r.next[0]
        more = f" (and {len(r.next) - 1} more)" if len(r.next) > 1 else ""
        return f"would run {_step(first[1], first[0])} next{more}"
    if r.end is End.WAITING:
        records = {x.name: x for x in r.history}
        waits = [n for n in r.reached if records[n].status in _WAITS]
        return f"waits on {_names(waits)}" if waits else "waits"
    if r.end is End.RETURNED:
        return "returns"
    if r.end is End.CANCELLED:
        return "ends cancelled"
    if r.end is End.RAISED and r.error is not None:
        return f"raises {r.error.type}: {_short(r.error.message)}"
    return r.end.value


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def judge(r: Replay, run_status: str, input: Any = None) -> Verdict:
    """The verdict of a replay of a run whose status is ``run_status``."""
    count = f"replayed {len(r.reached)} of {len(r.history)} recorded steps"
    if r.end is End.NONDETERMINISM and r.difference is not None:
        d = r.difference
        where = f"step {d.step!r}: " if d.step else ""
        return Verdict("differs", f"{where}the history has {d.history}; the code now {d.code}", d)
    if r.end is End.INVALID_INPUT:
        message = r.error.message if r.error else "the input is not valid"
        d = Difference(None, f"the input {_short(json.dumps(input), 80)}",
                       f"refuses it: {_short(message)}", message)  # fmt: skip
        return Verdict("differs", f"the code refuses the run's input: {_short(message)}", d)
    if r.end is End.RAISED and r.ahead and r.error is not None:
        records = {x.name: x for x in r.history}
        want = records[r.ahead[0]]
        raised = f"raises {r.error.type}: {_short(r.error.message)}"
        d = Difference(want.name, f"{_step(want.kind, want.name)} next", raised, r.error.message)
        return Verdict("differs", f"step {want.name!r}: the history has it next; the code now "
                       f"{raised} before reaching it", d)  # fmt: skip
    if r.end is End.TIMEOUT:
        return Verdict("warn", f"{count}; the replay did not end within {REPLAY_TIMEOUT:g}s "
                       "(the workflow awaits something other than ctx)")  # fmt: skip
    unreached = r.passed + r.ahead
    summary = f"{count}; {_where(r)}{_patches(r)}"
    if r.end is End.WAITING and r.ahead:
        # Only parallel branches get here: a branch's recorded steps are missing while another
        # waits. Safe only if the code makes no new step before the run ends.
        return Verdict(
            "warn",
            f"recorded steps not reached before the run waits: {_names(r.ahead)} (a new step "
            f"made before them would fail the run as nondeterministic); {summary}",
            unreached=unreached,
        )
    if unreached:
        return Verdict(
            "warn",
            f"recorded steps no longer reached: {_names(unreached)} (safe: their results are "
            f"not read); {summary}",
            unreached=unreached,
        )
    if r.end is End.RAISED and run_status != "failed":
        return Verdict("warn", f"{summary}, after its recorded steps: the next invocation "
                       "would fail the attempt")  # fmt: skip
    return Verdict("ok", summary)
