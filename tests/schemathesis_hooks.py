"""Schemathesis hooks for the fuzz test: no generated app URL can name a host to resolve.

Every ``url`` a request body carries (an app's, or an alert's ``destination.url``, in JSON or
in the dashboard's form) is kept only when it cannot make the orchestrator look a name up or
connect anywhere but loopback (not a string, no ``://``, or an address literal); otherwise it
is replaced by ``http://127.0.0.1:9/fuzz`` (the discard port, where nothing answers). The
orchestrator under test also lists only 127.0.0.1/32 in STEPLINE_APP_NETWORKS.
A pull app's poll is made not to wait (a long poll would outlast the request timeout).

For the dashboard's forms (tests/e2e/dashboard_forms.yaml), every request carries the signed-in
session's cookie and every form its CSRF token (``STEPLINE_FUZZ_UI_COOKIE`` and
``STEPLINE_FUZZ_UI_CSRF``, when set), and :func:`no_accepted_nonfinite` checks that JSON holding
NaN or Infinity is never accepted, by the API or by a form.
"""

from __future__ import annotations

import json
import math
import os
import zlib
from typing import Any
from urllib.parse import urlsplit

import schemathesis

from stepline_server.engine.egress import as_address
from tests.dashboard_forms import cookie_payload

SAFE_URL = "http://127.0.0.1:9/fuzz"


def safe_url(value: Any) -> Any:
    """``value`` unchanged when it cannot lead to a DNS lookup, else :data:`SAFE_URL`."""
    if not isinstance(value, str) or "://" not in value:
        return value
    try:
        host = urlsplit(value).hostname
    except ValueError:
        return value  # refused before any lookup
    if host is None or as_address(host) is not None:
        return value
    return SAFE_URL


UI_COOKIE = os.environ.get("STEPLINE_FUZZ_UI_COOKIE", "")
UI_CSRF = os.environ.get("STEPLINE_FUZZ_UI_CSRF", "")
JSON_FIELDS = ("data", "body")  # the forms' JSON fields (an event's data, a callback's body)


def _non_finite(value: Any) -> bool:
    """True when decoded JSON holds NaN or an infinity anywhere (walked without recursion)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _lenient(text: Any) -> Any:
    """``text`` decoded as Python's json module would (NaN, Infinity, 1e400 as floats)."""
    if not isinstance(text, str):
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _flash(response: Any) -> str:
    """The one-time message the dashboard's answer put in its cookie."""
    headers = response.headers.get("set-cookie") or []
    for header in [headers] if isinstance(headers, str) else headers:
        try:
            payload = cookie_payload(header.split("=", 1)[-1].split(";", 1)[0])
        except (ValueError, zlib.error):
            continue
        if isinstance(payload, dict) and isinstance(payload.get("f"), str):
            return str(payload["f"])
    return ""


@schemathesis.hook
def before_call(ctx: Any, case: Any, **kwargs: Any) -> None:
    if str(case.path).startswith("/ui/") and UI_COOKIE:
        case.headers = {**(case.headers or {}), "cookie": UI_COOKIE}
        if case.method.upper() == "POST":
            if not isinstance(case.body, dict):
                case.body = {}
                case.media_type = "application/x-www-form-urlencoded"
            case.body["_csrf"] = UI_CSRF
    if isinstance(case.body, dict) and "url" in case.body:
        case.body["url"] = safe_url(case.body["url"])
    destination = case.body.get("destination") if isinstance(case.body, dict) else None
    if isinstance(destination, dict) and "url" in destination:  # an alert's
        destination["url"] = safe_url(destination["url"])
    if isinstance(case.body, dict) and "destination.url" in case.body:  # the alert form's
        case.body["destination.url"] = safe_url(case.body["destination.url"])
    if str(case.path).endswith("/poll"):
        # A pull app's poll answers at once, not after its wait (30 s when none is given,
        # longer than the request timeout).
        case.query = {**(case.query if isinstance(case.query, dict) else {}), "wait": "0s"}


@schemathesis.check
def no_500(ctx: Any, response: Any, case: Any) -> bool | None:
    """No answer is 500 (a documented 502 or 503 is the contract's, checked by its status)."""
    if response.status_code == 500:
        raise AssertionError(f"500 Internal Server Error: {response.text[:500]}")
    return None


@schemathesis.check
def no_accepted_nonfinite(ctx: Any, response: Any, case: Any) -> bool | None:
    """JSON holding NaN or Infinity is refused: by the API (never a 2xx) and by a dashboard
    form (its message says it was not done)."""
    body = case.body if isinstance(case.body, dict | list) else None
    if str(case.path).startswith("/ui/"):
        if case.method.upper() != "POST" or not isinstance(body, dict):
            return None
        for field in JSON_FIELDS:
            if _non_finite(_lenient(body.get(field))):
                said = _flash(response)
                location = response.headers.get("location") or ""
                to_sign_in = "/ui/login" in str(location)  # not signed in: nothing was done
                if response.status_code < 400 and not to_sign_in and not said.startswith("Not "):
                    raise AssertionError(f"the form took {field}={body[field]!r}: {said!r}")
        return None
    if body is not None and _non_finite(body) and 200 <= response.status_code < 300:
        raise AssertionError(f"a non-finite number was accepted: {response.status_code}")
    return None
