"""Schemathesis hooks for the fuzz test: no generated app URL can name a host to resolve.

Every ``url`` a request body carries (an app's, or an alert's ``destination.url``) is kept
only when it cannot make the orchestrator look a name up or connect anywhere but loopback (not
a string, no ``://``, or an address literal); otherwise it is replaced by
``http://127.0.0.1:9/fuzz`` (the discard port, where nothing answers). The orchestrator under
test also lists only 127.0.0.1/32 in STEPLINE_APP_NETWORKS.
A pull app's poll is made not to wait (a long poll would outlast the request timeout).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import schemathesis

from stepline_server.engine.egress import as_address

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


@schemathesis.hook
def before_call(ctx: Any, case: Any, **kwargs: Any) -> None:
    if isinstance(case.body, dict) and "url" in case.body:
        case.body["url"] = safe_url(case.body["url"])
    destination = case.body.get("destination") if isinstance(case.body, dict) else None
    if isinstance(destination, dict) and "url" in destination:  # an alert's
        destination["url"] = safe_url(destination["url"])
    if str(case.path).endswith("/poll") and isinstance(case.query, dict) and "wait" in case.query:
        case.query["wait"] = "0s"  # a pull app's poll answers at once, not after its wait


@schemathesis.check
def no_500(ctx: Any, response: Any, case: Any) -> bool | None:
    """No answer is 500 (a documented 502 or 503 is the contract's, checked by its status)."""
    if response.status_code == 500:
        raise AssertionError(f"500 Internal Server Error: {response.text[:500]}")
    return None
