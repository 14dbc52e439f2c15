"""The runtime that runs an app's invocations: replay (:class:`stepline._engine.Invocation`),
executions parked between invocations, the runs' histories kept between them, and the
transport of progress calls. The registry (:class:`stepline.Stepline`) owns one and hands it
each invocation with the workflow's definition; the runtime knows nothing of the registry."""

from __future__ import annotations

import httpx

from stepline import protocol
from stepline._definitions import WorkflowDef
from stepline._engine import Invocation
from stepline._history import DEFAULT_MAX_BYTES, HistoryCache
from stepline._parked import DEFAULT_MAX_RUNS, ParkedRuns
from stepline._payloads import Payloads
from stepline._transport import StaleInvocation, Transport

_GOES_ON = (protocol.InvokeStatus.SUSPENDED, protocol.InvokeStatus.STALE)
"""Answers after which the run is invoked again in the same generation: its history is kept."""


class Runtime:
    """Runs invocations, with what an app keeps between them (see the module's docstring)."""

    def __init__(
        self,
        http_client: httpx.AsyncClient | None = None,
        history_cache_bytes: int = DEFAULT_MAX_BYTES,
        parked_runs: int = DEFAULT_MAX_RUNS,
        payloads: Payloads | None = None,
    ) -> None:
        self.payloads = payloads if payloads is not None and payloads.active else None
        self.histories = HistoryCache(history_cache_bytes)
        self.parked: ParkedRuns[Invocation] = ParkedRuns(parked_runs)
        self.transport = Transport(http_client)

    async def invoke(
        self,
        definition: WorkflowDef,
        request: protocol.InvokeRequest,
        traceparent: str | None = None,
    ) -> protocol.InvokeResponse:
        """Run one invocation of ``definition`` (replay, then continue, or go on with the
        execution parked for the run when it can take in what changed) and return its answer."""
        changed = request.steps
        parked = self.parked.take(request.run_id)
        try:
            whole = await self.histories.complete(request, self.transport.history)
        except StaleInvocation:
            if parked is not None:
                parked.abandon()
            return protocol.InvokeResponse(status=protocol.InvokeStatus.STALE)
        ending = None
        if parked is not None and parked.definition is definition:  # the same code
            ending = parked.resumable(request, changed)
        if parked is not None and ending:
            self.parked.resumed += 1
            invocation = parked
            response = await parked.resume(whole, ending, traceparent)
        else:
            if parked is not None:
                parked.abandon()
            invocation = Invocation(
                definition,
                whole,
                self.transport,
                traceparent,
                may_park=self.parked.max_runs > 0,
                payloads=self.payloads,
            )
            response = await invocation.run()
        if invocation.parked:
            self.parked.keep(request.run_id, invocation)
        if response.status not in _GOES_ON:
            self.histories.forget(request.run_id)  # the run ended or starts a new generation
        return response

    async def aclose(self) -> None:
        """Let every parked execution go and close the progress calls' client (when made
        here)."""
        self.parked.clear()
        await self.transport.aclose()
        if self.payloads is not None:
            await self.payloads.aclose()
