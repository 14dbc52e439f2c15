"""Request signing: ``Stepline-Signature: t=<unix seconds>,v1=<hex>`` (HMAC-SHA256).

The MAC covers ``f"{t}.".encode() + body``. A list of secrets supports rotation: the first
(newest) signs, every one verifies. Comparison is constant-time and ``max_age`` bounds replays.
The orchestrator imports :func:`sign` from here, so both ends share one definition.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Sequence

from stepline._errors import SignatureError

__all__ = ["SignatureError", "sign", "sign_all", "verify"]

DEFAULT_MAX_AGE = 300


def _mac(body: bytes, secret: str, timestamp: int) -> str:
    message = f"{timestamp}.".encode() + body
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def sign(body: bytes, secret: str, timestamp: int | None = None) -> str:
    """Return the header value signing ``body`` with ``secret`` at ``timestamp`` (default now)."""
    t = int(time.time()) if timestamp is None else int(timestamp)
    return f"t={t},v1={_mac(body, secret, t)}"


def sign_all(body: bytes, secrets: Sequence[str], timestamp: int | None = None) -> str:
    """Return a header value with one ``v1`` per secret (for a key rotation in progress)."""
    if not secrets:
        raise ValueError("at least one signing secret is needed")
    t = int(time.time()) if timestamp is None else int(timestamp)
    return f"t={t}," + ",".join(f"v1={_mac(body, s, t)}" for s in secrets)


def _parse(header: str) -> tuple[int, list[str]]:
    timestamp: int | None = None
    macs: list[str] = []
    for part in header.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep:
            raise SignatureError("malformed header")
        if key == "t":
            try:
                timestamp = int(value)
            except ValueError:
                raise SignatureError("malformed timestamp") from None
        elif key == "v1":
            macs.append(value.strip().lower())
    if timestamp is None:
        raise SignatureError("no timestamp")
    if not macs:
        raise SignatureError("no v1 signature")
    return timestamp, macs


def verify(
    body: bytes,
    header: str | None,
    secrets: Sequence[str],
    max_age: int = DEFAULT_MAX_AGE,
    now: float | None = None,
) -> int:
    """Check ``header`` against ``body``; return its timestamp or raise :class:`SignatureError`.

    Accepted when any ``v1`` matches any secret and ``t`` is within ``max_age`` seconds of
    ``now`` (either side, to tolerate clock skew).
    """
    if not secrets:
        raise SignatureError("no signing secret is configured (set STEPLINE_SIGNING_SECRET)")
    if not header:
        raise SignatureError("missing")
    timestamp, macs = _parse(header)
    current = time.time() if now is None else now
    if abs(current - timestamp) > max_age:
        raise SignatureError("timestamp outside the allowed window")
    matched = False
    for secret in secrets:
        expected = _mac(body, secret, timestamp)
        for candidate in macs:
            # No early exit: every comparison runs, each in constant time.
            matched |= hmac.compare_digest(expected, candidate)
    if not matched:
        raise SignatureError("no signature matches")
    return timestamp
