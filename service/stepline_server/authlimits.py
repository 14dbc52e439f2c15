"""The failed-authentication limit of the API and the dashboard's sign-in.

A request with a valid key is never refused or slowed by it: only failures count, and only
failures are answered differently.

- Per client address: past ``per_address`` failures in a sliding minute, that address's failed
  authentications are answered ``429 rate_limited`` (with ``Retry-After``) instead of ``401``.
- Across all addresses: past ``budget`` failures in a sliding minute (guessing spread over many
  addresses), every failed authentication is held ``delay`` seconds, then answered ``429``; at
  most :data:`MAX_HELD` are held at once, the rest are answered ``429`` at once.

The client address is the connection's peer, or, when the peer is one of ``trusted_proxies``
(CIDRs), the right-most address of ``X-Forwarded-For`` that is not a trusted proxy. Counts are
per orchestrator process.
"""

from __future__ import annotations

import asyncio
import ipaddress
import math
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

MAX_HELD = 100
"""Failed authentications held (slowed) at once past the budget; more are answered at once."""
_MAX_ADDRESSES = 100_000
_WINDOW = 60.0

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_proxies(values: Iterable[str]) -> tuple[Network, ...]:
    """``STEPLINE_TRUSTED_PROXIES``' networks; ValueError naming a bad one."""
    networks = []
    for value in values:
        try:
            networks.append(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError:
            raise ValueError(f"STEPLINE_TRUSTED_PROXIES: {value!r} is not a CIDR") from None
    return tuple(networks)


def client_address(peer: str, forwarded_for: str | None, proxies: tuple[Network, ...]) -> str:
    """Who is calling: ``peer``, unless it is a trusted proxy; then the right-most address of
    ``forwarded_for`` (``X-Forwarded-For``) that is not one (the left-most when all are)."""
    if not proxies or not forwarded_for or not _trusted(peer, proxies):
        return peer
    hops = [h.strip() for h in forwarded_for.split(",") if h.strip()]
    client = peer
    for hop in reversed(hops):
        try:
            ipaddress.ip_address(hop)
        except ValueError:
            return client  # not an address: what lies left of it cannot be trusted
        client = hop
        if not _trusted(hop, proxies):
            return hop
    return client


def _trusted(address: str, proxies: tuple[Network, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip.version == n.version and ip in n for n in proxies)


@dataclass(frozen=True)
class Verdict:
    """How to answer a failed authentication: ``retry_after`` seconds (``None``: a plain 401)
    and ``hold`` seconds to wait before answering."""

    retry_after: int | None
    hold: float = 0.0


class AuthFailures:
    """Failed authentications in a sliding minute, per client address and over all of them."""

    def __init__(
        self,
        per_address: int = 20,
        budget: int = 200,
        delay: float = 1.0,
        proxies: tuple[Network, ...] = (),
    ) -> None:
        self.per_address, self.budget, self.delay, self.proxies = (
            per_address,
            budget,
            delay,
            proxies,
        )
        self._by_address: dict[str, deque[float]] = {}
        self._all: deque[float] = deque(maxlen=max(1, budget + 1))
        self._held = 0

    def client(self, peer: str, forwarded_for: str | None) -> str:
        return client_address(peer, forwarded_for, self.proxies)

    def failed(self, client: str, now: float | None = None) -> Verdict:
        """Count a failure of ``client``; how to answer it."""
        now = time.monotonic() if now is None else now
        if len(self._by_address) > _MAX_ADDRESSES:
            self._by_address.clear()
        seen = self._by_address.setdefault(client, deque(maxlen=max(1, self.per_address + 1)))
        seen.append(now)
        self._all.append(now)
        over_budget = _count(self._all, now) > self.budget
        over_address = _count(seen, now) > self.per_address
        if not over_budget and not over_address:
            return Verdict(None)
        window = seen if over_address else self._all
        limit = self.per_address if over_address else self.budget
        # Until the failure that made it one too many is forgotten.
        wait = max(1, math.ceil(window[-max(1, limit)] + _WINDOW - now))
        hold = self.delay if over_budget and self._held < MAX_HELD else 0.0
        return Verdict(wait, hold)

    async def hold(self, verdict: Verdict) -> None:
        """Wait the verdict's hold (counted against :data:`MAX_HELD`)."""
        if verdict.hold <= 0:
            return
        self._held += 1
        try:
            await asyncio.sleep(verdict.hold)
        finally:
            self._held -= 1


def _count(seen: deque[float], now: float) -> int:
    """Failures within the last minute (older ones are dropped)."""
    while seen and seen[0] <= now - _WINDOW:
        seen.popleft()
    return len(seen)
