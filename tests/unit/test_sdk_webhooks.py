"""stepline.verify_webhook: an alert's signed notification is accepted with its secret and
refused when forged, altered, unsigned or too old."""

from __future__ import annotations

import json

import pytest

import stepline
from stepline._signing import sign

BODY = json.dumps({"id": "n1", "type": "run.failed"}).encode()
NOW = 1_800_000_000


def test_a_signed_notification_is_answered_as_json() -> None:
    """The body signed with the alert's secret is accepted, as bytes or text, with one secret
    or a list holding it."""
    header = sign(BODY, "whsec_a", NOW)
    assert stepline.verify_webhook(BODY, header, "whsec_a", now=NOW) == {
        "id": "n1",
        "type": "run.failed",
    }
    assert stepline.verify_webhook(BODY.decode(), header, ["whsec_old", "whsec_a"], now=NOW)


@pytest.mark.parametrize(
    ("body", "header", "secret", "now"),
    [
        (BODY, sign(BODY, "whsec_a", NOW), "whsec_b", NOW),  # another secret
        (BODY + b" ", sign(BODY, "whsec_a", NOW), "whsec_a", NOW),  # altered body
        (BODY, None, "whsec_a", NOW),  # unsigned
        (BODY, "t=1,v1=00", "whsec_a", NOW),  # garbage
        (BODY, sign(BODY, "whsec_a", NOW - 301), "whsec_a", NOW),  # too old
        (b"[1]", sign(b"[1]", "whsec_a", NOW), "whsec_a", NOW),  # not a notification
    ],
)
def test_anything_else_is_refused(body: bytes, header: str | None, secret: str, now: int) -> None:
    """Each is a SignatureError, a stepline.SteplineError."""
    with pytest.raises(stepline.SteplineError):
        stepline.verify_webhook(body, header, secret, now=now)
