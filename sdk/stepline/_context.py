"""The replaying :class:`Context` a workflow receives, and the :class:`Callback` handle.

Each ``ctx`` operation looks its step up by name in the recorded history. A finished record is
replayed at once, without yielding to the event loop; anything new becomes a pending
:class:`_Op` that the engine (``stepline._engine``) dispatches when the workflow is quiescent.
Within one branch (an asyncio task), recorded steps must be met in their recorded order. A
large result comes as a reference (``outputRef``) and is fetched from the orchestrator the first
time the workflow reads it.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
import uuid as uuid_module
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NoReturn, ParamSpec, TypeVar, overload

from stepline import _json, protocol
from stepline._durations import Duration, to_ms
from stepline._errors import (
    CallbackTimeout,
    Cancelled,
    ChildWorkflowFailed,
    DuplicateStepError,
    NondeterminismError,
    StateError,
    StepFailed,
    SteplineError,
    _ContinueAsNew,
    _Suspended,
)
from stepline._history import thaw
from stepline._logs import LogBuffer, RunLog
from stepline._payloads import PayloadError, Payloads
from stepline._types import convert
from stepline.protocol import Action, StepKind, StepStatus, StepUpdate

if TYPE_CHECKING:
    from stepline._definitions import WorkflowDef

P = ParamSpec("P")
T = TypeVar("T")
M = TypeVar("M")

FetchResult = Callable[[protocol.StepRecord], Coroutine[Any, Any, Any]]
"""Fetches a recorded step's result that came by reference (``outputRef``)."""

# The last recorded step entered by the current branch, with the Context it belongs to. A task
# made by gather inherits its parent's value, which is right: its steps come after the parent's
# earlier ones. Keyed to the Context so two invocations never compare their steps.
_last_recorded: contextvars.ContextVar[tuple[Context, protocol.StepRecord] | None] = (
    contextvars.ContextVar("stepline_last_recorded", default=None)
)

# The Context whose current branch runs code for the first time: it met a step that is not in
# the recorded history, or one that runs again. Inherited by the tasks the branch starts.
_live: contextvars.ContextVar[Context | None] = contextvars.ContextVar(
    "stepline_live", default=None
)


def _split(
    steps: list[protocol.StepRecord],
) -> tuple[dict[str, protocol.StepRecord], dict[str, protocol.StepRecord]]:
    """A history's steps by name, in recorded order, and apart from them its patch markers by
    patch id: a marker is never met as a step, so it is never expected nor skipped."""
    records: dict[str, protocol.StepRecord] = {}
    markers: dict[str, protocol.StepRecord] = {}
    for record in sorted(steps, key=lambda s: s.position):
        patch = protocol.patch_of(record)
        if patch is None:
            records[record.name] = record
        else:
            markers[patch] = record
    return records, markers


@dataclass(eq=False)
class _Op:
    """A new operation waiting for the engine: its update and, when it resolves later, a future."""

    name: str
    update: StepUpdate
    future: asyncio.Future[Any] | None = None
    call: tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]] | None = None


class Callback:
    """A callback created by :meth:`Context.callback`: POST JSON to ``url`` to complete it."""

    def __init__(self, ctx: Context, name: str, id: str, url: str) -> None:
        self._ctx = ctx
        self.name = name
        self.id = id
        self.url = url

    async def wait(self) -> Any:
        """The POSTed JSON body; raises :class:`~stepline.CallbackTimeout` after the timeout."""
        return await self._ctx._callback_wait(self.name)

    def __repr__(self) -> str:
        return f"Callback(name={self.name!r}, id={self.id!r}, url={self.url!r})"


