"""Where the orchestrator may send requests: the egress rules as plain functions on addresses,
and the form a URL it calls must have (:func:`app_url`).

``STEPLINE_APP_NETWORKS`` lists the networks (CIDRs) app URLs may point to. Without it every
address is allowed except the link-local ones (169.254.0.0/16, fe80::/10) and the cloud metadata
addresses, which are refused unless a listed network lies inside them: ``0.0.0.0/0`` does not
allow 169.254.169.254, ``169.254.169.254/32`` does. Addresses are checked after DNS resolution,
so a name is only as good as every address it resolves to.
"""

from __future__ import annotations

import ipaddress
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import quote, urlsplit, urlunsplit

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


# The URLs the orchestrator calls (apps, alert destinations): their form, before DNS.
MAX_URL = 2048
_HOST = re.compile(r"^[A-Za-z0-9._-]+$")


def _ascii(text: str) -> str:
    """``text`` with each non-ASCII character percent-encoded (as UTF-8)."""
    return "".join(c if c.isascii() else quote(c, safe="") for c in text)


def _host(hostname: str, bracketed: bool) -> str:
    """The host as sent in a request: IDNA for a name, brackets around an IPv6 address."""
    try:
        if bracketed:
            return f"[{ipaddress.IPv6Address(hostname)}]"
        host = hostname.encode("idna").decode("ascii")
    except (ValueError, UnicodeError):  # UnicodeError: an empty or over-long label
        host = ""
    if not host or not _HOST.match(host):
        raise ValueError(f"the host {hostname!r} is not a valid host name or IPv6 address")
    return host


def app_url(value: str) -> str:
    """``value`` as a URL the orchestrator can call, or ValueError saying why it cannot.

    http or https, a host and a port from 1 to 65535, no whitespace or control characters. A
    non-ASCII host is written in its IDNA form and other non-ASCII characters percent-encoded,
    since an HTTP request line and Host header carry ASCII only.
    """
    if any(c.isspace() or unicodedata.category(c) == "Cc" for c in value):
        raise ValueError("the URL must not contain whitespace or control characters")
    try:
        parts = urlsplit(value)
    except ValueError as exc:  # e.g. an unclosed or invalid [IPv6] host
        raise ValueError(f"the URL is not valid: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError("the URL must start with http:// or https://")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        raise ValueError("the URL's port must be a whole number from 1 to 65535")
    if not parts.hostname:
        raise ValueError("the URL needs a host")
    userinfo, _, hostport = parts.netloc.rpartition("@")
    netloc = _host(parts.hostname, hostport.startswith("["))
    if port is not None:
        netloc += f":{port}"
    if userinfo:
        netloc = f"{_ascii(userinfo)}@{netloc}"
    url = urlunsplit(
        (parts.scheme, netloc, _ascii(parts.path), _ascii(parts.query), _ascii(parts.fragment))
    )
    if len(url) > MAX_URL:
        raise ValueError(f"the URL is longer than {MAX_URL} characters once encoded")
    return url
