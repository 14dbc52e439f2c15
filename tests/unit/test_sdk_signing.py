"""Signing of orchestrator-to-app requests: HMAC-SHA256, rotation, replay window."""

from __future__ import annotations

import time

import pytest

from stepline._signing import DEFAULT_MAX_AGE, ReplayGuard, SignatureError, sign, sign_all, verify

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


def test_sign_all_needs_a_secret_and_stamps_now() -> None:
    with pytest.raises(ValueError, match=r"^at least one signing secret is needed$"):
        sign_all(BODY, [])
    header = sign_all(BODY, ["a", "b"])
    assert abs(verify(BODY, header, ["b"]) - time.time()) <= 2


def test_the_timestamp_is_twelve_digits_at_most_and_the_window_inclusive() -> None:
    """A signature exactly ``max_age`` old is accepted, a second more is not; a 12-digit
    timestamp is read (and out of the window), 13 digits are malformed."""
    assert verify(BODY, sign(BODY, "s", NOW), ["s"], now=NOW + DEFAULT_MAX_AGE) == NOW
    assert verify(BODY, sign(BODY, "s", NOW), ["s"], now=NOW - DEFAULT_MAX_AGE) == NOW
    with pytest.raises(SignatureError, match=r"timestamp outside the allowed window$"):
        verify(BODY, sign(BODY, "s", NOW), ["s"], now=NOW + DEFAULT_MAX_AGE + 1)
    with pytest.raises(SignatureError, match=r"timestamp outside the allowed window$"):
        verify(BODY, sign(BODY, "s", 10**11), ["s"], now=NOW)
    with pytest.raises(SignatureError, match=r": malformed timestamp$"):
        verify(BODY, sign(BODY, "s", 10**12), ["s"], now=NOW)
    with pytest.raises(
        SignatureError, match=r": no signing secret is configured \(set STEPLINE_SIGNING_SECRET\)$"
    ):
        verify(BODY, sign(BODY, "s", NOW), [], now=NOW)


def test_only_v1_signatures_count() -> None:
    """A valid MAC under another scheme name is not a ``v1`` signature; a ``v1`` value with
    an ``=`` in it is one that matches nothing."""
    mac = sign(BODY, "s", NOW).split("v1=")[1]
    with pytest.raises(SignatureError, match=r": no v1 signature$"):
        verify(BODY, f"t={NOW},v2={mac}", ["s"], now=NOW)
    with pytest.raises(SignatureError, match=r": no signature matches$"):
        verify(BODY, f"t={NOW},v1={mac}=x", ["s"], now=NOW)


def test_the_replay_guard_forgets_a_body_at_the_end_of_its_window() -> None:
    """A body is new again the instant its window ends; when full, the guard first lets go
    of the bodies whose window has ended (wherever they stand), so a body still inside its
    window is kept."""
    guard = ReplayGuard(max_age=5)
    assert guard.first_time(b"x", now=0.0)
    assert not guard.first_time(b"x", now=9.999)
    assert guard.first_time(b"x", now=10.0)

    small = ReplayGuard(max_age=5, max_entries=4)
    assert small.first_time(b"a", now=0.0)  # until 10
    assert small.first_time(b"b", now=1.0)  # until 11
    assert small.first_time(b"e", now=1.0)  # until 11
    assert small.first_time(b"a", now=10.5)  # new again: until 20.5, still first in line
    assert small.first_time(b"c", now=10.6)
    assert small.first_time(b"d", now=11.0)  # full: b's and e's windows have ended, they go
    assert not small.first_time(b"a", now=12.0)
