"""Calls into apps over HTTP: signed ``invoke`` and ``describe`` requests, and their answers.

Invocations go through the SDK's lean keep-alive client (:mod:`stepline.wire`, far cheaper per
request than httpx); a given httpx transport replaces it, so tests can call an app in process
(and with it the network, so the egress rules do not apply to it). Every connection is made to
an address the egress rules allow (:mod:`.resolve`), redirects are followed within the same
origin only, and an answer over :data:`MAX_ANSWER_BYTES` is cut off.
What an app answered is quoted back only when it speaks the protocol (the SDK's
``Stepline-Protocol`` header) and is the SDK's own JSON error, and briefly: an app's URL may
point at a service whose answers must not reach the caller. Any other answer is reported by
its status and a fixed sentence.
"""

from __future__ import annotations

import email.utils
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson
from pydantic import BaseModel, ValidationError

from stepline import wire
from stepline.protocol import (
    PROTOCOL_HEADER,
    SIGNATURE_HEADER,
    DescribeResponse,
    InvokeResponse,
)
from stepline.wire import sign
from stepline_server.engine.egress import Egress
from stepline_server.invoke.resolve import Resolver

MAX_ANSWER_BYTES = 16 * 1024 * 1024
"""Longer answers are cut off and count as delivery failures."""
QUOTE_CHARS = 200
"""The most of an app's error answer a reason quotes."""


@dataclass(frozen=True)
class CallResult:
    """An app's answer, or why there was none."""

    ok: bool
    http_status: int | None
    duration_ms: int
    response: BaseModel | None = None
    reason: str = ""
    retry_after: float | None = None  # seconds, from the answer's Retry-After
    sent_bytes: int = 0  # the size of the signed body POSTed
    # An answer that speaks the protocol but is not valid for its model: its JSON, for a sync
    # to say which of the app's fields is wrong (None otherwise).
    invalid_answer: Any = None


class AppCaller:
    """One keep-alive HTTP client for every app this orchestrator invokes."""

    def __init__(
        self,
        timeout: float,
        *,
        describe_timeout: float = 10.0,
        max_connections: int = 64,
        transport: httpx.AsyncBaseTransport | None = None,
        egress: Egress | None = None,
    ) -> None:
        self._describe_timeout = describe_timeout
        self.resolver = Resolver(egress or Egress())
        self._fast = wire.HttpClient(
            timeout=timeout,
            max_idle=max_connections,
            resolve=self.resolver.connect_address,
            max_body=MAX_ANSWER_BYTES,
            same_origin_redirects=True,
        )
        self._client: httpx.AsyncClient | None = None
        if transport is not None:
            self._client = httpx.AsyncClient(
                timeout=timeout, follow_redirects=True, transport=transport
            )

    async def aclose(self) -> None:
        await self._fast.aclose()
        if self._client is not None:
            await self._client.aclose()

    async def _post(
        self, url: str, payload: bytes, headers: dict[str, str], timeout: float | None
    ) -> tuple[int, bytes, dict[str, str]]:
        """POST (within ``timeout`` seconds, default the invocation timeout); answer the
        status, the body and the headers (names lower-cased)."""
        if self._client is None:
            answer = await self._fast.post(
                url, payload, headers, follow_redirects=True, timeout=timeout
            )
            return answer.status, answer.body, answer.headers
        try:
            extra: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
            response = await self._client.post(url, content=payload, headers=headers, **extra)
        except httpx.TimeoutException:
            raise wire.HttpError("timed out") from None
        except httpx.HTTPError as exc:
            raise wire.HttpError(f"{type(exc).__name__}: {exc or 'no detail'}") from None
        return response.status_code, response.content, dict(response.headers)

    async def invoke(
        self,
        url: str,
        secrets: list[str],
        body: dict[str, Any],
        headers: dict[str, str] | None = None,
    ) -> CallResult:
        """POST a signed invocation (with extra ``headers``: trace context); parse an
        :class:`InvokeResponse`."""
        return await self._call(url, secrets, body, InvokeResponse, extra=headers)

    async def describe(self, url: str, secrets: list[str]) -> CallResult:
        """Ask the app which workflows it hosts, giving up after the describe timeout (a sync
        is a person waiting, not a workflow step)."""
        return await self._call(
            url, secrets, {"kind": "describe"}, DescribeResponse, self._describe_timeout
        )

    async def _call(
        self,
        url: str,
        secrets: list[str],
        body: dict[str, Any],
        model: type[BaseModel],
        timeout: float | None = None,
        extra: dict[str, str] | None = None,
    ) -> CallResult:
        payload = orjson.dumps(body)
        headers = {
            **(extra or {}),
            "content-type": "application/json",
            SIGNATURE_HEADER: sign(payload, secrets[0]),
        }
        started = time.perf_counter()
        try:
            status, content, answered = await self._post(url, payload, headers, timeout)
        except wire.HttpError as exc:
            if str(exc) == "timed out":
                reason = "the app did not answer in time"
            else:
                reason = f"could not reach the app ({exc})"
            return CallResult(False, None, _ms(started), reason=reason, sent_bytes=len(payload))
        took = _ms(started)
        speaks = PROTOCOL_HEADER in answered
        if status >= 300:
            retry_after = parse_retry_after(answered.get("retry-after"))
            reason = refusal_reason(status, sdk_error(content) if speaks else None, speaks)
            return CallResult(
                False, status, took, reason=reason, retry_after=retry_after,
                sent_bytes=len(payload),
            )  # fmt: skip
        try:
            parsed = model.model_validate_json(content)
        except ValidationError as exc:
            if not speaks:
                reason = f"the app answered HTTP {status} with {NOT_THE_SDK}"
                return CallResult(False, status, took, reason=reason)
            # Which fields were wrong, never their values: those are the app's answer.
            wrong = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}"
                for e in exc.errors(include_url=False, include_input=False, include_context=False)
            )
            reason = (
                f"the app answered HTTP {status} with a body that is not a "
                f"valid {model.__name__} ({wrong[:QUOTE_CHARS]})"
            )
            return CallResult(
                False, status, took, reason=reason, sent_bytes=len(payload),
                invalid_answer=_json_or_none(content),
            )  # fmt: skip
        return CallResult(True, status, took, parsed, sent_bytes=len(payload))


