"""Signing of orchestrator-to-app requests: HMAC-SHA256, rotation, replay window."""

from __future__ import annotations

import pytest

from stepline._signing import SignatureError, sign, sign_all, verify

BODY = b'{"kind":"describe"}'
NOW = 1_700_000_000


def test_good_signature_verifies() -> None:
    """A header made by sign() with the same secret verifies and returns its timestamp."""
    header = sign(BODY, "s3cret", timestamp=NOW)
    assert header.startswith(f"t={NOW},v1=")
    assert verify(BODY, header, ["s3cret"], now=NOW + 10) == NOW


def test_forged_signature_is_rejected() -> None:
    """A different secret or a changed body does not verify."""
    header = sign(BODY, "attacker", timestamp=NOW)
    with pytest.raises(SignatureError) as info:
        verify(BODY, header, ["s3cret"], now=NOW)
    assert info.value.reason == "no signature matches"
    good = sign(BODY, "s3cret", timestamp=NOW)
    with pytest.raises(SignatureError):
        verify(BODY + b" ", good, ["s3cret"], now=NOW)


def test_stale_signature_is_rejected() -> None:
    """A timestamp more than max_age away from now is rejected, in either direction."""
    header = sign(BODY, "s3cret", timestamp=NOW)
    with pytest.raises(SignatureError, match="window"):
        verify(BODY, header, ["s3cret"], now=NOW + 301)
    with pytest.raises(SignatureError, match="window"):
        verify(BODY, header, ["s3cret"], now=NOW - 301)
    assert verify(BODY, header, ["s3cret"], max_age=600, now=NOW + 500) == NOW


def test_rotation_every_secret_verifies_and_several_v1_are_accepted() -> None:
    """During rotation the old secret still verifies, and any of several v1 values may match."""
    old = sign(BODY, "old", timestamp=NOW)
    assert verify(BODY, old, ["new", "old"], now=NOW) == NOW
    both = sign_all(BODY, ["newer", "old"], timestamp=NOW)
    assert both.count("v1=") == 2
    assert verify(BODY, both, ["old"], now=NOW) == NOW
    assert verify(BODY, both, ["newer"], now=NOW) == NOW


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        (None, "missing"),
        ("", "missing"),
        ("garbage", "malformed header"),
        ("t=abc,v1=00", "malformed timestamp"),
        ("v1=00", "no timestamp"),
        (f"t={NOW}", "no v1 signature"),
    ],
)
def test_malformed_headers_carry_a_reason(header: str | None, reason: str) -> None:
    """Missing or malformed headers raise SignatureError with the reason as an attribute."""
    with pytest.raises(SignatureError) as info:
        verify(BODY, header, ["s3cret"], now=NOW)
    assert info.value.reason == reason


def test_no_secret_configured_rejects_everything() -> None:
    """Without any secret nothing verifies (the app must not run unsigned work)."""
    with pytest.raises(SignatureError, match="no signing secret"):
        verify(BODY, sign(BODY, "x", timestamp=NOW), [], now=NOW)
