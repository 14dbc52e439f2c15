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

__all__ = ["ReplayGuard", "SignatureError", "sign", "sign_all", "verify"]

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
        value = value.strip()
        if key == "t":
            # Unix seconds: at most 12 digits, so no arithmetic on it can overflow.
            if not (value.isascii() and value.isdigit() and len(value) <= 12):
                raise SignatureError("malformed timestamp")
            timestamp = int(value)
        elif key == "v1" and value.isascii():
            macs.append(value.lower())
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


class ReplayGuard:
    """Bodies already accepted within ``max_age`` seconds: the same signed body (a captured
    invocation sent again) is refused. Kept in memory, per process."""

    def __init__(self, max_age: int = DEFAULT_MAX_AGE, max_entries: int = 100_000) -> None:
        self.max_age = max_age
        self.max_entries = max_entries
        self._seen: dict[bytes, float] = {}

    def first_time(self, body: bytes, now: float | None = None) -> bool:
        """True the first time ``body`` is seen within the window (and remember it)."""
        current = time.monotonic() if now is None else now
        if len(self._seen) >= self.max_entries:
            self._seen = {k: t for k, t in self._seen.items() if t > current}
            if len(self._seen) >= self.max_entries:
                self._seen.pop(next(iter(self._seen)))
        digest = hashlib.sha256(body).digest()
        until = self._seen.get(digest)
        if until is not None and until > current:
            return False
        # Twice the window: the signature's timestamp may be max_age either side of now.
        self._seen[digest] = current + 2 * self.max_age
        return True
