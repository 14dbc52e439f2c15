"""DNS resolution under the egress rules: the address an app's connection is made to.

A name is resolved once per new connection and every address it resolves to is checked
(:mod:`stepline_server.engine.egress`); the connection is then made to the first of them, so
a DNS answer cannot change between the check and the call.
"""

from __future__ import annotations

import asyncio
import socket
from urllib.parse import urlsplit

from stepline import wire
from stepline_server.engine.egress import Egress, IPAddress, as_address

RESOLVE_SECONDS = 10.0
"""How long a registration waits for DNS (a call's own timeout bounds it otherwise)."""


class Resolver:
    """Resolves app hosts and refuses the addresses the egress rules do not allow."""

    def __init__(self, egress: Egress) -> None:
        self.egress = egress

    async def addresses(self, host: str) -> list[IPAddress]:
        """Every address ``host`` names (itself when it is one); HttpError when none."""
        literal = as_address(host)
        if literal is not None:
            return [literal]
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, None, type=socket.SOCK_STREAM
            )
        except (OSError, UnicodeError) as exc:
            raise wire.HttpError(f"the host {host} could not be resolved ({exc})") from None
        found: list[IPAddress] = []
        for info in infos:
            address = as_address(str(info[4][0]))
            if address is not None and address not in found:
                found.append(address)
        if not found:
            raise wire.HttpError(f"the host {host} resolved to no address")
        return found

    async def connect_address(self, host: str, port: int) -> str:
        """The address to connect to for ``host`` (the hook of :class:`stepline.wire.HttpClient`);
        HttpError when the host does not resolve or an address it resolves to is refused."""
        found = await self.addresses(host)
        refusal = self.egress.first_refusal(found)
        if refusal is not None:
            raise wire.HttpError(f"refused to connect to {host}: {refusal}")
        return str(found[0])

    async def refusal(self, url: str) -> str | None:
        """Why the orchestrator would not call ``url`` (an http(s) URL), or None if it would."""
        host = urlsplit(url).hostname
        if not host:
            return "the URL needs a host"
        try:
            async with asyncio.timeout(RESOLVE_SECONDS):
                await self.connect_address(host, 0)
        except wire.HttpError as exc:
            return str(exc)
        except TimeoutError:
            return f"the host {host} could not be resolved in time"
        return None
