"""The egress rules on addresses: which the orchestrator may connect to (no network used)."""

from __future__ import annotations

import ipaddress

import pytest

from stepline_server.engine.egress import Egress, NetworksInvalid, as_address, parse_networks
from stepline_server.settings import from_env

ip = ipaddress.ip_address

GUARDED = ["169.254.169.254", "169.254.0.1", "fe80::1", "fd00:ec2::254", "100.100.100.200"]


@pytest.mark.parametrize("address", [*GUARDED, "::ffff:169.254.169.254"])
def test_link_local_and_metadata_addresses_are_refused_by_default(address: str) -> None:
    """With no networks listed, link-local and cloud metadata addresses (also written as
    IPv4-mapped IPv6) are refused, saying why."""
    refusal = Egress().refusal(ip(address))
    assert refusal is not None and "link-local" in refusal


@pytest.mark.parametrize("address", ["127.0.0.1", "::1", "10.1.2.3", "192.168.0.7", "8.8.8.8"])
def test_every_other_address_is_allowed_by_default(address: str) -> None:
    """With no networks listed, loopback, private and public addresses are allowed."""
    assert Egress().allows(ip(address))


def test_listed_networks_are_the_only_ones_allowed() -> None:
    """With networks listed, an address is allowed only inside one of them (IPv4 and IPv6 each
    need their own)."""
    rules = Egress.of(["10.0.0.0/8", "fd12::/16"])
    assert rules.allows(ip("10.200.0.1")) and rules.allows(ip("fd12::5"))
    for address in ("127.0.0.1", "::1", "11.0.0.1", "fd13::1"):
        refusal = rules.refusal(ip(address))
        assert refusal is not None and "STEPLINE_APP_NETWORKS" in refusal


def test_a_wide_network_does_not_allow_link_local_but_an_explicit_one_does() -> None:
    """0.0.0.0/0 and ::/0 do not allow the link-local or metadata addresses; listing them (or
    a network inside them) does, and only those listed."""
    wide = Egress.of(["0.0.0.0/0", "::/0"])
    assert all(not wide.allows(ip(a)) for a in GUARDED)
    explicit = Egress.of(["169.254.169.254/32", "fe80::/10"])
    assert explicit.allows(ip("169.254.169.254")) and explicit.allows(ip("fe80::9"))
    assert not explicit.allows(ip("169.254.0.1")) and not explicit.allows(ip("127.0.0.1"))


def test_every_address_a_name_resolves_to_must_be_allowed() -> None:
    """A name is refused when any of its addresses is: the first refusal is given."""
    rules = Egress.of(["127.0.0.0/8"])
    assert rules.first_refusal([ip("127.0.0.1"), ip("127.0.0.2")]) is None
    refusal = rules.first_refusal([ip("127.0.0.1"), ip("169.254.169.254")])
    assert refusal is not None and "169.254.169.254" in refusal


def test_hosts_are_read_as_addresses_or_names() -> None:
    """Bracketed IPv6, zone ids and IPv4 are addresses; anything else is a name."""
    assert as_address("[::1]") == ip("::1") and as_address("fe80::1%eth0") == ip("fe80::1")
    assert as_address("127.0.0.1") == ip("127.0.0.1") and as_address("localhost") is None


def test_bad_networks_are_refused_when_read() -> None:
    """A value that is not a CIDR is refused by name, from the environment too; host bits and
    spaces or commas between values are accepted."""
    with pytest.raises(NetworksInvalid, match=r"10\.0\.0\.0/33"):
        parse_networks(["10.0.0.0/33"])
    with pytest.raises(ValueError, match="nope"):
        from_env({"STEPLINE_APP_NETWORKS": "10.0.0.0/8,nope"})
    assert parse_networks(["10.1.2.3/8"]) == (ipaddress.ip_network("10.0.0.0/8"),)
    settings = from_env({"STEPLINE_APP_NETWORKS": "10.0.0.0/8, 127.0.0.1 ::1"})
    assert settings.app_networks == ("10.0.0.0/8", "127.0.0.1", "::1")
