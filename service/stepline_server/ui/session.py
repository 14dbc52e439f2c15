"""The dashboard's session cookie: signed (itsdangerous), ``HttpOnly``, ``SameSite=Strict``.

It carries a CSRF token every form sends back, a message to show once after an action, and,
once signed in, the opaque id of a server-side session (:mod:`stepline_server.store.sessions`:
the row says which key signed in). Nothing secret travels in it: not the key, not its stored
form, never a key made on the Keys page. The cookie is signed with the orchestrator's own
secrets (kept in the database, so every orchestrator reads it alike).
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
MAX_AGE = 12 * 3600  # seconds a cookie lasts after its last action (the session row too)


@dataclass
class Session:
    """What the cookie carries; ``changed`` when it must be written again."""

    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    session_id: str | None = None
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

    def renew(self, session_id: str | None) -> None:
        """A new identity (signed in as ``session_id``, or out): a fresh CSRF token with it."""
        self.session_id, self.csrf = session_id, secrets.token_urlsafe(24)
        self.changed = True


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
                sid = data.get("s")
                return Session(
                    csrf=str(data["c"]),
                    session_id=sid if isinstance(sid, str) else None,
                    flash=data.get("f"),
                )
            except (BadSignature, KeyError, TypeError):
                pass
        return Session(changed=True)

    def save(self, request: Request, session: Session, response: Response) -> None:
        """Write the cookie when the session changed (or a signed-in one, to extend it)."""
        if not session.changed and session.session_id is None:
            return
        value = self._s.dumps({"c": session.csrf, "s": session.session_id, "f": session.flash})
        response.set_cookie(
            COOKIE,
            value,
            max_age=MAX_AGE,
            path="/ui",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
