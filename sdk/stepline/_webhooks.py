"""Checking an alert's webhook notification: its ``Stepline-Signature`` header, made with the
alert's secret in the invocations' scheme (:mod:`stepline._signing`), and its JSON body."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from stepline._errors import SignatureError
from stepline._signing import DEFAULT_MAX_AGE, verify


def verify_webhook(
    body: bytes | str,
    signature: str | None,
    secret: str | Sequence[str],
    *,
    max_age: int = DEFAULT_MAX_AGE,
    now: float | None = None,
) -> dict[str, Any]:
    """Check a notification an alert POSTed to a webhook and answer its JSON
    (``{id, type, at, alert, project, environment, run?, schedule?, app?}``).

    ``body`` is the request's raw body, ``signature`` its ``Stepline-Signature`` header and
    ``secret`` the alert's (or several, during a change of alert). A notification is sent
    again until it is answered with a 2xx, always with the same ``id``: use it to ignore one
    already handled. Raises ``SignatureError`` (a ``stepline.SteplineError``) when the
    signature is missing, forged or older than ``max_age`` seconds.
    """
    raw = body.encode() if isinstance(body, str) else bytes(body)
    secrets = [secret] if isinstance(secret, str) else list(secret)
    verify(raw, signature, secrets, max_age=max_age, now=now)
    try:
        payload = json.loads(raw)
    except ValueError:
        raise SignatureError("the signed body is not JSON") from None
    if not isinstance(payload, dict):
        raise SignatureError("the signed body is not a notification")
    return payload
