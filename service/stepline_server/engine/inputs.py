"""Whether a run's input fits its workflow's declared input schema (typed workflows)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import jsonschema
import orjson

from stepline import protocol


@lru_cache(maxsize=256)
def _validator(schema_json: bytes) -> Any:
    schema = orjson.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)  # a broken schema (an unknown type) would fail the check itself
    return cls(schema)


def input_problems(schema: dict[str, Any] | None, value: Any) -> dict[str, str]:
    """The fields of ``value`` that break ``schema`` (``input.<path>`` → why); empty when it
    fits, or when the workflow declares no schema. A schema that is itself broken checks
    nothing (the app's SDK validates again when the run is invoked), and so is an input the
    client encrypted or stored (``{"$stepline": ...}``): the app checks it once decoded."""
    if not isinstance(schema, dict) or protocol.envelope_kind(value) is not None:
        return {}
    try:
        validator = _validator(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS))
    except (jsonschema.SchemaError, TypeError, ValueError):
        return {}
    problems: dict[str, str] = {}
    for error in sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path)):
        path = ".".join(str(p) for p in ("input", *error.absolute_path))
        problems.setdefault(path, error.message)
    return problems
