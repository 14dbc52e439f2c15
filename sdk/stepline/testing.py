"""Run a workflow in-process against an in-memory history, to unit-test it without a server.

``result = await stepline.testing.run(sl, "onboard", {"userId": "u1"},
callbacks={"approval": {"ok": True}}, events={"kyc": {"level": 2}})`` invokes the same replay
engine the ASGI handler uses, again and again, with a small in-memory orchestrator: sleeps and
retry delays are over at once, callbacks and events are answered from the given dicts (keyed by
step name, or for events by event name) or time out when absent, and child workflows of the same
:class:`~stepline.Stepline` run in-process. Each invocation replays the history recorded so far,
exactly as in production, so nondeterminism shows up here too. ``result.logs`` holds the run's
log lines as the orchestrator would keep them (``ctx.log`` and the ``logging`` records of step
executions, each once). ``ctx.continue_as_new`` starts the next generation with an empty
history, as the orchestrator does.

Patches (``ctx.patched``): a run here is a new run, which takes every patch's code and records
its marker (``result.patches``); ``unpatched=["fix-tax"]`` runs it as a run from before that
patch, which takes the old code (``ctx.patched("fix-tax")`` is ``False`` throughout).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from stepline import _json, protocol
from stepline._engine import Invocation
from stepline._workflow import Stepline
from stepline.protocol import Action, StepKind, StepRecord, StepStatus, StepUpdate

__all__ = ["RunResult", "run"]

_WAITS = (StepStatus.SLEEPING, StepStatus.WAITING)


@dataclass
class RunResult:
    """How a test run ended: ``status`` (``completed``, ``failed`` or ``cancelled``) and more."""

    __test__ = False

    run_id: str
    status: str
    output: Any = None
    error: protocol.ErrorInfo | None = None
    steps: dict[str, StepRecord] = field(default_factory=dict)
    step_calls: Counter[str] = field(default_factory=Counter)
    """How many times each ``run`` step's function was called (attempts started)."""
    invocations: int = 0
    logs: list[protocol.LogLine] = field(default_factory=list)
    """The run's log lines, in order (the cap of a run applies as on the orchestrator)."""
    logs_dropped: int = 0
    state: dict[str, Any] = field(default_factory=dict)
    """The state the run published (``ctx.set_state``): each key's last value."""

    @property
    def patches(self) -> list[str]:
        """The patches whose markers the run recorded (``ctx.patched`` answered ``True``)."""
        return [p for r in self.steps.values() if (p := protocol.patch_of(r)) is not None]


class _MemoryRun:
    """One run's history and the orchestrator's side of the protocol, in memory."""

    def __init__(
        self,
        sl: Stepline,
        workflow: str,
        input: Any,
        run_id: str,
        callbacks: Mapping[str, Any],
        events: Mapping[str, Any],
        cancel_after: str | None,
        unpatched: frozenset[str] = frozenset(),
    ) -> None:
        self.sl, self.workflow, self.input, self.run_id = sl, workflow, input, run_id
        self.unpatched = unpatched
        self.callbacks, self.events, self.cancel_after = callbacks, events, cancel_after
        self.steps: dict[str, StepRecord] = {}
        self.waits: dict[str, StepUpdate] = {}
        self.calls: Counter[str] = Counter()
        self.cancel_requested = False
        self.logs: list[protocol.LogLine] = []
        self.logs_dropped = 0
        self.log_bytes = 0
        self.state: dict[str, Any] = {}

    async def progress(
        self,
        request: protocol.InvokeRequest,
        updates: list[StepUpdate],
        seq: int = 0,
        *,
        logs: list[protocol.LogLine] | None = None,
        logs_dropped: int = 0,
    ) -> protocol.ProgressResponse:
        """Commit updates as the orchestrator would; create the callbacks asked for."""
        self.keep_logs(logs or [], logs_dropped)
        created = self.apply(updates)
        return protocol.ProgressResponse(cancelRequested=self.cancel_requested, callbacks=created)

    async def result(self, request: protocol.InvokeRequest, record: StepRecord) -> Any:
        """Results are kept inline in memory: never asked for."""
        return record.output

    async def history(self, request: protocol.InvokeRequest) -> list[StepRecord]:
        """Every invocation here carries the whole history: never asked for."""
        return list(request.steps)

    def keep_logs(self, lines: list[protocol.LogLine], dropped: int) -> None:
        """Keep log lines as the orchestrator does: up to the run's cap, then none newer (the
        SDK's ``dropped`` lines are newer than ``lines``)."""
        for line in lines:
            size = len(line.message.encode()) + (
                len(_json.dumps(line.fields)) if line.fields is not None else 0
            )
            if (
                self.logs_dropped
                or len(self.logs) >= protocol.MAX_RUN_LOG_LINES
                or self.log_bytes + size > protocol.MAX_RUN_LOG_BYTES
            ):
                self.logs_dropped += 1
                continue
            self.logs.append(line)
            self.log_bytes += size
        self.logs_dropped += dropped

    def apply(self, updates: list[StepUpdate]) -> dict[str, protocol.CallbackInfo]:
        created: dict[str, protocol.CallbackInfo] = {}
        for u in updates:
            record = self.steps.get(u.name)
            if record is None:
                record = StepRecord(
                    name=u.name, kind=u.kind, status=StepStatus.RUNNING, position=len(self.steps)
                )
                self.steps[u.name] = record
            record.attempt = u.attempt
            if u.action is Action.START:
                record.status = StepStatus.RUNNING
                self.calls[u.name] += 1
            elif u.action is Action.COMPLETE:
                record.status, record.output = StepStatus.COMPLETED, u.output
                if u.kind is StepKind.STATE and u.key is not None:
                    self.state[u.key] = u.output
            elif u.action is Action.FAIL:
                record.status, record.error = StepStatus.FAILED, u.error
            elif u.action is Action.RETRY:
                record.status, record.error = StepStatus.RETRYING, u.error
            elif u.action is Action.SLEEP:
                record.status = StepStatus.SLEEPING
            else:
                record.status = StepStatus.WAITING
                self.waits[u.name] = u
                if u.action is Action.CALLBACK:
                    record.callback_id = f"cb-{self.run_id}-{u.name}"
                    record.callback_url = f"memory://callbacks/{record.callback_id}"
                    created[u.name] = protocol.CallbackInfo(
                        id=record.callback_id, url=record.callback_url
                    )
                elif u.action is Action.INVOKE:
                    record.child_run_id = f"{self.run_id}/{u.name}"
            if u.name == self.cancel_after and record.status in (
                StepStatus.COMPLETED,
                StepStatus.FAILED,
            ):
                self.cancel_requested = True
        return created

    def close_open_steps(self) -> None:
        """The run ended: steps still open are cancelled, as the orchestrator records them."""
        for record in self.steps.values():
            if record.status in (StepStatus.RUNNING, StepStatus.RETRYING, *_WAITS):
                record.status = StepStatus.CANCELLED

    async def advance(self) -> bool:
        """Let time pass for a suspended run; return whether anything became due."""
        moved = False
        for record in self.steps.values():
            if record.status is StepStatus.RETRYING:
                moved = True
            if record.status not in _WAITS:
                continue
            moved = True
            if self.cancel_requested:
                record.status = StepStatus.CANCELLED
            elif record.kind is StepKind.SLEEP:
                record.status = StepStatus.COMPLETED
            elif record.kind is StepKind.CALLBACK:
                self._finish_callback(record)
            elif record.kind is StepKind.EVENT:
                self._finish_event(record)
            elif record.kind is StepKind.INVOKE:
                await self._finish_child(record)
        return moved

    def _finish_callback(self, record: StepRecord) -> None:
        if record.name in self.callbacks:
            record.status, record.output = StepStatus.COMPLETED, self.callbacks[record.name]
        else:
            record.status, record.timed_out = StepStatus.FAILED, True

    def _finish_event(self, record: StepRecord) -> None:
        wait = self.waits[record.name]
        key = record.name if record.name in self.events else wait.event
        data = self.events.get(key) if key is not None else None
        matches = isinstance(data, dict) and all(
            data.get(k) == v for k, v in (wait.match or {}).items()
        )
        record.status = StepStatus.COMPLETED
        record.output = data if data is not None and (matches or not wait.match) else None
        record.timed_out = record.output is None

    async def _finish_child(self, record: StepRecord) -> None:
        wait = self.waits[record.name]
        child = await run(
            self.sl, wait.workflow or "", wait.input, callbacks=self.callbacks,
            events=self.events, run_id=record.child_run_id, unpatched=self.unpatched,
        )  # fmt: skip
        if child.status == "completed":
            record.status, record.output = StepStatus.COMPLETED, child.output
        else:
            record.status = StepStatus.FAILED
            record.error = child.error or protocol.ErrorInfo(
                type="Cancelled", message=f"child run {child.run_id} was cancelled"
            )


