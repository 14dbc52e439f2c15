"""Executions kept alive between invocations, so a run that slept goes on without replaying.

When an invocation suspends with every branch of the workflow waiting on a sleep, its execution
(the workflow's task, suspended where it awaits) may stay in memory. If the run's next
invocation comes to this process, builds on that invocation and brings only what the execution
can take in (:func:`adoptable`: the sleeps it waits on ended, steps it met ended since, a
callback it made completed or timed out while it slept), it adopts those records, the sleeps
return and the workflow goes on from there: no replay, so each iteration of a long loop costs
the same. Anything else (another process got an invocation in between, a step it never met
changed, the run was cancelled, an answer was lost) and the execution is let go and the run
replays as always.

At most ``max_runs`` executions are kept, none longer than ``max_seconds``; the oldest go first.
An execution goes on only on the event loop it ran on: a host that runs each request on a fresh
loop replays instead, and what was parked on loops since closed is let go.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping
from typing import Any, Generic, Protocol, TypeVar

from stepline import _loops
from stepline.protocol import StepRecord, StepStatus

DEFAULT_MAX_RUNS = 256
DEFAULT_MAX_SECONDS = 600.0


_ENDED = (StepStatus.COMPLETED, StepStatus.FAILED)


def adoptable(
    changed: list[StepRecord],
    sleeps: Mapping[str, Any],
    reached: Callable[[str], bool],
    sent: Collection[str],
) -> list[str] | None:
    """The names of the ``sleeps`` (pending, by step name) that end when a parked execution
    takes in ``changed``, the records its next invocation brings; None when it cannot take them
    in and must replay. It can when every changed record is one of its pending sleeps, ended or
    still sleeping, or a step it ``reached`` that has ended (its own step's result, or a
    callback it made that was completed or timed out while it slept: adopted, the workflow sees
    it when it awaits it); at least one sleep ends; and every step its last answer reported
    (``sent``) is among them (else that answer was lost)."""
    ending: list[str] = []
    for record in changed:
        if record.name in sleeps:
            if record.status is StepStatus.COMPLETED:
                ending.append(record.name)
            elif record.status is not StepStatus.SLEEPING:
                return None
        elif not (reached(record.name) and record.status in _ENDED):
            return None
    if not ending or not set(sent) <= {record.name for record in changed}:
        return None
    return ending


class Parkable(Protocol):
    """What is parked: an execution (:class:`stepline._engine.Invocation`) that runs on
    ``loop`` (None before it ran) and can be let go."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None: ...

    def abandon(self) -> None: ...


Invocation = TypeVar("Invocation", bound=Parkable)


class ParkedRuns(Generic[Invocation]):
    """Parked executions by run id."""

    def __init__(
        self, max_runs: int = DEFAULT_MAX_RUNS, max_seconds: float = DEFAULT_MAX_SECONDS
    ) -> None:
        self.max_runs = max_runs
        self.max_seconds = max_seconds
        self._runs: OrderedDict[str, tuple[float, Invocation]] = OrderedDict()
        self._loop: object = None  # the loop last taken on
        self.resumed = 0  # invocations that went on with a parked execution

    def __len__(self) -> int:
        return len(self._runs)

    def take(self, run_id: str) -> Invocation | None:
        """The execution parked for ``run_id`` on the running loop, no longer parked (let go
        of those too old, and on a loop new here of those whose loops are closed)."""
        self._expire(time.monotonic())
        loop = _loops.running()
        if loop is not self._loop:
            self._loop = loop
            for other, (_, invocation) in list(self._runs.items()):
                if invocation.loop is not None and invocation.loop.is_closed():
                    self._runs.pop(other, None)
                    invocation.abandon()
        kept = self._runs.pop(run_id, None)
        if kept is None:
            return None
        if kept[1].loop is not None and kept[1].loop is not loop:
            kept[1].abandon()  # it cannot go on here: the run replays
            return None
        return kept[1]

    def keep(self, run_id: str, invocation: Invocation) -> None:
        """Park ``invocation`` (suspended, :attr:`Invocation.parked`) for its run's next
        invocation, letting the oldest go past ``max_runs``."""
        if self.max_runs <= 0:
            invocation.abandon()
            return
        old = self._runs.pop(run_id, None)
        if old is not None and old[1] is not invocation:
            old[1].abandon()
        self._runs[run_id] = (time.monotonic(), invocation)
        while len(self._runs) > self.max_runs:
            _, (_, dropped) = self._runs.popitem(last=False)
            dropped.abandon()

    def clear(self) -> None:
        """Let every parked execution go."""
        while self._runs:
            _, (_, dropped) = self._runs.popitem(last=False)
            dropped.abandon()

    def _expire(self, now: float) -> None:
        while self._runs:
            run_id, (since, invocation) = next(iter(self._runs.items()))
            if now - since <= self.max_seconds:
                return
            del self._runs[run_id]
            invocation.abandon()
