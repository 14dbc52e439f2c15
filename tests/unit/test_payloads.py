"""The payload codec on its own: round trips, keys, tampering, error texts and sizes."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

import stepline
from stepline import protocol
from stepline._payloads import (
    PAYLOAD_CORRUPT,
    PAYLOAD_KEY_UNKNOWN,
    PayloadError,
    Payloads,
    parse_size,
)

K1, K2 = os.urandom(32), os.urandom(32)


@pytest.mark.parametrize(
    "value", [None, 0, -7, 2**63, 1.5, "tëxt", [1, [2, {"a": None}]], {"k": {"n": True}}]
)
def test_a_value_round_trips_through_its_envelope(value: Any) -> None:
    codec = stepline.Encryption(keys={"k2": K2, "k1": K1})
    envelope = codec.seal(value)
    assert set(envelope) == {"$stepline", "key", "data"}
    assert envelope["$stepline"] == "encrypted" and envelope["key"] == "k2"
    assert protocol.envelope_kind(envelope) == "encrypted"
    assert codec.open(envelope) == value


def test_the_first_key_encrypts_and_every_key_decrypts() -> None:
    old = stepline.Encryption(keys={"k1": K1})
    new = stepline.Encryption(keys={"k2": K2, "k1": K1})
    sealed = old.seal({"a": 1})
    assert sealed["key"] == "k1" and new.open(sealed) == {"a": 1}
    with pytest.raises(PayloadError) as unknown:
        old.open(new.seal({"a": 1}))
    assert unknown.value.code == PAYLOAD_KEY_UNKNOWN and "'k2'" in str(unknown.value)


def test_a_tampered_envelope_or_another_keys_data_is_payload_corrupt() -> None:
    codec = stepline.Encryption(keys={"k1": K1})
    sealed = codec.seal("secret")
    data = bytearray(sealed["data"].encode())
    data[20] = ord("A") if data[20] != ord("A") else ord("B")
    for bad in (
        {**sealed, "data": data.decode()},
        {**sealed, "data": "not base64!"},
        stepline.Encryption(keys={"k1": K2}).seal("secret"),  # same id, another key
    ):
        with pytest.raises(PayloadError) as caught:
            codec.open(bad)
        assert caught.value.code == PAYLOAD_CORRUPT
    text = codec.seal_text("boom")
    with pytest.raises(PayloadError):  # a text is not a JSON value: bound as associated data
        codec.open({"$stepline": "encrypted", "key": "k1", "data": text.rsplit(":", 1)[1]})


def test_random_nonces_for_the_app_and_deterministic_ones_for_client_inputs() -> None:
    codec = stepline.Encryption(keys={"k1": K1})
    assert codec.seal({"a": 1}) != codec.seal({"a": 1})
    assert codec.seal({"a": 1}, deterministic=True) == codec.seal({"a": 1}, deterministic=True)
    assert codec.seal({"a": 1}, deterministic=True) != codec.seal({"a": 2}, deterministic=True)


@pytest.mark.parametrize(
    ("keys", "says"),
    [
        ({}, "needs keys"),
        ({"k": b"short"}, "32 bytes"),
        ({"k": os.urandom(33)}, "32 bytes"),
        ({"k": "0" * 32}, "32 bytes"),
        ({"k": K1.hex()}, "32 bytes"),
        ({"bad id!": K1}, "key id"),
        ({7: K1}, "key id"),
    ],
)
def test_bad_keys_are_refused_clearly(keys: Any, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        stepline.Encryption(keys=keys)


def test_the_key_never_shows_in_its_repr() -> None:
    codec = stepline.Encryption(keys={"k1": K1})
    assert K1.hex() not in repr(codec) and "k1" in repr(codec)


def test_errors_keep_type_and_code_plain_and_their_texts_sealed() -> None:
    payloads = Payloads(stepline.Encryption(keys={"k1": K1}))
    info = protocol.ErrorInfo(type="ValueError", code="bad", message="no", traceback="tb " * 9000)
    sealed = payloads.seal_error(info)
    assert sealed is not None
    assert (sealed.type, sealed.code) == ("ValueError", "bad")
    assert protocol.sealed_text_key(sealed.message) == "k1"
    assert sealed.traceback is not None and len(sealed.traceback.encode()) <= 16 * 1024
    assert payloads.seal_error(sealed) == sealed  # sealed once
    opened = payloads.open_error(sealed)
    assert opened is not None and opened.message == "no"
    assert opened.traceback is not None and (info.traceback or "").endswith(opened.traceback)
    assert protocol.describe_encoded(sealed.message) == "encrypted (key k1)"


def test_plain_values_pass_through_decoding() -> None:
    payloads = Payloads(stepline.Encryption(keys={"k1": K1}))
    for value in ({"a": 1}, [1], "x", None, {"$stepline": "other"}):
        assert payloads.open_now(value) == value
    assert Payloads().open_run_sync({"input": {"a": 1}}) == {"input": {"a": 1}}


def test_sizes_in_words() -> None:
    assert parse_size("256KiB") == 262_144
    assert parse_size("1MB") == 1_000_000
    assert parse_size("1.5 MiB") == 1_572_864
    assert parse_size(100) == 100 and parse_size("100") == 100
    for bad in ("lots", "-1KiB", -1, True):
        with pytest.raises(ValueError):
            parse_size(bad)  # type: ignore[arg-type]


def test_the_sdk_imports_without_cryptography_and_says_which_extra_to_install() -> None:
    script = (
        "import sys; sys.modules['cryptography'] = None; sys.modules['botocore'] = None\n"
        "import stepline\n"
        "for make in (lambda: stepline.Encryption(keys={'k': bytes(32)}),\n"
        "             lambda: stepline.S3Store('bucket-a')):\n"
        "    try:\n"
        "        make()\n"
        "    except ImportError as exc:\n"
        "        print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "pip install 'stepline[encryption]'" in done.stdout
    assert "pip install 'stepline[s3]'" in done.stdout
