"""The dashboard's session: a signed cookie (itsdangerous), ``HttpOnly``, ``SameSite=Strict``.

It holds the stored form of the signed-in API key (never the key itself), a CSRF token every
form carries back, and a message to show once after an action. The cookie is signed with the
orchestrator's own secrets (kept in the database, so every orchestrator reads it alike).
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass, field
from typing import Any

from itsdangerous import BadSignature, URLSafeTimedSerializer
from starlette.requests import Request
from starlette.responses import Response

COOKIE = "stepline_session"
MAX_AGE = 12 * 3600  # seconds a session lasts after its last action


@dataclass
class Session:
    """What the cookie carries; ``changed`` when it must be written again."""

    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    key_hash: str | None = None
    flash: str | None = None
    changed: bool = False

    def say(self, message: str) -> None:
        """Show ``message`` on the next page."""
        self.flash, self.changed = message, True

    def take_flash(self) -> str | None:
        message, self.flash = self.flash, None
        if message is not None:
            self.changed = True
        return message

    def csrf_ok(self, token: str | None) -> bool:
        return token is not None and hmac.compare_digest(token.encode(), self.csrf.encode())


class Sessions:
    """Reads and writes sessions with a serializer over the server secrets (newest signs)."""

    def __init__(self, server_secrets: list[str]) -> None:
        # itsdangerous signs with the last key and verifies with all; ours are newest first.
        self._s = URLSafeTimedSerializer(list(reversed(server_secrets)), salt="stepline-ui")

    def load(self, request: Request) -> Session:
        raw = request.cookies.get(COOKIE)
        if raw:
            try:
                data: dict[str, Any] = self._s.loads(raw, max_age=MAX_AGE)
                return Session(csrf=str(data["c"]), key_hash=data.get("k"), flash=data.get("f"))
            except (BadSignature, KeyError, TypeError):
                pass
        return Session(changed=True)

    def save(self, request: Request, session: Session, response: Response) -> None:
        """Write the cookie when the session changed (or a signed-in one, to extend it)."""
        if not session.changed and session.key_hash is None:
            return
        value = self._s.dumps({"c": session.csrf, "k": session.key_hash, "f": session.flash})
        response.set_cookie(
            COOKIE,
            value,
            max_age=MAX_AGE,
            path="/ui",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
