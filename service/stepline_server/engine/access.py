"""Who may do what: the roles of API keys and the role each kind of request needs."""

from __future__ import annotations

ROLE_RANK = {"read": 0, "write": 1, "admin": 2}
"""Each role allows what the ones below it allow."""

_READ_METHODS = frozenset({"GET", "HEAD"})


def allows(role: str, needed: str) -> bool:
    """True when a key of ``role`` may do what needs ``needed``."""
    return ROLE_RANK.get(role, -1) >= ROLE_RANK[needed]


def needed_for(method: str) -> str:
    """The least role a request of ``method`` needs on an ordinary route: reads need
    ``read``, anything else ``write`` (routes for keys and environments ask for ``admin``)."""
    return "read" if method.upper() in _READ_METHODS else "write"
