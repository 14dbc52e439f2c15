"""The SDK's JSON helpers behave the same with orjson and with the standard library."""

from __future__ import annotations

import pytest

from stepline import _json


@pytest.fixture(params=["orjson", "stdlib"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "stdlib":
        monkeypatch.setattr(_json, "orjson", None)
    return str(request.param)


def test_round_trip_normalises_to_json(backend: str) -> None:
    """Tuples become lists, int keys become strings, and the size is reported."""
    value, size = _json.round_trip({"a": (1, 2), 3: "é"})
    assert value == {"a": [1, 2], "3": "é"}
    assert size == len(_json.dumps({"a": [1, 2], "3": "é"}))


def test_non_json_values_raise(backend: str) -> None:
    """Sets and arbitrary objects are not JSON: TypeError (or ValueError)."""
    with pytest.raises((TypeError, ValueError)):
        _json.dumps({1, 2})
    with pytest.raises((TypeError, ValueError)):
        _json.dumps(object())


def test_loads_rejects_invalid_json(backend: str) -> None:
    """Invalid JSON raises ValueError."""
    with pytest.raises(ValueError):
        _json.loads(b"{nope")
