"""Sends alert notifications: a webhook gets the notification's JSON signed with the alert's
secret (``Stepline-Signature``, the invocations' scheme); Slack gets ``{"text": ...}``.

Its own keep-alive client, apart from the one that invokes apps, under the same egress rules
(:mod:`.resolve`): a receiver that hangs holds one of its connections until the attempt's
timeout, and nothing of the run loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from stepline import wire
from stepline.protocol import SIGNATURE_HEADER
from stepline.wire import sign
from stepline_server.engine import alerts as rules
from stepline_server.engine.egress import Egress
from stepline_server.invoke.resolve import Resolver

MAX_ANSWER_BYTES = 64 * 1024
"""A receiver's answer is not read past this (only its status counts)."""
NOTIFICATION_HEADER = "stepline-notification-id"


@dataclass(frozen=True)
class Sent:
    """One attempt's outcome: delivered on a 2xx answer."""

    delivered: bool
    http_status: int | None
    error: str | None


class AlertSender:
    """POSTs notifications to their destinations."""

    def __init__(
        self,
        egress: Egress | None = None,
        *,
        timeout: float = rules.SEND_TIMEOUT_SECONDS,
        max_connections: int = 16,
    ) -> None:
        self.resolver = Resolver(egress or Egress())
        self._http = wire.HttpClient(
            timeout=timeout,
            max_idle=max_connections,
            resolve=self.resolver.connect_address,
            max_body=MAX_ANSWER_BYTES,
            same_origin_redirects=True,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def send(
        self, destination_type: str, url: str, secret: str, body: dict[str, Any]
    ) -> Sent:
        """One attempt at delivering ``body`` (a notification's JSON) to the destination."""
        headers = {"content-type": "application/json", NOTIFICATION_HEADER: body["id"]}
        if destination_type == rules.DestinationType.SLACK:
            payload = orjson.dumps(rules.slack_body(body))
        else:
            payload = orjson.dumps(body)
            headers[SIGNATURE_HEADER] = sign(payload, secret)
        try:
            answer = await self._http.post(url, payload, headers, follow_redirects=True)
        except wire.HttpError as exc:
            reason = str(exc)
            if reason == "timed out":
                reason = "the receiver did not answer in time"
            return Sent(False, None, rules.attempt_error(None, reason))
        if 200 <= answer.status < 300:
            return Sent(True, answer.status, None)
        return Sent(False, answer.status, rules.attempt_error(answer.status, ""))
