"""Where the orchestrator may send requests: the egress rules as plain functions on addresses.

``STEPLINE_APP_NETWORKS`` lists the networks (CIDRs) app URLs may point to. Without it every
address is allowed except the link-local ones (169.254.0.0/16, fe80::/10) and the cloud metadata
addresses, which are refused unless a listed network lies inside them: ``0.0.0.0/0`` does not
allow 169.254.169.254, ``169.254.169.254/32`` does. Addresses are checked after DNS resolution,
so a name is only as good as every address it resolves to.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Refused unless listed: link-local ranges (169.254.169.254, the metadata service of AWS, GCP,
# Azure and others, is one) and the metadata addresses outside them.
GUARDED: tuple[IPNetwork, ...] = (
    ipaddress.ip_network("169.254.0.0/16"),
    ipaddress.ip_network("fe80::/10"),
    ipaddress.ip_network("fd00:ec2::254/128"),  # AWS's IPv6 metadata service
    ipaddress.ip_network("100.100.100.200/32"),  # Alibaba Cloud's metadata service
)

LOOPBACK: tuple[str, ...] = ("127.0.0.0/8", "::1/128")
"""The networks ``stepline dev`` adds, so its own example app can always be called."""


class NetworksInvalid(ValueError):
    """A listed network is not a CIDR."""


def parse_networks(values: Iterable[str]) -> tuple[IPNetwork, ...]:
    """``values`` (``"10.0.0.0/8"``, ``"::1"``, …) as networks; NetworksInvalid names a bad one.

    Host bits are allowed (``10.1.2.3/8`` is ``10.0.0.0/8``)."""
    networks = []
    for value in values:
        try:
            networks.append(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError:
            raise NetworksInvalid(f"{value!r} is not a network (CIDR) or an address") from None
    return tuple(networks)


def as_address(host: str) -> IPAddress | None:
    """``host`` as an IP address (brackets and an IPv6 zone allowed), else None for a name."""
    text = host.strip("[]").split("%", 1)[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _plain(address: IPAddress) -> IPAddress:
    """An IPv4 address written as IPv6 (``::ffff:169.254.169.254``) as the IPv4 address it is."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _contains(network: IPNetwork, address: IPAddress) -> bool:
    return network.version == address.version and address in network


def _inside(network: IPNetwork, guarded: IPNetwork) -> bool:
    return network.version == guarded.version and network.subnet_of(guarded)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Egress:
    """The networks app URLs may point to (empty: every address but the guarded ones)."""

    networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def of(cls, values: Iterable[str]) -> Egress:
        """The rules for ``STEPLINE_APP_NETWORKS``'s values; NetworksInvalid for a bad one."""
        return cls(parse_networks(values))

    def refusal(self, address: IPAddress) -> str | None:
        """Why the orchestrator must not connect to ``address``, or None when it may."""
        address = _plain(address)
        guard = next((g for g in GUARDED if _contains(g, address)), None)
        if guard is not None:
            if any(_contains(n, address) and _inside(n, guard) for n in self.networks):
                return None
            return f"{address} is a link-local or cloud metadata address (not allowed)"
        if not self.networks or any(_contains(n, address) for n in self.networks):
            return None
        return f"{address} is outside the networks apps may use (STEPLINE_APP_NETWORKS)"

    def allows(self, address: IPAddress) -> bool:
        """True when the orchestrator may connect to ``address``."""
        return self.refusal(address) is None

    def first_refusal(self, addresses: Iterable[IPAddress]) -> str | None:
        """Why one of ``addresses`` (all a name resolved to) is refused, or None if none is."""
        return next((r for r in map(self.refusal, addresses) if r is not None), None)
