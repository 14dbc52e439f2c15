"""Calls into apps over HTTP: signed ``invoke`` and ``describe`` requests, and their answers."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
from pydantic import BaseModel, ValidationError

from stepline._signing import sign
from stepline.protocol import SIGNATURE_HEADER, DescribeResponse, InvokeResponse


@dataclass(frozen=True)
class CallResult:
    """An app's answer, or why there was none."""

    ok: bool
    http_status: int | None
    duration_ms: int
    response: BaseModel | None = None
    reason: str = ""


class AppCaller:
    """One keep-alive HTTP client for every app this orchestrator invokes."""

    def __init__(
        self,
        timeout: float,
        *,
        max_connections: int = 64,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=10.0),
            limits=limits,
            follow_redirects=True,
            transport=transport,
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def invoke(self, url: str, secrets: list[str], body: dict[str, Any]) -> CallResult:
        """POST a signed invocation; parse an :class:`InvokeResponse`."""
        return await self._call(url, secrets, body, InvokeResponse)

    async def describe(self, url: str, secrets: list[str]) -> CallResult:
        """Ask the app which workflows it hosts."""
        return await self._call(url, secrets, {"kind": "describe"}, DescribeResponse)

    async def _call(
        self, url: str, secrets: list[str], body: dict[str, Any], model: type[BaseModel]
    ) -> CallResult:
        payload = orjson.dumps(body)
        headers = {
            "content-type": "application/json",
            SIGNATURE_HEADER: sign(payload, secrets[0]),
        }
        started = time.perf_counter()
        try:
            response = await self._client.post(url, content=payload, headers=headers)
        except httpx.TimeoutException:
            return CallResult(False, None, _ms(started), reason="the app did not answer in time")
        except httpx.HTTPError as exc:
            reason = f"could not reach the app ({type(exc).__name__}: {exc or 'no detail'})"
            return CallResult(False, None, _ms(started), reason=reason)
        took = _ms(started)
        if response.status_code >= 300:
            detail = response.text[:200].strip()
            reason = f"the app answered HTTP {response.status_code}" + (
                f": {detail}" if detail else ""
            )
            return CallResult(False, response.status_code, took, reason=reason)
        try:
            parsed = model.model_validate(orjson.loads(response.content))
        except (orjson.JSONDecodeError, ValidationError) as exc:
            reason = (
                f"the app answered HTTP {response.status_code} with a body that is not a "
                f"valid {model.__name__}: {str(exc)[:200]}"
            )
            return CallResult(False, response.status_code, took, reason=reason)
        return CallResult(True, response.status_code, took, parsed)


def _ms(started: float) -> int:
    return int((time.perf_counter() - started) * 1000)
