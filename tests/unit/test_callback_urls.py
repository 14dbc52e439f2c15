"""Signed callback URLs accept exactly the signature they were given, nothing near it."""

from __future__ import annotations

import string

from stepline_server.invoke.urls import CallbackSigner

ALPHABET = string.ascii_letters + string.digits + "-_"


def test_only_the_exact_signature_verifies() -> None:
    """Every other last character is refused, even those that decode to the same bytes."""
    signer = CallbackSigner(["server-secret"])
    cid = "54a0f547-1df8-55cc-8242-355008f9c26f"
    good = signer.signature(cid)
    assert signer.verify(cid, good)
    for ch in ALPHABET.replace(good[-1], ""):
        assert not signer.verify(cid, good[:-1] + ch)
    assert not signer.verify("another-callback", good)


def test_rotation_old_secrets_still_verify() -> None:
    """The newest secret signs; a URL signed before the rotation still completes."""
    old = CallbackSigner(["old"]).signature("cb")
    rotated = CallbackSigner(["new", "old"])
    assert rotated.verify("cb", old) and rotated.verify("cb", rotated.signature("cb"))
    assert rotated.signature("cb") != old
