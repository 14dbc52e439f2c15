"""A pull app's worker: it syncs the app, long-polls the orchestrator for the app's invocations
and runs each with the same engine as the ASGI handler, keeping its lease with heartbeats and
sending the answer back. It needs no inbound port: every call goes out to the orchestrator.

``stepline worker MODULE:ATTR --app NAME`` runs one (see :mod:`stepline.cli.main`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from typing import Any

import httpx
import pydantic

from stepline import _json, protocol
from stepline._transport import OrchestratorUnavailable
from stepline._workflow import Stepline

logger = logging.getLogger("stepline")

__all__ = ["Worker", "WorkerError"]


class WorkerError(Exception):
    """The orchestrator refused the worker (a bad key, an unknown or push app); it stops."""


class Worker:
    """Runs the invocations of pull app ``app`` with ``stepline``'s workflows, at most
    ``concurrency`` at once. ``url`` and ``api_key``: the orchestrator and a key of the app's
    environment (``write`` or ``admin``); ``wait``: how long each poll waits (seconds);
    ``drain``: how long :meth:`stop` lets the invocations running finish (seconds);
    ``take_over``: its sync moves to the app the workflows another app registered (it is
    refused otherwise); ``deployment``: the app's deployment it runs (its ``deploymentId``,
    registered with ``POST /v1/apps/{app}/deployments``): it gets only the runs on that
    deployment, and its sync records nothing unless that deployment is the current one
    (None: the app's current deployment, whichever it is)."""

    def __init__(
        self,
        stepline: Stepline,
        url: str,
        api_key: str,
        app: str,
        *,
        concurrency: int = 10,
        wait: float = 30.0,
        drain: float = 30.0,
        name: str | None = None,
        take_over: bool = False,
        deployment: str | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.stepline = stepline
        self.url = url.rstrip("/")
        self.app = app
        self.concurrency = concurrency
        self.wait = wait
        self._key = api_key
        self._http = httpx.AsyncClient(base_url=self.url, timeout=30.0)
        self.drain = drain
        self.take_over = take_over
        self.deployment = deployment
        self._active: set[asyncio.Task[None]] = set()
        self._stopping = asyncio.Event()
        self.invoked = 0  # invocations this worker has run
        # How the orchestrator's history names this worker ("poll by <name>").
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"

    async def sync(self) -> dict[str, Any]:
        """Register the app's workflows with the orchestrator (its description, as the SDK's
        describe answers it); the orchestrator's answer."""
        body = _json.dumps(protocol.dump(self.stepline.describe()))
        answer = await self._http.post(
            f"/v1/apps/{self.app}/sync",
            content=body,
            headers=self._headers(self._key),
            params=self._params({"takeOver": "true"} if self.take_over else {}),
        )
        if answer.status_code != 200:
            raise WorkerError(f"the sync was refused (HTTP {answer.status_code}): {answer.text}")
        return answer.json()  # type: ignore[no-any-return]

    def stop(self) -> None:
        """Stop polling; :meth:`run` returns once the invocations running have answered (at
        most ``drain`` seconds, then they are cancelled and their leases run out)."""
        self._stopping.set()

    async def run(self) -> None:
        """Sync, then poll and invoke until :meth:`stop` (or until cancelled: cancelling
        stops the invocations running, whose leases run out and other workers take over)."""
        await self.sync()
        logger.info("worker_started", extra={"app": self.app, "concurrency": self.concurrency})
        try:
            await self._poll_until_stopped()
            if self._active:  # stopped: let what runs answer
                await asyncio.wait(self._active, timeout=self.drain)
        finally:
            for task in list(self._active):
                task.cancel()
            await asyncio.gather(*self._active, return_exceptions=True)

    async def _poll_until_stopped(self) -> None:
        pause = 0.2
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            while not self._stopping.is_set():
                free = self.concurrency - len(self._active)
                if free <= 0:
                    await asyncio.wait(
                        {*self._active, stopping}, return_when=asyncio.FIRST_COMPLETED
                    )
                    continue
                poll = asyncio.ensure_future(self._poll(free))
                await asyncio.wait({poll, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if not poll.done():
                    poll.cancel()  # stopped while waiting: the orchestrator claims nothing
                    await asyncio.gather(poll, return_exceptions=True)
                    return
                try:
                    polled = poll.result()
                except (httpx.HTTPError, _Retry) as exc:
                    problem = str(exc) or type(exc).__name__
                    logger.warning(
                        "poll_failed: %s; polling again in %.1fs",
                        problem,
                        pause,
                        extra={"problem": problem},
                    )
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, 5.0)
                    continue
                pause = 0.2
                if polled is None:
                    continue
                for request in polled.invocations:
                    task = asyncio.create_task(self._invoke(request, polled.lease_seconds))
                    self._active.add(task)
                    task.add_done_callback(self._active.discard)
        finally:
            stopping.cancel()

    async def _poll(self, limit: int) -> protocol.PollResponse | None:
        answer = await self._http.post(
            f"/v1/apps/{self.app}/poll",
            params=self._params({"wait": f"{self.wait}s", "limit": str(limit)}),
            headers=self._headers(self._key),
            timeout=self.wait + 30.0,
        )
        if answer.status_code == 204:
            return None
        if answer.status_code == 429 or answer.status_code >= 500:
            raise _Retry(f"HTTP {answer.status_code}")
        if answer.status_code != 200:
            raise WorkerError(f"the poll was refused (HTTP {answer.status_code}): {answer.text}")
        try:
            return protocol.PollResponse.model_validate_json(answer.content)
        except pydantic.ValidationError as exc:
            raise _Retry(f"the poll's answer is not valid: {exc}") from None

    async def _invoke(self, request: protocol.InvokeRequest, lease_seconds: float) -> None:
        # Progress calls go where this worker reaches the orchestrator.
        request.api_url = self.url
        if self.stepline.get(request.workflow) is None:
            # Left to its lease: a worker with the code that hosts it may take it over.
            logger.warning("workflow_not_here", extra={"workflow": request.workflow})
            return
        self.invoked += 1
        beats = asyncio.create_task(self._beat(request, lease_seconds))
        began = time.monotonic()
        try:
            response = await self.stepline.invoke(request)
        except OrchestratorUnavailable as exc:
            logger.warning("invocation_abandoned: %s", exc, extra={"problem": str(exc)})
            return
        except Exception:
            logger.exception("invocation_crashed")
            return
        finally:
            beats.cancel()
        if response.status is protocol.InvokeStatus.STALE:
            return
        answer = protocol.InvocationAnswer(
            runId=request.run_id,
            durationMs=int((time.monotonic() - began) * 1000),
            **response.model_dump(by_alias=True),
        )
        await self._answer(request, answer)

    async def _answer(self, request: protocol.InvokeRequest, answer: Any) -> None:
        """Send the answer; an answer lost on the way is sent again (a second copy is refused
        as stale: the first was kept)."""
        content = answer.model_dump_json(by_alias=True, exclude_none=True).encode()
        url = f"/v1/invocations/{request.invocation_id}/answer"
        for attempt in range(6):
            if attempt:
                await asyncio.sleep(0.2 * 2 ** (attempt - 1))
            try:
                sent = await self._http.post(
                    url, content=content, headers=self._headers(request.token)
                )
            except httpx.HTTPError as exc:
                logger.warning("answer_failed: %s", exc, extra={"problem": str(exc)})
                continue
            if sent.status_code < 500:
                if sent.status_code not in (200, 409):
                    logger.warning("answer_refused", extra={"status": sent.status_code})
                return
        logger.warning("answer_lost", extra={"run_id": request.run_id})

    async def _beat(self, request: protocol.InvokeRequest, lease_seconds: float) -> None:
        """Keep the invocation's lease while it runs: a beat every third of the lease."""
        url = f"/v1/invocations/{request.invocation_id}/heartbeat"
        content = _json.dumps({"runId": request.run_id})
        interval = max(0.1, lease_seconds / 3)
        while True:
            await asyncio.sleep(interval)
            with contextlib.suppress(httpx.HTTPError):
                beat = await self._http.post(
                    url, content=content, headers=self._headers(request.token)
                )
                if beat.status_code == 409:
                    return  # the lease is lost: the next progress call stops the workflow

    def _headers(self, token: str) -> dict[str, str]:
        return {
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "Stepline-Worker": self.name,
            # The poll's invocations carry history deltas only to a worker that reads them.
            "Stepline-Protocol": str(protocol.PROTOCOL_VERSION),
        }

    def _params(self, params: dict[str, str]) -> dict[str, str]:
        """A request's query, with the deployment the worker runs when it declares one."""
        if self.deployment:
            params["deployment"] = self.deployment
        return params

    async def aclose(self) -> None:
        """Close the worker's connections."""
        await self._http.aclose()


class _Retry(Exception):
    """A poll to try again shortly (the orchestrator is away or busy)."""
