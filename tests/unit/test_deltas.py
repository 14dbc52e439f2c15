"""Who may be sent a history delta: the protocol an answer or a poll declares, and a refusal."""

from __future__ import annotations

from stepline.protocol import DELTAS_PROTOCOL_VERSION, PROTOCOL_VERSION
from stepline_server.engine import deltas


def test_only_an_sdk_that_declared_a_protocol_reading_deltas_gets_them() -> None:
    assert deltas.reads_deltas(PROTOCOL_VERSION)
    assert deltas.reads_deltas(DELTAS_PROTOCOL_VERSION)
    assert not deltas.reads_deltas(DELTAS_PROTOCOL_VERSION - 1)  # deltas of the older form
    assert not deltas.reads_deltas(1)
    assert not deltas.reads_deltas(None)  # an SDK from before answers declared it


def test_a_protocol_header_declares_a_version_or_nothing() -> None:
    assert deltas.declared("3") == 3
    assert deltas.declared(" 12 ") == 12
    for header in (None, "", "three", "3.0", "-3", "9" * 40):
        assert deltas.declared(header) is None


def test_only_a_delta_refused_as_invalid_is_sent_again_whole_at_once() -> None:
    assert deltas.refused(True, 422)
    assert not deltas.refused(False, 422)  # a whole history refused: a delivery failure
    for status in (None, 400, 401, 409, 500, 503):
        assert not deltas.refused(True, status)
