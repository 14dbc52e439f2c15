"""The form of a URL the orchestrator calls (an app's, an alert destination's), before DNS:
what is refused and why, and the ASCII form a valid one is sent in."""

from __future__ import annotations

import pytest

from stepline_server.engine.egress import MAX_URL, app_url


@pytest.mark.parametrize(
    ("given", "sent"),
    [
        ("https://example.com", "https://example.com"),
        ("https://EXAMPLE.com/Path", "https://example.com/Path"),  # a host is case-free
        ("http://host:65535", "http://host:65535"),
        ("http://host:1/", "http://host:1/"),
        ("http://[::1]:9000/a", "http://[::1]:9000/a"),
        ("http://[0:0::1]/", "http://[::1]/"),  # an IPv6 address in its short form
        (
            "http://münchen.example:80/pä?q=ü#f",
            "http://xn--mnchen-3ya.example:80/p%C3%A4?q=%C3%BC#f",
        ),
        ("https://user:pä@h.example/x", "https://user:p%C3%A4@h.example/x"),
        ("http://a-b.c_d.example/", "http://a-b.c_d.example/"),
    ],
)
def test_a_valid_url_is_sent_in_ascii(given: str, sent: str) -> None:
    assert app_url(given) == sent


@pytest.mark.parametrize(
    ("given", "why"),
    [
        ("http://a b", "the URL must not contain whitespace or control characters"),
        ("http://\x07x", "the URL must not contain whitespace or control characters"),
        ("http://x\u00a0y", "the URL must not contain whitespace or control characters"),
        ("ftp://x", "the URL must start with http:// or https://"),
        ("x", "the URL must start with http:// or https://"),
        ("http://x:0", "the URL's port must be a whole number from 1 to 65535"),
        ("http://x:65536", "the URL's port must be a whole number from 1 to 65535"),
        ("http://x:abc", "the URL's port must be a whole number from 1 to 65535"),
        ("http://", "the URL needs a host"),
        ("http://:80/", "the URL needs a host"),
        ("http://[::1", "the URL is not valid: Invalid IPv6 URL"),
        ("http://a_b!/", "the host 'a_b!' is not a valid host name or IPv6 address"),
        (
            "http://[zz::1]/",
            "the URL is not valid: 'zz::1' does not appear to be an IPv4 or IPv6 address",
        ),
        (
            "http://" + "a" * 64 + ".com",
            f"the host {'a' * 64 + '.com'!r} is not a valid host name or IPv6 address",
        ),
        ("http://a..b/", "the host 'a..b' is not a valid host name or IPv6 address"),
    ],
)
def test_a_url_that_cannot_be_called_is_refused_saying_why(given: str, why: str) -> None:
    with pytest.raises(ValueError) as refused:
        app_url(given)
    assert str(refused.value) == why


def test_the_length_is_counted_once_encoded() -> None:
    """MAX_URL (2,048) characters pass; one more is refused, counted after percent-encoding."""
    base = "http://x.example/"
    assert MAX_URL == 2048
    assert app_url(base + "a" * (MAX_URL - len(base))) == base + "a" * (MAX_URL - len(base))
    with pytest.raises(ValueError, match="longer than 2048 characters once encoded"):
        app_url(base + "a" * (MAX_URL - len(base) + 1))
    # one é is six characters once encoded (%C3%A9): 2,043 of them would fit as characters
    with pytest.raises(ValueError, match="once encoded"):
        app_url(base + "é" * ((MAX_URL - len(base)) // 6 + 1))
    assert app_url(base + "é" * ((MAX_URL - len(base)) // 6)).endswith("%C3%A9")