def _json_or_none(content: bytes) -> Any:
    """``content`` decoded as JSON; None when it is not JSON."""
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        return None


NOT_THE_SDK = (
    "an answer that is not the Stepline SDK's (is the URL the one the SDK's handler is mounted at?)"
)
BAD_SIGNATURE = (
    "the app refused the request's signature: its STEPLINE_SIGNING_SECRET does not match the"
    " app's signing secret here. Set it to the signingSecret that registering the app (or"
    " POST /v1/apps/{app}/rotate-secret) answered, restart the app, then sync again"
)


def refusal_reason(status: int, detail: str | None, speaks: bool) -> str:
    """Why a call failed with HTTP ``status``: the SDK's error (``detail``) quoted when the
    answer speaks the protocol, a fixed sentence otherwise; a refused signature says how to fix
    it."""
    if not speaks:
        return f"the app answered HTTP {status} with {NOT_THE_SDK}"
    if status == 401 and detail is not None and "no signature matches" in detail:
        return f"{BAD_SIGNATURE} (HTTP 401: {detail})"
    return f"the app answered HTTP {status}" + (f": {detail}" if detail else "")


def sdk_error(content: bytes) -> str | None:
    """``code: message`` (at most :data:`QUOTE_CHARS` characters) when ``content`` is the SDK's
    JSON error (``{"error": {"code": …, "message": …}}``), else None: any other answer is not
    quoted at all."""
    if len(content) > 64 * 1024:
        return None
    try:
        payload = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(payload, dict) or set(payload) != {"error"}:
        return None
    error = payload["error"]
    if not isinstance(error, dict) or not set(error) <= {"code", "message", "details"}:
        return None
    code, message = error.get("code"), error.get("message")
    if not isinstance(code, str) or not isinstance(message, str):
        return None
    return f"{code}: {message}"[:QUOTE_CHARS]


def _ms(started: float) -> int:
    return int((time.perf_counter() - started) * 1000)


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (a number of seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - datetime.now(UTC)).total_seconds())
