"""The replay engine: one :class:`Invocation` runs a workflow until it ends or suspends.

The workflow runs in its own task. The engine waits until it is *quiescent* (done, or every
branch blocked on a ctx future), then acts on the new operations: waits and values are buffered,
new ``run`` steps and callbacks cost one progress call (carrying everything buffered), after
which the steps run concurrently and their results are buffered in turn. When nothing runs and
nothing is new, the invocation answers ``suspended`` with what is still buffered. A result that
came by reference is fetched while the workflow waits for it (the engine waits too); a
workflow that calls ``ctx.continue_as_new`` answers ``continued`` with the next input.
An execution the invocation lets go is stopped before it answers, so nothing of it is left
pending when the host closes the event loop right after (as serverless runtimes do).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any

import pydantic

from stepline import _json, _loops, _tracing, protocol
from stepline._context import Context, _Op
from stepline._definitions import WorkflowDef
from stepline._durations import to_ms
from stepline._errors import (
    WORKFLOW_FAILED,
    NondeterminismError,
    RetryableError,
    StepFailed,
    TerminalError,
    error_info,
    users_exc_info,
)
from stepline._history import thaw
from stepline._logs import capturing
from stepline._parked import adoptable
from stepline._payloads import PayloadError, Payloads
from stepline._transport import ProgressSender, StaleInvocation
from stepline.protocol import Action, InvokeStatus, StepUpdate

logger = logging.getLogger("stepline")

QUIET_YIELDS = 16
"""Loop turns without ctx activity after which the workflow counts as quiescent."""

FOREIGN_AWAIT_POLL = 0.005
"""Seconds to let a workflow that awaits something other than ctx (no branch is blocked on ctx)."""

STOP_SECONDS = 1.0
"""How long an answer waits, at most, for the execution it let go to stop."""


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # an abandoned execution's end is not news


class Invocation:
    """One invocation of one run: replay, run what is new, answer."""

    def __init__(
        self,
        definition: WorkflowDef,
        request: protocol.InvokeRequest,
        sender: ProgressSender,
        traceparent: str | None = None,
        *,
        may_park: bool = False,
        payloads: Payloads | None = None,
    ) -> None:
        self.definition = definition
        # Encrypts and stores what the app sends, and reads it back (None: values are plain).
        self.payloads = payloads
        # Suspended on sleeps alone, the execution may stay alive for the run's next invocation
        # (``parked``), which then goes on from where it stopped instead of replaying.
        self.may_park = may_park
        self.parked = False
        self.sent: set[str] = set()  # the steps the parked invocation's answer reported
        self.traceparent = traceparent  # W3C trace context the invocation came with
        self.request = request
        self.sender = sender
        self.ctx = Context(request, definition, self._fetch_result, payloads)
        self.buffer: list[StepUpdate] = []
        self.progress_calls = 0
        self.running: set[asyncio.Task[None]] = set()
        self.task: asyncio.Future[Any] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None  # the loop the execution runs on

    async def run(self) -> protocol.InvokeResponse:
        """Drive the workflow to its answer. Raises ``OrchestratorUnavailable`` when stuck."""
        given = self.request.input
        if self.payloads is not None:
            try:
                given = await self.payloads.decode(given)
            except PayloadError as exc:
                error = self.payloads.seal_error(exc.info())
                return protocol.InvokeResponse(status=InvokeStatus.FAILED, error=error)
        model = self.definition.signature.input_model
        if model is not None:
            try:
                given = model.model_validate(given)
            except Exception as exc:
                # Whatever a validator raises (pydantic lets through all but ValueError and
                # AssertionError), input the workflow refuses fails the run: no retry fixes it.
                detail = str(exc) if isinstance(exc, pydantic.ValidationError) else repr(exc)
                info = protocol.ErrorInfo(
                    type=type(exc).__name__,
                    code="validation_failed",
                    message=f"the run's input is not a valid {model.__name__}: {detail}",
                )
                if self.payloads is not None:  # the message quotes the input
                    info = self.payloads.seal_error(info) or info
                return protocol.InvokeResponse(status=InvokeStatus.FAILED, error=info)
        coro = self.definition.fn(self.ctx, given)
        self.loop = asyncio.get_running_loop()
        self.task = asyncio.ensure_future(coro)
        self.task.add_done_callback(_retrieve)
        return await self._go(self.task)

    async def _go(self, task: asyncio.Future[Any]) -> protocol.InvokeResponse:
        try:
            return await self._drive(task)
        except StaleInvocation:
            await self._stop()
            return protocol.InvokeResponse(status=InvokeStatus.STALE)
        except BaseException:
            self._abandon()
            raise

    def resumable(
        self, request: protocol.InvokeRequest, changed: list[protocol.StepRecord]
    ) -> list[asyncio.Future[Any]] | None:
        """The sleeps to end when ``request``, the run's next invocation, bringing ``changed``
        (what changed since this parked one), goes on with this execution; None when it must
        replay instead. It goes on only when it can take in everything changed (see
        :func:`stepline._parked.adoptable`): sleeps it waits on that ended (one at least), and
        steps it met that ended since (their records are adopted by :meth:`resume`, so a
        callback completed or timed out while the run slept is seen when it is awaited), with
        every step its answer reported among them (an answer that was lost left the history
        without them)."""
        if (
            not self.parked
            or request.run_id != self.request.run_id
            or request.history_base != self.request.invocation_id
            or request.generation != self.request.generation
            or request.workflow != self.request.workflow
            or request.cancel_requested
        ):
            return None
        sleeps = self.ctx.pending_sleeps()
        if sleeps is None:
            return None
        ending = adoptable(changed, sleeps, self.ctx.reached, self.sent)
        if ending is None:
            return None
        return [sleeps[name] for name in ending]

    async def resume(
        self,
        request: protocol.InvokeRequest,
        ending: list[asyncio.Future[Any]],
        traceparent: str | None = None,
    ) -> protocol.InvokeResponse:
        """Go on with this parked execution as invocation ``request``: the sleeps in
        ``ending`` (from :meth:`resumable`) return, and the workflow runs on from there."""
        assert self.task is not None
        self.request, self.traceparent = request, traceparent
        self.buffer, self.progress_calls, self.parked, self.sent = [], 0, False, set()
        self.ctx.next_invocation(request)  # adopts the records the invocation brings
        for future in ending:
            self._resolve(future, None)
        return await self._go(self.task)

    def abandon(self) -> None:
        """Let a parked execution go (its run will replay if it is invoked again here), on its
        own loop: at once, or soon when that loop runs in another thread; when that loop is
        closed, its tasks are released without it (see :mod:`stepline._loops`)."""
        self.parked = False
        loop = self.loop
        if loop is not None and loop.is_running() and loop is not _loops.running():
            try:
                loop.call_soon_threadsafe(self._abandon)
                return
            except RuntimeError:
                pass  # closed meanwhile
        if loop is not None and loop.is_closed():
            self.ctx.closed = True
            _loops.release_tasks([self.task, *self.running, *self.ctx.branches])
        else:
            self._abandon()

    async def _fetch_result(self, record: protocol.StepRecord) -> Any:
        return await self.sender.result(self.request, record)

    async def _drive(self, task: asyncio.Future[Any]) -> protocol.InvokeResponse:
        ctx = self.ctx
        while True:
            await self._settle(task)
            if ctx.lost is not None:
                raise ctx.lost  # a result could not be fetched: stop; the run is invoked again
            fresh = ctx.take_fresh()
            if fresh and ctx.fatal is None and (unreached := ctx.unreached()):
                expected = unreached[0]
                ctx.fail_run(
                    NondeterminismError(
                        f"step {fresh[0].name!r} is new, but the recorded history expects step "
                        f"{expected.name!r} ({expected.kind.value}) first; the workflow code "
                        "changed in a way that is not replay-safe (a step renamed, reordered "
                        "or removed)",
                        fresh[0].name,
                        expected.name,
                    )
                )
            if ctx.fatal is not None or task.done():
                if ctx.fatal is None:
                    # already-resolved ops (values, exhausted steps) were seen by the workflow
                    self.buffer.extend(o.update for o in fresh if o.future is None)
                return await self._finish(task)
            if fresh:
                await self._dispatch(fresh)
                continue
            if self.running or ctx.fetching:
                await asyncio.wait(
                    {*self.running, *ctx.fetching, task}, return_when=asyncio.FIRST_COMPLETED
                )
                continue
            if ctx.waiting == 0:
                # No branch waits on ctx, so the workflow awaits something else: let it.
                await asyncio.wait({task}, timeout=FOREIGN_AWAIT_POLL)
                continue
            if ctx.cancel_requested and not ctx.cancel_raised and ctx.inject_cancel():
                continue
            answer = self._answer(InvokeStatus.SUSPENDED)
            if self.may_park and not ctx.cancel_requested and ctx.pending_sleeps():
                self.parked = True  # alive until the next invocation goes on with it
                self.sent = {update.name for update in answer.updates}
            else:
                await self._stop()
            return answer

    async def _settle(self, task: asyncio.Future[Any]) -> None:
        """Yield to the loop until the workflow is done or ctx activity stops changing."""
        quiet, seen = 0, self.ctx.activity
        while quiet < QUIET_YIELDS and not task.done():
            await asyncio.sleep(0)
            if self.ctx.activity == seen:
                quiet += 1
            else:
                quiet, seen = 0, self.ctx.activity

    async def _dispatch(self, fresh: list[_Op]) -> None:
        """Buffer the new operations, or send them in one progress call when one needs it."""
        for op in fresh:
            if op.future is not None and op.update.action not in (Action.START, Action.CALLBACK):
                self.ctx.blocked.append(op.future)
        if not any(op.update.action in (Action.START, Action.CALLBACK) for op in fresh):
            self.buffer.extend(op.update for op in fresh)
            return
        updates = self._sealed([*self.buffer, *(op.update for op in fresh)])
        self.buffer = []  # taken before the await: steps finishing meanwhile buffer anew
        self.progress_calls += 1
        lines, dropped = self.ctx.logs.take()  # the lines written so far go with the updates
        reply = await self.sender.progress(
            self.request, updates, self.progress_calls, logs=lines, logs_dropped=dropped
        )
        if reply.cancel_requested:
            self.ctx.request_cancel()
        # A cancel request learnt from this call stops the new steps at their boundary.
        cancel = self.ctx.cancel_requested and not self.ctx.cancel_raised
        for op in fresh:
            if op.future is None or op.future.done():
                continue
            if op.update.action is Action.CALLBACK:
                info = reply.callbacks.get(op.name)
                if info is None:
                    op.future.set_exception(
                        RuntimeError(f"the orchestrator created no callback for {op.name!r}")
                    )
                else:
                    op.future.set_result(info)
            elif op.update.action is Action.START and cancel:
                op.future.set_exception(self.ctx._cancelled())
                self.ctx.activity += 1
            elif op.update.action is Action.START:
                step = asyncio.ensure_future(self._execute(op))
                self.running.add(step)
                step.add_done_callback(self.running.discard)

    async def _execute(self, op: _Op) -> None:
        """Run one step attempt and buffer its outcome: complete, retry or fail."""
        assert op.call is not None and op.future is not None
        fn, args, kwargs = op.call
        span = _tracing.step_span(self.traceparent, self.request.run_id, op.name, op.update.attempt)
        try:
            with span, capturing(self.ctx.logs, op.name):
                if inspect.iscoroutinefunction(fn):
                    result = await fn(*args, **kwargs)
                else:
                    result = await asyncio.to_thread(fn, *args, **kwargs)
                    if inspect.isawaitable(result):
                        result = await result
        except Exception as exc:
            self._step_raised(op, exc)
            return
        try:
            value, size = _json.round_trip(result)
        except (TypeError, ValueError) as exc:
            message = f"the result of step {op.name!r} is not JSON serialisable: {exc}"
            info = protocol.ErrorInfo(type="TypeError", code="not_json", message=message)
            self._step_failed(op, info)
            return
        sent = value
        if self.payloads is not None:
            try:
                sent, size = await self.payloads.encode(value, self.request.run_id)
            except Exception as exc:  # the store could not be written: the attempt failed
                self._step_raised(op, exc)
                return
        if size > _json.MAX_PAYLOAD_BYTES:
            message = f"the result of step {op.name!r} is {size} bytes, over the 1 MiB limit"
            info = protocol.ErrorInfo(
                type="PayloadTooLarge", message=message, code="payload_too_large"
            )
            self._step_failed(op, info)
            return
        self._push(op, Action.COMPLETE, output=sent)
        # The workflow gets its own copy: what it does to it never changes what is recorded.
        self._resolve(op.future, thaw(value))

    def _step_raised(self, op: _Op, exc: Exception) -> None:
        info = error_info(exc)
        attempt, retries = op.update.attempt, self.ctx.retries
        logger.warning(
            "step_attempt_failed: step %r, attempt %d, run %s",
            op.name,
            attempt,
            self.request.run_id,
            exc_info=users_exc_info(exc),
            extra={"step": op.name, "attempt": attempt, "run_id": self.request.run_id},
        )
        if isinstance(exc, TerminalError) or attempt >= retries.attempts:
            self._step_failed(op, info)
            return
        delay = retries.delay_ms(attempt)
        if isinstance(exc, RetryableError) and exc.retry_after is not None:
            try:
                delay = to_ms(exc.retry_after)
            except ValueError:
                logger.warning("retry_after_ignored", extra={"step": op.name})
        self._push(op, Action.RETRY, error=info, delay_ms=delay)
        if op.future is not None:
            self.ctx.blocked.append(op.future)  # the branch waits for the next invocation

    def _step_failed(self, op: _Op, info: protocol.ErrorInfo) -> None:
        self._push(op, Action.FAIL, error=info)
        if op.future is not None and not op.future.done():
            op.future.set_exception(StepFailed.from_info(op.name, info))
            self.ctx.activity += 1

    def _push(self, op: _Op, action: Action, **fields: Any) -> None:
        self.buffer.append(
            StepUpdate(
                name=op.name, kind=op.update.kind, action=action, attempt=op.update.attempt,
                **fields,
            )
        )  # fmt: skip

    def _resolve(self, future: asyncio.Future[Any], value: Any) -> None:
        if not future.done():
            future.set_result(value)
            self.ctx.activity += 1

    async def _finish(self, task: asyncio.Future[Any]) -> protocol.InvokeResponse:
        """The workflow ended (or must): let started steps finish, then answer."""
        ctx = self.ctx
        ctx.close()
        if not task.done():
            task.cancel()
        if self.running:
            await asyncio.wait(set(self.running))
        if ctx.fatal is not None:
            self._log_failed(ctx.fatal)
            return self._answer(InvokeStatus.FAILED, error=error_info(ctx.fatal, WORKFLOW_FAILED))
        if ctx.lost is not None:
            raise ctx.lost
        if ctx.cancel_raised:
            return self._answer(InvokeStatus.CANCELLED)
        if ctx.continued is not None and not task.cancelled() and task.exception() is ctx.continued:
            following = ctx.continued.input
            if self.payloads is not None:
                following = (await self.payloads.encode(following, self.request.run_id))[0]
            return self._answer(InvokeStatus.CONTINUED, input=following)
        if task.cancelled():
            info = protocol.ErrorInfo(
                type="CancelledError", code="cancelled", message="the workflow was cancelled"
            )
            return self._answer(InvokeStatus.FAILED, error=info)
        exc = task.exception()
        if exc is not None:
            self._log_failed(exc)
            return self._answer(InvokeStatus.FAILED, error=error_info(exc, WORKFLOW_FAILED))
        try:
            output, size = _json.round_trip(task.result())
        except (TypeError, ValueError) as err:
            message = f"the workflow's output is not JSON serialisable: {err}"
            info = protocol.ErrorInfo(type="TypeError", code="not_json", message=message)
            return self._answer(InvokeStatus.FAILED, error=info)
        if self.payloads is not None:
            # A store that cannot be written raises: the invocation is tried again.
            output, size = await self.payloads.encode(output, self.request.run_id)
        if size > _json.MAX_PAYLOAD_BYTES:
            message = f"the workflow's output is {size} bytes, over the 1 MiB limit"
            info = protocol.ErrorInfo(
                type="PayloadTooLarge", message=message, code="payload_too_large"
            )
            return self._answer(InvokeStatus.FAILED, error=info)
        return self._answer(InvokeStatus.COMPLETED, output=output)

    def _log_failed(self, exc: BaseException) -> None:
        run_id, workflow = self.request.run_id, self.request.workflow
        logger.error(
            "workflow_failed: workflow %r, run %s",
            workflow,
            run_id,
            exc_info=users_exc_info(exc),
            extra={"workflow": workflow, "run_id": run_id, "attempt": self.request.attempt},
        )

    def _sealed(self, updates: list[StepUpdate]) -> list[StepUpdate]:
        """``updates`` with their errors' texts encrypted, when the app encrypts (every error
        leaves the app through here or :meth:`_answer`)."""
        if self.payloads is None:
            return updates
        return [
            u
            if u.error is None
            else u.model_copy(update={"error": self.payloads.seal_error(u.error)})
            for u in updates
        ]

    def _answer(self, status: InvokeStatus, **fields: Any) -> protocol.InvokeResponse:
        lines, dropped = self.ctx.logs.take()
        if self.payloads is not None and fields.get("error") is not None:
            fields["error"] = self.payloads.seal_error(fields["error"])
        return protocol.InvokeResponse(
            status=status,
            updates=self._sealed(self.buffer),
            logs=lines,
            logsDropped=dropped,
            **fields,
        )

    def _abandon(self) -> None:
        """Stop everything this execution started; the answer is already decided."""
        self.ctx.close()
        for task in (self.task, *self.running):
            if task is not None and not task.done():
                task.cancel()

    async def _stop(self) -> None:
        """:meth:`_abandon`, then let the execution's tasks end (for ``STOP_SECONDS`` at most)."""
        self._abandon()
        tasks = {t for t in (self.task, *self.running, *self.ctx.branches) if t is not None}
        pending = {task for task in tasks if not task.done()}
        if pending:
            await asyncio.wait(pending, timeout=STOP_SECONDS)
