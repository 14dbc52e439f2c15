"""What every dashboard page shares: the signed-in viewer, the session, forms with CSRF."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from starlette.datastructures import State
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from stepline_server.store import keys
from stepline_server.ui import permissions, render
from stepline_server.ui.session import Session, Sessions

if TYPE_CHECKING:
    from stepline_server.orchestrator import Orchestrator

MAX_FORM = 1024 * 1024 + 16 * 1024  # a 1 MiB JSON body and the form around it


class Shared:
    """The orchestrator's state, and the session signer made from its secrets on first use."""

    def __init__(self, state: State) -> None:
        self.state = state
        self._sessions: Sessions | None = None

    @property
    def orch(self) -> Orchestrator:
        return self.state.orchestrator  # type: ignore[no-any-return]

    async def sessions(self) -> Sessions:
        if self._sessions is None:
            async with self.orch.pool.acquire() as conn:
                self._sessions = Sessions(await keys.server_secrets(conn))
        return self._sessions


@dataclass
class Req:
    """One dashboard request: the request, its session, who is signed in, the form sent."""

    request: Request
    shared: Shared
    session: Session
    viewer: permissions.Viewer | None
    form: dict[str, str]
    fields: list[tuple[str, str]] = field(default_factory=list)  # the form, repeats kept

    def form_values(self, name: str) -> list[str]:
        """Every value the form sent for ``name`` (a field repeated, like ticked boxes)."""
        return [v for k, v in self.fields if k == name]

    @property
    def orch(self) -> Orchestrator:
        return self.shared.orch

    @property
    def pid(self) -> Any:
        assert self.viewer is not None
        return self.viewer.project_id

    def page(self, name: str, status: int = 200, **context: Any) -> Response:
        """A full page (or fragment) with what every template needs."""
        viewer = self.viewer
        return render.page(
            name,
            status,
            csrf=self.session.csrf,
            flash=self.session.take_flash(),
            signed_in=viewer is not None,
            can_write=viewer is not None and permissions.can_write(viewer),
            is_admin=viewer is not None and permissions.is_admin(viewer),
            path=self.request.url.path,
            **context,
        )

    def back(self, url: str, message: str | None = None) -> Response:
        """After an action: say ``message`` on the next page and go to ``url`` (303)."""
        if message:
            self.session.say(message)
        return RedirectResponse(url, 303)


Handler = Callable[[Req], Awaitable[Response]]


async def _form(request: Request) -> list[tuple[str, str]] | None:
    """The url-encoded form's fields in order, or None when it is too large."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM:
            return None
    return parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)


def _form_problem(form: dict[str, str]) -> str | None:
    """Why a form's fields cannot be used (a NUL character, which PostgreSQL cannot store),
    or None; JSON fields are checked where they are read
    (:mod:`stepline_server.application.payloads`)."""
    for name, value in form.items():
        if "\x00" in name or "\x00" in value:
            return f"The field {name[:64]!r} holds a NUL character, which cannot be stored."
    return None


def endpoint(
    shared: Shared, handler: Handler, *, public: bool = False, write: bool = False
) -> Callable[[Request], Awaitable[Response]]:
    """A Starlette endpoint around ``handler``: it loads the session, sends a visitor who is not
    signed in to the sign-in page, refuses a POST without the session's CSRF token (403) and
    a ``write`` action the key may not do (403), and writes the session cookie back."""

    async def run(request: Request) -> Response:
        sessions = await shared.sessions()
        session = sessions.load(request)
        viewer = None
        if session.session_id is not None:
            async with shared.orch.pool.acquire() as conn:
                viewer = await permissions.viewer_of(conn, session.session_id)
            if viewer is None:  # signed out elsewhere, expired, or the key was revoked
                session.renew(None)
        req = Req(request, shared, session, viewer, {})
        response = await _guarded(req, handler, public=public, write=write)
        sessions.save(request, session, response)
        return response

    return run


async def _guarded(req: Req, handler: Handler, *, public: bool, write: bool) -> Response:
    request = req.request
    if req.viewer is None and not public:
        if request.headers.get("hx-request"):
            return Response(status_code=401, headers={"HX-Redirect": "/ui/login"})
        return RedirectResponse("/ui/login", 303)
    if request.method == "POST":
        fields = await _form(request)
        if fields is None:
            return req.page("error.html", 413, title="Too large", message="The form is too large.")
        form = dict(fields)
        if not req.session.csrf_ok(form.get("_csrf")):
            return req.page(
                "error.html",
                403,
                title="Refused",
                message="This form is out of date or was not sent by this dashboard (its CSRF"
                " token does not match). Reload the page and try again.",
            )
        problem = _form_problem(form)
        if problem is not None:
            return req.page("error.html", 422, title="Refused", message=problem)
        req.form, req.fields = form, fields
        if write and (req.viewer is None or not permissions.can_write(req.viewer)):
            return req.page(
                "error.html", 403, title="Refused", message="Your API key may not change anything."
            )
    return await handler(req)
