"""Who may do what: the roles of API keys and the role each kind of request needs."""

from __future__ import annotations

ROLE_RANK = {"read": 0, "write": 1, "admin": 2, "owner": 3}
"""Each role allows what the ones below it allow. ``admin`` manages its own environment
(its keys included); ``owner`` manages every environment of its project."""

_READ_METHODS = frozenset({"GET", "HEAD"})


def allows(role: str, needed: str) -> bool:
    """True when a key of ``role`` may do what needs ``needed``."""
    return ROLE_RANK.get(role, -1) >= ROLE_RANK[needed]


def manages_project(role: str) -> bool:
    """May a key of ``role`` make environments and manage the keys of every environment of
    its project? Only ``owner``."""
    return allows(role, "owner")


def may_grant(role: str, granted: str) -> bool:
    """May a key of ``role`` make (or revoke) a key of role ``granted``? An ``admin`` any
    role up to ``admin``, an ``owner`` any."""
    return allows(role, "admin") and ROLE_RANK.get(granted, 99) <= ROLE_RANK[role]


def protected_from(role: str) -> tuple[str, ...]:
    """The roles whose keys a key of ``role`` may not revoke."""
    return tuple(r for r in ROLE_RANK if not may_grant(role, r))


def needed_for(method: str) -> str:
    """The least role a request of ``method`` needs on an ordinary route: reads need
    ``read``, anything else ``write`` (routes for keys and environments ask for ``admin``)."""
    return "read" if method.upper() in _READ_METHODS else "write"
