"""The dashboard's forms over real HTTP, as a browser without JavaScript sends them: a session
cookie, the page's CSRF token in every form, redirects followed to the page a person sees."""

from __future__ import annotations

import base64
import html
import json
import re
import zlib
from typing import Any

import httpx

_CSRF = re.compile(r'name="_csrf" value="([^"]+)"')
_FLASH = re.compile(r'<p class="flash" role="status">(.*?)</p>', re.S)


class Dashboard:
    """A person at the dashboard of the orchestrator at ``url``."""

    def __init__(self, url: str) -> None:
        self.http = httpx.AsyncClient(base_url=url, follow_redirects=True, timeout=20)
        self.csrf = ""

    async def __aenter__(self) -> Dashboard:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.http.aclose()

    def _keep_csrf(self, page: httpx.Response) -> None:
        found = _CSRF.search(page.text)
        if found:
            self.csrf = html.unescape(found.group(1))

    async def get(self, path: str, **kw: Any) -> httpx.Response:
        page = await self.http.get(path, **kw)
        self._keep_csrf(page)
        return page

    async def post(self, path: str, **fields: str) -> httpx.Response:
        """Send a form of the dashboard (with the CSRF token of the last page seen)."""
        page = await self.http.post(path, data={"_csrf": self.csrf, **fields})
        self._keep_csrf(page)
        return page

    async def sign_in(self, key: str) -> httpx.Response:
        await self.get("/ui/login")
        return await self.post("/ui/login", key=key)

    @staticmethod
    def flash(page: httpx.Response) -> str:
        """The message the page shows after an action ("" when none)."""
        found = _FLASH.search(page.text)
        return html.unescape(found.group(1)) if found else ""


def cookie_payload(value: str) -> Any:
    """What a signed (not encrypted) itsdangerous cookie says: ``payload.time.signature``, the
    payload base64 JSON, zlib-compressed when it starts with a dot."""
    value = value.strip('"')
    compressed = value.startswith(".")
    data = value.lstrip(".").split(".")[0]
    raw = base64.urlsafe_b64decode(data + "=" * (-len(data) % 4))
    return json.loads(zlib.decompress(raw) if compressed else raw)
