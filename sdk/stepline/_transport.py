"""Progress calls from the SDK to the orchestrator during an invocation.

``POST {apiUrl}/v1/invocations/{invocationId}/progress`` with the invocation's bearer token and
a :class:`~stepline.protocol.ProgressRequest`. A ``409`` means another invocation owns the run
(:class:`StaleInvocation`); network errors and ``5xx`` are retried a few times, then reported as
:class:`OrchestratorUnavailable` (the handler answers ``503`` and the orchestrator retries).
A large step result that came by reference is fetched the same way, by
``GET {apiUrl}/v1/invocations/{invocationId}/results/{position}?runId={runId}``, and so is a
run's whole history when an invocation built on one the SDK did not keep, by
``GET {apiUrl}/v1/invocations/{invocationId}/steps?runId={runId}``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import httpx
import pydantic

from stepline import _http, _json, protocol

logger = logging.getLogger("stepline")

__all__ = ["OrchestratorUnavailable", "ProgressSender", "StaleInvocation", "Transport"]


class StaleInvocation(Exception):
    """The orchestrator refused a progress call: another invocation owns the run."""


class OrchestratorUnavailable(Exception):
    """Progress calls kept failing; the invocation cannot go on."""


class _TryAgain(Exception):
    """An answer that may be right on another try (a result that does not match its digest)."""


_T = TypeVar("_T")


class ProgressSender(Protocol):
    """What the engine needs to report progress (HTTP here; in memory in ``stepline.testing``)."""

    async def progress(
        self,
        request: protocol.InvokeRequest,
        updates: list[protocol.StepUpdate],
        seq: int = 0,
        *,
        logs: list[protocol.LogLine] | None = None,
        logs_dropped: int = 0,
    ) -> protocol.ProgressResponse:
        """Commit ``updates`` (the invocation's ``seq``-th call) for the invocation ``request``,
        with the log lines written since the last call (and how many were dropped); answer the
        orchestrator's reply."""
        ...

    async def result(self, request: protocol.InvokeRequest, record: protocol.StepRecord) -> Any:
        """The result of ``record``, a step whose result came by reference (``outputRef``)."""
        ...

    async def history(self, request: protocol.InvokeRequest) -> list[protocol.StepRecord]:
        """The whole history of the run of invocation ``request``, as it stands."""
        ...


class Transport:
    """Sends progress calls over one shared keep-alive client: :mod:`stepline._http` by
    default, or a given ``httpx.AsyncClient`` (tests route that one in process)."""

    def __init__(
        self,
        client: httpx.AsyncClient | None = None,
        *,
        retries: int = 3,
        backoff: float = 0.2,
    ) -> None:
        self._client = client
        self._fast = _http.HttpClient(timeout=30.0)
        self.retries = retries
        self.backoff = backoff

    @property
    def client(self) -> httpx.AsyncClient | None:
        """The httpx client progress calls go through, when one was given."""
        return self._client

    @client.setter
    def client(self, value: httpx.AsyncClient) -> None:
        self._client = value

    async def _post(self, url: str, content: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        if self._client is not None:
            try:
                answer = await self._client.post(url, content=content, headers=headers)
            except httpx.HTTPError as exc:
                raise _http.HttpError(f"{type(exc).__name__}: {exc}") from None
            return answer.status_code, answer.content
        # The orchestrator applies a repeated seq with the same body once: safe to resend.
        response = await self._fast.post(url, content, headers, idempotent=True)
        return response.status, response.body

    async def _get(self, url: str, headers: dict[str, str]) -> tuple[int, bytes]:
        if self._client is not None:
            try:
                answer = await self._client.get(url, headers=headers)
            except httpx.HTTPError as exc:
                raise _http.HttpError(f"{type(exc).__name__}: {exc}") from None
            return answer.status_code, answer.content
        response = await self._fast.request("GET", url, b"", headers, idempotent=True)
        return response.status, response.body

    async def result(self, request: protocol.InvokeRequest, record: protocol.StepRecord) -> Any:
        """GET a result that came by reference and check it against its digest; retry
        transient failures; raise on a stale or lost orchestrator."""
        ref = record.output_ref
        if ref is None:
            return record.output

        def check(answer: bytes) -> Any:
            digest = "md5:" + hashlib.md5(answer, usedforsecurity=False).hexdigest()
            if len(answer) != ref.size or digest != ref.digest:
                raise _TryAgain(f"the result of step {record.name!r} does not match its reference")
            return _json.loads(answer)

        path = f"/results/{record.position}?runId={request.run_id}"
        return await self._fetch(request, path, "a result", check)

    async def history(self, request: protocol.InvokeRequest) -> list[protocol.StepRecord]:
        """GET the run's whole history for the invocation; retry transient failures; raise on
        a stale or lost orchestrator."""

        def parse(answer: bytes) -> list[protocol.StepRecord]:
            try:
                return protocol.HistoryResponse.model_validate_json(answer).steps
            except (ValueError, pydantic.ValidationError) as exc:
                raise OrchestratorUnavailable(f"the history fetched is not valid: {exc}") from None

        return await self._fetch(request, f"/steps?runId={request.run_id}", "the history", parse)

    async def _fetch(
        self,
        request: protocol.InvokeRequest,
        path: str,
        what: str,
        parse: Callable[[bytes], _T],
    ) -> _T:
        """GET ``{apiUrl}/v1/invocations/{invocationId}{path}`` with the invocation's token and
        ``parse`` the answer; network errors, 5xx and answers ``parse`` wants again are tried
        again; 409 is :class:`StaleInvocation`, anything else :class:`OrchestratorUnavailable`."""
        base = request.api_url.rstrip("/")
        url = f"{base}/v1/invocations/{request.invocation_id}{path}"
        headers = {
            "Authorization": f"Bearer {request.token}",
            # An SDK that declares no version is given a history without state steps.
            protocol.PROTOCOL_HEADER: str(protocol.PROTOCOL_VERSION),
        }
        problem = "no attempt made"
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                status, answer = await self._get(url, headers)
            except _http.HttpError as exc:
                problem = str(exc)
                continue
            if status == 409:
                raise StaleInvocation(answer[:500].decode("utf-8", "replace"))
            if status >= 500:
                problem = f"HTTP {status}"
                continue
            if status != 200:
                text = answer[:500].decode("utf-8", "replace")
                raise OrchestratorUnavailable(f"{what} was refused with HTTP {status}: {text}")
            try:
                return parse(answer)
            except _TryAgain as exc:
                problem = str(exc)
        raise OrchestratorUnavailable(f"fetching {what} failed {self.retries + 1} times: {problem}")

    async def progress(
        self,
        request: protocol.InvokeRequest,
        updates: list[protocol.StepUpdate],
        seq: int = 0,
        *,
        logs: list[protocol.LogLine] | None = None,
        logs_dropped: int = 0,
    ) -> protocol.ProgressResponse:
        """POST the updates and log lines; retry transient failures (the same ``seq``, so the
        orchestrator applies them once); raise on a stale or lost orchestrator."""
        url = f"{request.api_url.rstrip('/')}/v1/invocations/{request.invocation_id}/progress"
        # The updates were validated when made: serialise them straight to JSON.
        body = protocol.ProgressRequest.model_construct(
            run_id=request.run_id, updates=updates, seq=seq, logs=logs or [],
            logs_dropped=logs_dropped, generation=request.generation,
        )  # fmt: skip
        content = body.model_dump_json(by_alias=True, exclude_none=True).encode()
        headers = {
            "Authorization": f"Bearer {request.token}",
            "Content-Type": "application/json",
        }
        problem = "no attempt made"
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                status, answer = await self._post(url, content, headers)
            except _http.HttpError as exc:
                problem = str(exc)
                continue
            text = answer[:500].decode("utf-8", "replace")
            if status == 409:
                raise StaleInvocation(text)
            if status >= 500:
                problem = f"HTTP {status}"
                continue
            if status != 200:
                raise OrchestratorUnavailable(f"progress call refused with HTTP {status}: {text}")
            try:
                return protocol.ProgressResponse.model_validate_json(answer)
            except (ValueError, pydantic.ValidationError) as exc:
                raise OrchestratorUnavailable(f"progress answer is not valid: {exc}") from None
        logger.warning(
            "progress_call_failed",
            extra={"invocation_id": request.invocation_id, "problem": problem},
        )
        raise OrchestratorUnavailable(f"progress call failed {self.retries + 1} times: {problem}")

    async def aclose(self) -> None:
        """Close the connections this transport opened (a given httpx client stays open)."""
        await self._fast.aclose()
