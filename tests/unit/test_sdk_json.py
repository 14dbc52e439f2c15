"""The SDK's one JSON encoding: the same values in, the same bytes out, orjson or not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stepline import _json

ROOT = Path(__file__).resolve().parents[2]

# Encodes each case and prints the outcomes; run here and in a process where orjson is blocked.
CASES = """
import datetime, json, uuid
from stepline import _json

def outcome(value):
    try:
        return ["ok", _json.dumps(value).decode()]
    except (TypeError, ValueError) as exc:
        return [type(exc).__name__, str(exc)]

UTC = datetime.timezone.utc
cases = {
    "datetime": datetime.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=UTC),
    "naive": datetime.datetime(2024, 1, 2, 3, 4, 5),
    "date": datetime.date(2024, 1, 2),
    "time": datetime.time(3, 4, 5),
    "uuid": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "nan": float("nan"),
    "inf": {"x": float("inf")},
    "big": 2**70,
    "negative big": -(2**64) - 1,
    "set": {1, 2},
    "object": object(),
    "keys": {2: "a", None: "b", True: "c", 1.5: "d"},
    "tuple key": {(1, 2): "x"},
    "text": ["é", "✓", 1.5, None, True],
}
OUTCOMES = json.dumps({name: outcome(value) for name, value in cases.items()})
"""


def outcomes(block_orjson: bool) -> dict[str, list[str]]:
    if not block_orjson:
        scope: dict[str, Any] = {}
        exec(CASES, scope)
        return json.loads(scope["OUTCOMES"])
    code = "import sys\nsys.modules['orjson'] = None\n" + CASES + "\nprint(OUTCOMES)"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def with_orjson() -> dict[str, list[str]]:
    return outcomes(block_orjson=False)


def test_orjson_does_not_change_the_encoding(with_orjson: dict[str, list[str]]) -> None:
    """Every case encodes (or is refused) identically with orjson importable and blocked."""
    assert with_orjson == outcomes(block_orjson=True)


def test_dates_times_and_uuids_become_iso_8601_and_uuid_strings(
    with_orjson: dict[str, list[str]],
) -> None:
    """datetime, date and time encode as ISO 8601 strings, a UUID as its string."""
    assert with_orjson["datetime"] == ["ok", '"2024-01-02T03:04:05.000006+00:00"']
    assert with_orjson["naive"] == ["ok", '"2024-01-02T03:04:05"']
    assert with_orjson["date"] == ["ok", '"2024-01-02"']
    assert with_orjson["time"] == ["ok", '"03:04:05"']
    assert with_orjson["uuid"] == ["ok", '"12345678-1234-5678-1234-567812345678"']


def test_nan_and_infinity_are_refused(with_orjson: dict[str, list[str]]) -> None:
    """NaN and Infinity are not JSON: ValueError, never null or a bare literal."""
    assert with_orjson["nan"][0] == "ValueError"
    assert with_orjson["inf"][0] == "ValueError"


def test_integers_of_any_size_keep_their_value(with_orjson: dict[str, list[str]]) -> None:
    """Integers past 64 bits are written exactly and read back equal, but a result holding one
    is refused (the orchestrator could not keep it exact), as are NUL and deep nesting."""
    assert with_orjson["big"] == ["ok", str(2**70)]
    assert with_orjson["negative big"] == ["ok", str(-(2**64) - 1)]
    assert _json.round_trip(2**64 - 1)[0] == 2**64 - 1
    for bad in (2**70, {"a": "\x00"}, {"\x00": 1}, _nested(65)):
        with pytest.raises(ValueError):
            _json.round_trip(bad)
    assert _json.round_trip(_nested(63))[1] > 0


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def test_other_types_are_refused_with_their_name(with_orjson: dict[str, list[str]]) -> None:
    """A set or an arbitrary object raises TypeError naming its type."""
    kind, message = with_orjson["set"]
    assert kind == "TypeError" and "type set is not JSON serialisable" in message
    kind, message = with_orjson["object"]
    assert kind == "TypeError" and "type object is not JSON serialisable" in message


def test_dict_keys_follow_the_json_module(with_orjson: dict[str, list[str]]) -> None:
    """int, None, bool and float keys become strings; a tuple key is refused."""
    assert with_orjson["keys"] == ["ok", '{"2":"a","null":"b","true":"c","1.5":"d"}']
    assert with_orjson["tuple key"][0] == "TypeError"


def test_output_is_compact_utf8(with_orjson: dict[str, list[str]]) -> None:
    """No spaces, non-ASCII characters written as themselves."""
    assert with_orjson["text"] == ["ok", '["é","✓",1.5,null,true]']
    assert _json.dumps("é") == '"é"'.encode()


def test_round_trip_normalises_to_json() -> None:
    """Tuples become lists, int keys become strings, and the size is reported."""
    value, size = _json.round_trip({"a": (1, 2), 3: "é"})
    assert value == {"a": [1, 2], "3": "é"}
    assert size == len(_json.dumps({"a": [1, 2], "3": "é"}))


def test_loads_rejects_invalid_json() -> None:
    """Invalid JSON, NaN literals included, raises ValueError."""
    with pytest.raises(ValueError):
        _json.loads(b"{nope")
    with pytest.raises(ValueError, match="NaN"):
        _json.loads(b"[NaN]")
    assert _json.loads(b'{"a": [1, 2]}') == {"a": [1, 2]}