async def run(
    sl: Stepline,
    workflow: str,
    input: Any = None,
    *,
    callbacks: Mapping[str, Any] | None = None,
    events: Mapping[str, Any] | None = None,
    cancel_after: str | None = None,
    run_id: str | None = None,
    max_invocations: int = 1000,
    unpatched: Collection[str] = (),
) -> RunResult:
    """Run ``workflow`` of ``sl`` to its end in memory; return a :class:`RunResult`.

    ``cancel_after``: request cancellation once that step has completed or failed.
    ``unpatched``: run it as a run from before these patches (``ctx.patched`` answers
    ``False`` for them, and no marker is recorded); its child runs too.
    """
    definition = sl.get(workflow)
    if definition is None:
        raise LookupError(f"workflow {workflow!r} is not registered")
    input = _json.round_trip(input)[0]  # a model as its JSON, as the orchestrator sends it
    memory = _MemoryRun(
        sl, workflow, input, run_id or f"test-{workflow}", callbacks or {}, events or {},
        cancel_after, frozenset(unpatched),
    )  # fmt: skip
    generation = 1
    for number in range(1, max_invocations + 1):
        request = protocol.InvokeRequest(
            runId=memory.run_id, workflow=workflow, input=input, invocationId=f"inv-{number}",
            token="test", apiUrl="memory://", cancelRequested=memory.cancel_requested,
            steps=[r.model_copy(deep=True) for r in memory.steps.values()],
            generation=generation, protocolVersion=protocol.PROTOCOL_VERSION,
        )  # fmt: skip
        invocation = Invocation(definition, request, memory)
        invocation.ctx.unpatched = memory.unpatched
        response = await invocation.run()
        memory.keep_logs(response.logs, response.logs_dropped)
        memory.apply(response.updates)
        if response.status is protocol.InvokeStatus.CONTINUED:
            input, generation = response.input, generation + 1
            memory.steps, memory.waits = {}, {}
            continue
        if response.status is not protocol.InvokeStatus.SUSPENDED:
            memory.close_open_steps()
            return RunResult(
                run_id=memory.run_id, status=response.status.value, output=response.output,
                error=response.error, steps=memory.steps, step_calls=memory.calls,
                invocations=number, logs=memory.logs, logs_dropped=memory.logs_dropped,
                state=memory.state,
            )  # fmt: skip
        if not await memory.advance():
            raise RuntimeError(f"run {memory.run_id} suspended with nothing to wait for")
    raise RuntimeError(f"run {memory.run_id} did not end within {max_invocations} invocations")
