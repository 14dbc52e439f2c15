"""The histories an app keeps between invocations of its runs, so each brings only what changed.

An invocation's request carries a run's steps. The first one carries all of them; the next
carries ``historyBase`` (the invocation whose history it builds on) and only the steps that
changed since that invocation's history was read, the open ones and those just settled. The
SDK keeps the history each invocation of a run brought (merged) and lays the next one's steps
over it. When it does not hold that base (another process got it, the app restarted, the
history was dropped for room), it fetches the whole history from the orchestrator with the
invocation's token (``GET {apiUrl}/v1/invocations/{invocationId}/steps?runId=``).

What is kept is only ever read: a step result handed to the workflow is a fresh copy each time
(see :func:`thaw`), so code that changes a value it got never changes what replay sees.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from stepline import _json, protocol

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
"""The histories kept, at most (estimated from their steps' JSON); the least recently used go."""

Fetch = Callable[[protocol.InvokeRequest], Awaitable[list[protocol.StepRecord]]]
"""Fetches the run's whole history for an invocation (raises when the orchestrator cannot)."""

_RECORD_BYTES = 160
"""A step record's size beside its name and result: kind, status, times, ids."""


@dataclass
class _History:
    invocation_id: str
    generation: int
    steps: dict[str, protocol.StepRecord] = field(default_factory=dict)
    size: int = 0


def size_of(record: protocol.StepRecord) -> int:
    """The bytes ``record`` is counted as: its result's JSON, its name and the rest."""
    size = _RECORD_BYTES + len(record.name)
    if record.output is not None:
        size += len(_json.dumps(record.output))
    if record.error is not None:
        size += len(record.error.message) + len(record.error.traceback or "")
    return size


def thaw(value: Any) -> Any:
    """A copy of JSON data (dicts and lists copied all the way down; the rest is immutable)."""
    if isinstance(value, dict):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, list):
        return [thaw(v) for v in value]
    return value


class HistoryCache:
    """The history each run's last invocation brought, at most ``max_bytes`` of them in all (0:
    none kept, every invocation that builds on another fetches the whole history)."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._runs: OrderedDict[str, _History] = OrderedDict()
        self._bytes = 0
        self.fetches = 0  # whole histories fetched because the base was not here

    @property
    def size(self) -> int:
        """Bytes kept now (estimated)."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._runs)

    async def complete(
        self, request: protocol.InvokeRequest, fetch: Fetch
    ) -> protocol.InvokeRequest:
        """``request`` with its whole history in ``steps``: as it came, or laid over the history
        kept from its base, or fetched; the result is kept as the run's history."""
        kept = self._runs.pop(request.run_id, None)
        if kept is not None:
            self._bytes -= kept.size
        if request.history_base is None:
            history = _History(request.invocation_id, request.generation)
            changed = request.steps
        elif (
            kept is not None
            and kept.invocation_id == request.history_base
            and kept.generation == request.generation
        ):
            history = kept
            history.invocation_id = request.invocation_id
            changed = request.steps
        else:
            self.fetches += 1
            history = _History(request.invocation_id, request.generation)
            changed = await fetch(request)
        for record in changed:
            old = history.steps.get(record.name)
            if old is not None:
                history.size -= size_of(old)
            history.steps[record.name] = record
            history.size += size_of(record)
        steps = list(history.steps.values())  # new steps come last: the order stays recorded
        self._keep(request.run_id, history)
        return request.model_copy(update={"steps": steps, "history_base": None})

    def forget(self, run_id: str) -> None:
        """Drop the history of ``run_id`` (its run ended, or continued as new)."""
        kept = self._runs.pop(run_id, None)
        if kept is not None:
            self._bytes -= kept.size

    def _keep(self, run_id: str, history: _History) -> None:
        if self.max_bytes <= 0 or history.size > self.max_bytes:
            return
        self._runs[run_id] = history
        self._bytes += history.size
        while self._bytes > self.max_bytes and self._runs:
            _, dropped = self._runs.popitem(last=False)
            self._bytes -= dropped.size