class Context:
    """What a workflow uses to run steps, sleep and wait, durably and replay-safely."""

    def __init__(
        self,
        request: protocol.InvokeRequest,
        definition: WorkflowDef,
        fetch: FetchResult | None = None,
        payloads: Payloads | None = None,
    ) -> None:
        self.run_id = request.run_id
        self._payloads = payloads  # decodes what was recorded encrypted or stored
        self.workflow = request.workflow
        self.attempt = request.attempt
        self.generation = request.generation
        """Counts from 1; each :meth:`continue_as_new` starts the next."""
        self.retries = definition.retries
        self._records, self._markers = _split(request.steps)
        self._patches: dict[str, bool] = {}  # each patch's answer in this execution, by id
        self.unpatched: frozenset[str] = frozenset()
        """Patches this execution answers ``False`` without looking (``stepline.testing``
        runs a workflow as a run from before them)."""
        self._orchestrator_protocol = request.protocol_version
        self._state_sets: dict[str, int] = {}  # ctx.set_state calls met so far, by key
        # The state keys this generation recorded and set: a new one past the limit is refused
        # here (the orchestrator also counts the keys of earlier generations).
        self._state_keys = {
            protocol.state_key_of(r.name) for r in request.steps if r.kind is StepKind.STATE
        }
        self._reached: set[str] = set()
        self._furthest = -1  # the highest position of a recorded step this execution reached
        self._fresh: list[_Op] = []
        self._futures: list[asyncio.Future[Any]] = []
        self.blocked: list[asyncio.Future[Any]] = []
        # What each wait a branch blocked on is, by step name (sleeps, callbacks, events, ...).
        self.waits: dict[str, tuple[StepKind, asyncio.Future[Any]]] = {}
        self.activity = 0  # bumps on every ctx call and wake-up: the engine's quiescence probe
        self.waiting = 0  # ctx awaits in progress
        self.closed = False
        self._cancel_requested = request.cancel_requested
        self.cancel_raised = False
        self.fatal: SteplineError | None = None
        self._fetch = fetch
        self.fetching: set[asyncio.Task[Any]] = set()  # results being fetched by reference
        self.branches: set[asyncio.Task[Any]] = set()  # the tasks that awaited a ctx future
        self._fetched: dict[str, Any] = {}  # results fetched by reference, by step name
        self.lost: Exception | None = None  # a fetch failed: the invocation cannot go on
        self.continued: _ContinueAsNew | None = None
        self._met = 0  # recorded steps reached so far
        # Recorded callbacks met whose wait() the code has not reached yet: the code between
        # ctx.callback() and .wait() ran in the invocation that made the callback (which then
        # suspended at the wait), so it is a replay even once every recorded step is met.
        self._unwaited: set[str] = set()
        self.logs = LogBuffer()
        self.log = RunLog(self, self.logs)
        """Keep lines on the run: ``ctx.log.info("charged", amount=5)`` (also ``debug``,
        ``warning``, ``error``). Lines are kept once: replaying recorded steps writes none."""

    def replaying(self) -> bool:
        """Whether the code running now ran before (its log lines were kept then): the branch
        has met no new step, and some recorded step is not reached yet or a recorded
        callback's wait is not."""
        return _live.get() is not self and (self._met < len(self._records) or bool(self._unwaited))

    @property
    def cancel_requested(self) -> bool:
        """Whether cancellation of this run has been requested."""
        return self._cancel_requested

    # -- the operations ------------------------------------------------------------------

    @overload
    async def step(
        self, name: str, fn: Callable[..., Any], *args: Any, type: type[M], **kwargs: Any
    ) -> M: ...
    @overload
    async def step(
        self, name: str, fn: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs
    ) -> T: ...
    @overload
    async def step(self, name: str, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T: ...
    async def step(
        self, name: str, fn: Callable[..., Any], *args: Any, type: Any = None, **kwargs: Any
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` once (sync functions in a thread); return its JSON result,
        or with ``type`` (a pydantic model, or any type pydantic validates) the result as that
        type, on the first execution and on replay alike."""
        return convert(type, await self._step(name, fn, args, kwargs))

    async def _step(
        self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if not callable(fn):
            raise TypeError(f"step {name!r}: fn must be callable")
        record = self._enter(name, StepKind.RUN)
        attempt = 1
        if record is not None:
            if record.status is StepStatus.COMPLETED:
                return await self._output(record)
            if record.status is StepStatus.FAILED:
                raise StepFailed.from_info(name, self._error(record))
            if record.status is StepStatus.CANCELLED:
                raise self._cancelled()
            if record.status is StepStatus.RETRYING and record.blocked:
                # Its backoff has not run out: the branch waits for a later invocation.
                return await self._block(record, name, StepKind.RUN, Action.START)
            # A try recorded running never had its outcome recorded (the app, the orchestrator
            # or the database went away mid-step): a delivery failure, never a used attempt.
            # It runs again as the same attempt; only a try that failed moves to the next.
            attempt = record.attempt if record.status is StepStatus.RUNNING else record.attempt + 1
        self._check_cancel()
        if attempt > self.retries.attempts and record is not None:
            # A step past the attempts its workflow now allows (lowered since it was
            # recorded): it fails with its last attempt's error.
            error = record.error or protocol.ErrorInfo(type="Error", message="step failed")
            self._add(name, StepKind.RUN, Action.FAIL, attempt=record.attempt, error=error)
            raise StepFailed.from_info(name, self._error(record) or error)
        future = self._add(name, StepKind.RUN, Action.START, attempt=attempt, resolves=True)
        self._fresh[-1].call = (fn, args, kwargs)
        return await self._wait(future)

    async def now(self, name: str) -> datetime:
        """The current time (aware, UTC), recorded once and the same on every replay."""
        record = self._enter(name, StepKind.VALUE)
        if record is not None and record.status is StepStatus.COMPLETED:
            try:
                value = datetime.fromisoformat(record.output)
            except (TypeError, ValueError):
                raise self.fail_run(
                    NondeterminismError(f"step {name!r} was not recorded by ctx.now", name)
                ) from None
            return value if value.tzinfo else value.replace(tzinfo=UTC)
        self._replay_or_new(record)
        text = datetime.now(UTC).isoformat()
        self._add(name, StepKind.VALUE, Action.COMPLETE, output=text)
        return datetime.fromisoformat(text)

    async def uuid(self, name: str) -> str:
        """A random UUID (string), recorded once and the same on every replay."""
        record = self._enter(name, StepKind.VALUE)
        if record is not None and record.status is StepStatus.COMPLETED:
            return str(record.output)
        self._replay_or_new(record)
        value = str(uuid_module.uuid4())
        self._add(name, StepKind.VALUE, Action.COMPLETE, output=value)
        return value

    async def sleep(self, name: str, duration: Duration) -> None:
        """Sleep durably for ``duration`` from this call (the run suspends; no process waits)."""
        await self._sleep(name, to_ms(duration), time.time())

    async def sleep_until(self, name: str, until: datetime) -> None:
        """Sleep durably until ``until`` (an aware datetime); at once when it is past."""
        if until.tzinfo is None:
            raise ValueError("sleep_until needs an aware datetime (with a timezone)")
        now = time.time()
        await self._sleep(name, max(0, round((until.timestamp() - now) * 1000)), now)

    async def _sleep(self, name: str, delay_ms: int, called_at: float) -> None:
        record = self._enter(name, StepKind.SLEEP)
        if record is not None and record.status is StepStatus.COMPLETED:
            return
        at_ms = round(called_at * 1000)
        await self._block(
            record, name, StepKind.SLEEP, Action.SLEEP, delay_ms=delay_ms, at_ms=at_ms
        )

    async def callback(self, name: str, timeout: Duration | None = None) -> Callback:
        """Create a callback (a signed URL); ``await cb.wait()`` for the JSON POSTed to it."""
        timeout_ms = None if timeout is None else to_ms(timeout)
        record = self._enter(name, StepKind.CALLBACK)
        if record is not None:
            if record.status is StepStatus.CANCELLED:
                raise self._cancelled()
            self._unwaited.add(name)
            return Callback(self, name, record.callback_id or "", record.callback_url or "")
        self._check_cancel()
        future = self._add(
            name, StepKind.CALLBACK, Action.CALLBACK, timeout_ms=timeout_ms, resolves=True
        )
        info: protocol.CallbackInfo = await self._wait(future)
        return Callback(self, name, info.id, info.url)

    async def _callback_wait(self, name: str) -> Any:
        if self.closed:
            raise _Suspended()
        self.activity += 1
        self._unwaited.discard(name)
        record = self._records.get(name)
        if record is not None:
            if record.status is StepStatus.COMPLETED:
                return await self._output(record)
            if record.status is StepStatus.FAILED:
                if record.timed_out or record.error is None:
                    raise CallbackTimeout(name)
                raise StepFailed.from_info(name, self._error(record))
            if record.status is StepStatus.CANCELLED:
                raise self._cancelled()
        self._check_cancel()
        future = self._future()
        self.blocked.append(future)
        return await self._wait(future)

    async def wait_for_event(
        self,
        name: str,
        *,
        event: str,
        match: dict[str, Any] | None = None,
        timeout: Duration | None = None,
    ) -> Any:
        """Wait for the event ``event`` whose data has ``match``'s fields; ``None`` on timeout."""
        if not isinstance(event, str) or not event:
            raise ValueError("wait_for_event needs an event name")
        match = None if match is None else _json.round_trip(match)[0]
        timeout_ms = None if timeout is None else to_ms(timeout)
        record = self._enter(name, StepKind.EVENT)
        if record is not None and record.status is StepStatus.COMPLETED:
            return await self._output(record)
        if record is not None and record.status is StepStatus.FAILED:
            return None  # a timed-out wait recorded as failed means "no event"
        return await self._block(
            record, name, StepKind.EVENT, Action.EVENT, event=event, match=match,
            timeout_ms=timeout_ms,
        )  # fmt: skip

    async def invoke(self, name: str, workflow: str, input: Any = None) -> Any:
        """Run the workflow ``workflow`` as a child run; return its output.

        Raises :class:`~stepline.ChildWorkflowFailed` when the child fails.
        """
        if not isinstance(workflow, str) or not workflow:
            raise ValueError("invoke needs a workflow name")
        payload = _json.round_trip(input)[0]
        record = self._enter(name, StepKind.INVOKE)
        if record is not None and record.status is StepStatus.COMPLETED:
            return await self._output(record)
        if record is not None and record.status is StepStatus.FAILED:
            error = self._error(record) or protocol.ErrorInfo(message="child workflow failed")
            raise ChildWorkflowFailed(name, error, record.child_run_id)
        if record is None and self._payloads is not None:
            self._replay_or_new(record)
            payload = (await self._payloads.encode(payload, self.run_id))[0]
        return await self._block(
            record, name, StepKind.INVOKE, Action.INVOKE, workflow=workflow, input=payload
        )

    def patched(self, patch_id: str) -> bool:
        """Whether this run takes the code of the patch ``patch_id``: ``True`` in a run that
        reaches this point with it for the first time (a marker is recorded in the run's
        history, ``patch.recorded``) and on that run's replays; ``False`` in a run whose
        history passed this point before the patch existed (recorded steps lie beyond it and
        no marker), on every replay. The same answer for every call in one run."""
        self._patch_call(patch_id)
        if patch_id in self._patches:
            return self._patches[patch_id]
        name = protocol.patch_step_name(patch_id)
        if patch_id in self._markers:
            decided = True
        elif patch_id in self.unpatched or self.unreached():
            # Old code passed here: the marker's place, the next position, holds another step.
            decided = False
        else:
            decided = True
            self._add(name, StepKind.VALUE, Action.COMPLETE, output=True, patch=patch_id)
        self._patches[patch_id] = decided
        if decided:
            self._reached.add(name)
        return decided

    def deprecate_patch(self, patch_id: str) -> None:
        """Say the patch ``patch_id`` is part of the code for good (call it where
        :meth:`patched` was, once no run without its marker is left): records nothing, and a
        run that has the marker replays without it."""
        self._patch_call(patch_id)
        if patch_id in self._markers:
            self._reached.add(protocol.patch_step_name(patch_id))
        self._patches.setdefault(patch_id, True)

    def _patch_call(self, patch_id: str) -> None:
        if self.closed:
            raise _Suspended()
        self.activity += 1
        if not isinstance(patch_id, str) or not 1 <= len(patch_id) <= protocol.MAX_PATCH_ID:
            raise ValueError(
                f"patch ids are strings of 1 to {protocol.MAX_PATCH_ID} characters, "
                f"not {patch_id!r}"
            )

    async def set_state(self, key: str, value: Any) -> None:
        """Publish ``value`` (JSON, at most 64 KiB) under ``key`` (1 to 128 of ``A-Z a-z 0-9 .
        _ : -``): clients read it with ``GET /v1/runs/{id}/state/{key}`` while the run goes
        on. Recorded once per call, like a step (a replay records nothing); setting the key
        again later overwrites its current value. Raises :class:`~stepline.StateError` before
        anything is sent when the key or value is refused, or when the orchestrator is too
        old to record state."""
        problem = protocol.state_key_problem(key)
        if problem is not None:
            raise StateError(problem, "state_key_invalid", key)
        n = self._state_sets.get(key, 0) + 1
        self._state_sets[key] = n
        name = protocol.state_step_name(key, n)
        record = self._enter(name, StepKind.STATE)
        if record is not None and record.status is StepStatus.COMPLETED:
            return  # recorded by an earlier invocation: never sent again
        if record is not None and record.status is StepStatus.FAILED:
            raise StepFailed.from_info(name, self._error(record))  # the orchestrator refused it
        self._replay_or_new(record)
        try:
            plain, size = _json.round_trip(value)
        except (TypeError, ValueError) as exc:
            raise StateError(
                f"the value of state {key!r} is not JSON serialisable: {exc}", "state_not_json", key
            ) from None
        if size > protocol.MAX_STATE_BYTES:
            raise StateError(
                f"the value of state {key!r} is {size} bytes of JSON, over the "
                f"{protocol.MAX_STATE_BYTES // 1024} KiB limit",
                "state_too_large",
                key,
            )
        if key not in self._state_keys and len(self._state_keys) >= protocol.MAX_STATE_KEYS:
            raise StateError(
                f"state {key!r} was not set: a run publishes at most {protocol.MAX_STATE_KEYS} "
                "keys",
                "state_keys_exceeded",
                key,
            )
        version = self._orchestrator_protocol
        if version is None or version < protocol.STATE_PROTOCOL_VERSION:
            raise StateError(
                f"the orchestrator speaks protocol {version or 'before 4'}; ctx.set_state needs "
                f"protocol {protocol.STATE_PROTOCOL_VERSION} (upgrade the orchestrator)",
                "state_not_supported",
                key,
            )
        if self._payloads is not None:
            plain = (await self._payloads.encode(plain, self.run_id))[0]
        self._state_keys.add(key)
        self._add(name, StepKind.STATE, Action.COMPLETE, output=plain, key=key)

    def continue_as_new(self, input: Any = None) -> NoReturn:
        """End this generation of the run and start it over with ``input`` and an empty
        history, under the same run id (the run's history keeps what happened). Raises out of
        the workflow function; the run is then invoked again from the top with ``input``.
        Use it in a long or endless loop so that each invocation replays only the current
        generation's steps."""
        if self.closed:
            raise _Suspended()
        value, size = _json.round_trip(input)
        if size > _json.MAX_PAYLOAD_BYTES:
            raise ValueError(f"the input to continue with is {size} bytes, over the 1 MiB limit")
        self.continued = _ContinueAsNew(value)
        raise self.continued

    # -- machinery -----------------------------------------------------------------------

    def _error(self, record: protocol.StepRecord) -> protocol.ErrorInfo | None:
        """A recorded error, its texts decrypted when the app encrypts."""
        if self._payloads is None:
            return record.error
        return self._payloads.open_error(record.error)

    async def _output(self, record: protocol.StepRecord) -> Any:
        """A completed step's result: inline, or fetched once by reference; decrypted (at
        once) or fetched from the store (once) when the app encoded it. A value that cannot
        be read back fails the step it is read in (``payload_corrupt``)."""
        payloads = self._payloads
        if record.output_ref is None:
            if payloads is None or protocol.envelope_kind(record.output) is None:
                return thaw(record.output)  # records are kept between invocations: never shared
            if record.name in self._fetched:
                return thaw(self._fetched[record.name])
            if payloads.ready(record.output):  # encrypted inline: no I/O, no yield
                try:
                    value = payloads.open_now(record.output)
                except PayloadError as exc:
                    raise exc.step_failed(record.name) from None
                self._fetched[record.name] = value
                return thaw(value)
        if record.name in self._fetched:
            return thaw(self._fetched[record.name])
        if self._fetch is None and record.output_ref is not None:
            raise RuntimeError(f"the result of step {record.name!r} came by reference")
        task = asyncio.ensure_future(self._load(record))
        self.fetching.add(task)
        task.add_done_callback(self.fetching.discard)
        self._futures.append(task)
        self.activity += 1
        try:
            value = await task
        except asyncio.CancelledError:
            raise _Suspended() from None
        except PayloadError as exc:
            raise exc.step_failed(record.name) from None  # no retry reads it right
        except Exception as exc:
            # Not the workflow's to catch: the invocation stops and is tried again.
            if self.lost is None:
                self.lost = exc
            raise _Suspended() from None
        finally:
            self.activity += 1
        self._fetched[record.name] = value  # read again: no second fetch
        return thaw(value)

    async def _load(self, record: protocol.StepRecord) -> Any:
        """A result fetched from the orchestrator (``outputRef``) and the store, decrypted."""
        value = record.output
        if record.output_ref is not None:
            assert self._fetch is not None
            value = await self._fetch(record)
        return value if self._payloads is None else await self._payloads.decode(value)

    def _enter(self, name: str, kind: StepKind) -> protocol.StepRecord | None:
        if self.closed:
            raise _Suspended()
        self.activity += 1
        if not isinstance(name, str) or not 1 <= len(name) <= 256:
            raise ValueError(f"step names are strings of 1 to 256 characters, not {name!r}")
        if name.startswith(protocol.PATCH_STEP_PREFIX):
            raise ValueError(
                f"step names beginning {protocol.PATCH_STEP_PREFIX!r} mark patches "
                f"(ctx.patched), not {name!r}"
            )
        if name in self._reached:
            raise self.fail_run(DuplicateStepError(name))
        self._reached.add(name)
        record = self._records.get(name)
        if record is not None and record.kind != kind:
            raise self.fail_run(
                NondeterminismError(
                    f"step {name!r} was recorded as a {record.kind.value} step but the code now "
                    f"makes it a {kind.value} step; the workflow changed in a way that is not "
                    "replay-safe",
                    name,
                    name,
                )
            )
        if record is not None:
            self._met += 1
            self._check_order(record)
            self._furthest = max(self._furthest, record.position)
        if record is None or (
            record.kind is StepKind.RUN
            and record.status in (StepStatus.RUNNING, StepStatus.RETRYING)
            and not record.blocked
        ):
            _live.set(self)  # what follows in this branch never ran before
        return record

    def _check_order(self, record: protocol.StepRecord) -> None:
        last = _last_recorded.get()
        if last is not None and last[0] is self and record.position < last[1].position:
            before = last[1].name
            raise self.fail_run(
                NondeterminismError(
                    f"steps {before!r} and {record.name!r} were met in another order than "
                    f"recorded: {record.name!r} was recorded before {before!r}; the workflow "
                    "changed in a way that is not replay-safe (steps reordered)",
                    record.name,
                    before,
                )
            )
        _last_recorded.set((self, record))

    def _replay_or_new(self, record: protocol.StepRecord | None) -> None:
        if record is not None and record.status is StepStatus.CANCELLED:
            raise self._cancelled()
        self._check_cancel()

    async def _block(
        self,
        record: protocol.StepRecord | None,
        name: str,
        kind: StepKind,
        action: Action,
        **fields: Any,
    ) -> Any:
        """A wait: new → report it and block; recorded and not finished → block."""
        self._replay_or_new(record)
        if record is None:
            future = self._add(name, kind, action, resolves=True, **fields)
        else:
            future = self._future()
            self.blocked.append(future)
        self.waits[name] = (kind, future)
        return await self._wait(future)

    def _add(
        self, name: str, kind: StepKind, action: Action, *, resolves: bool = False, **fields: Any
    ) -> asyncio.Future[Any]:
        update = StepUpdate(name=name, kind=kind, action=action, **fields)
        future = self._future() if resolves else None
        self._fresh.append(_Op(name, update, future))
        return future  # type: ignore[return-value]

    def _future(self) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._futures.append(future)
        return future

    async def _wait(self, future: asyncio.Future[Any]) -> Any:
        branch = asyncio.current_task()
        if branch is not None:
            self.branches.add(branch)
        self.activity += 1
        self.waiting += 1
        try:
            return await future
        finally:
            self.waiting -= 1
            self.activity += 1

    def _check_cancel(self) -> None:
        if self._cancel_requested and not self.cancel_raised:
            raise self._cancelled()

    def _cancelled(self) -> Cancelled:
        self.cancel_raised = True
        return Cancelled("the run was cancelled")

    def fail_run(self, exc: SteplineError) -> SteplineError:
        if self.fatal is None:
            self.fatal = exc
        return exc

    # -- what the engine uses ------------------------------------------------------------

    def take_fresh(self) -> list[_Op]:
        """The new operations since the last call, in the order the workflow made them."""
        fresh, self._fresh = self._fresh, []
        return fresh

    def unreached(self) -> list[protocol.StepRecord]:
        """Recorded steps this execution has not reached yet, in recorded order, but for those
        it has passed: a step recorded before one it reached was removed from the code, and
        its result is never read again."""
        return [
            r
            for name, r in self._records.items()
            if name not in self._reached and r.position > self._furthest
        ]

    def passed(self) -> list[protocol.StepRecord]:
        """Recorded steps this execution skipped: not reached, recorded before one it reached."""
        return [
            r
            for name, r in self._records.items()
            if name not in self._reached and r.position < self._furthest
        ]

    def request_cancel(self) -> None:
        """Cancellation was requested while the invocation runs."""
        self._cancel_requested = True

    def inject_cancel(self) -> bool:
        """Raise :class:`Cancelled` into the oldest blocked branch, if there is one."""
        for future in self.blocked:
            if not future.done():
                future.set_exception(self._cancelled())
                return True
        return False

    def next_invocation(self, request: protocol.InvokeRequest) -> None:
        """Go on as invocation ``request`` (a parked execution resumed): its records (the
        history it brings, laid over the one it was built on: a callback completed while the
        run slept is seen when the workflow awaits it), its attempt, a log buffer of its own
        (each invocation's lines are capped and sent as one invocation's), and only the futures
        still pending."""
        self._records, self._markers = _split(request.steps)
        self.attempt = request.attempt
        self._orchestrator_protocol = request.protocol_version
        self.logs = LogBuffer()
        self.log.rebind(self.logs)
        self.forget_done()

    def patch_answers(self) -> dict[str, bool]:
        """What :meth:`patched` answered in this execution, by patch id."""
        return dict(self._patches)

    def reached(self, name: str) -> bool:
        """Whether this execution met the step ``name``."""
        return name in self._reached

    def pending_sleeps(self) -> dict[str, asyncio.Future[Any]] | None:
        """The sleeps branches wait on, by step name, when every pending ctx future is one of
        them; None when something else is pending (a callback, an event, a child, a retry)."""
        sleeps = {
            name: future
            for name, (kind, future) in self.waits.items()
            if kind is StepKind.SLEEP and not future.done()
        }
        others = [f for f in self._futures if not f.done() and f not in sleeps.values()]
        return None if others else sleeps

    def forget_done(self) -> None:
        """Drop the futures and waits that are over (an execution that lives across
        invocations keeps only what is still pending)."""
        self._futures = [f for f in self._futures if not f.done()]
        self.blocked = [f for f in self.blocked if not f.done()]
        self.waits = {n: w for n, w in self.waits.items() if not w[1].done()}
        self.branches = {task for task in self.branches if not task.done()}

    def close(self) -> None:
        """End this execution: further ctx calls raise ``_Suspended``; pending waits end."""
        self.closed = True
        for future in self._futures:
            if not future.done():
                future.cancel()
