"""The failed-authentication limit's rules: which address is the client, and when a failure is
answered 429 or held."""

from __future__ import annotations

from stepline_server.authlimits import AuthFailures, client_address, parse_proxies

PROXIES = parse_proxies(["10.0.0.0/8", "fd00::/8"])


def test_x_forwarded_for_counts_only_from_a_trusted_proxy() -> None:
    """The right-most untrusted hop is the client; from anyone else the header is ignored."""
    assert client_address("10.1.1.1", "198.51.100.7", PROXIES) == "198.51.100.7"
    assert client_address("10.1.1.1", "203.0.113.9, 198.51.100.7, 10.2.2.2", PROXIES) == (
        "198.51.100.7"
    )
    assert client_address("198.51.100.7", "203.0.113.9", PROXIES) == "198.51.100.7"
    assert client_address("10.1.1.1", "10.3.3.3, 10.2.2.2", PROXIES) == "10.3.3.3"
    assert client_address("10.1.1.1", "junk, 198.51.100.7", PROXIES) == "198.51.100.7"
    assert client_address("10.1.1.1", "198.51.100.7, junk", PROXIES) == "10.1.1.1"
    assert client_address("10.1.1.1", "198.51.100.7", ()) == "10.1.1.1"
    assert client_address("fd00::1", "2001:db8::5", PROXIES) == "2001:db8::5"


def test_an_address_past_its_limit_is_told_when_to_come_back() -> None:
    """The 4th failure of a minute (limit 3) is 429 until the 2nd is a minute old."""
    failures = AuthFailures(per_address=3, budget=100, delay=1.0)
    verdicts = [failures.failed("a", now=float(t)) for t in (0, 10, 20, 30)]
    assert [v.retry_after for v in verdicts] == [None, None, None, 40]
    assert all(v.hold == 0 for v in verdicts)
    assert failures.failed("b", now=31.0).retry_after is None
    assert failures.failed("a", now=71.0).retry_after is None  # 0 and 10 are forgotten


def test_past_the_budget_every_failure_is_held_and_refused() -> None:
    """Past the budget over all addresses, a failure from a fresh address is held and 429."""
    failures = AuthFailures(per_address=100, budget=5, delay=1.0)
    for n in range(5):
        assert failures.failed(f"198.51.100.{n}", now=float(n)).retry_after is None
    verdict = failures.failed("198.51.100.99", now=5.0)
    assert verdict.retry_after == 56 and verdict.hold == 1.0
