"""openapi.yaml: a valid OpenAPI 3.1 document that describes exactly the orchestrator's routes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

SPEC_PATH = Path(__file__).resolve().parents[2] / "openapi.yaml"
HTTP_METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")
IGNORED_METHODS = {"HEAD", "OPTIONS"}
CAMEL_CASE = re.compile(r"^[a-z][a-zA-Z0-9]*$")


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    """The parsed openapi.yaml."""
    with SPEC_PATH.open(encoding="utf-8") as f:
        loaded = yaml.safe_load(f)
    assert isinstance(loaded, dict), "openapi.yaml must be a YAML mapping"
    return loaded


def _operations(spec: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any], list[Any]]]:
    """Yield (path, METHOD, operation, path-level parameters) for every operation."""
    for path, item in spec["paths"].items():
        for method in HTTP_METHODS:
            if method in item:
                yield path, method.upper(), item[method], item.get("parameters", [])


def _spec_routes(spec: dict[str, Any]) -> set[tuple[str, str]]:
    """The (path, METHOD) pairs the spec documents, HEAD and OPTIONS left out."""
    return {(p, m) for p, m, _, _ in _operations(spec) if m not in IGNORED_METHODS}


def _property_names(node: Any, where: str = "") -> Iterator[tuple[str, str]]:
    """Yield (location, name) for every property of every schema anywhere in ``node``."""
    if isinstance(node, dict):
        props = node.get("properties")
        if isinstance(props, dict):
            for name in props:
                yield where, name
        for key, value in node.items():
            yield from _property_names(value, f"{where}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _property_names(value, f"{where}/{i}")


def test_spec_is_valid_openapi_3_1(spec: dict[str, Any]) -> None:
    """openapi.yaml parses as YAML and validates as an OpenAPI 3.1 document."""
    from openapi_spec_validator import OpenAPIV31SpecValidator, validate

    assert str(spec["openapi"]).startswith("3.1"), spec["openapi"]
    validate(spec, cls=OpenAPIV31SpecValidator)


def test_routes_match_the_orchestrator(spec: dict[str, Any]) -> None:
    """The spec documents exactly the orchestrator's (path, method) pairs, no more, no fewer."""
    from stepline_server.api.app import route_table

    served = {
        (path, method.upper())
        for path, methods in route_table()
        for method in methods
        if method.upper() not in IGNORED_METHODS
    }
    documented = _spec_routes(spec)

    def fmt(pairs: set[tuple[str, str]]) -> str:
        return "\n".join(f"    {m:7} {p}" for p, m in sorted(pairs)) or "    (none)"

    assert served == documented, (
        "openapi.yaml and the orchestrator's routes differ.\n"
        f"  served but not documented:\n{fmt(served - documented)}\n"
        f"  documented but not served:\n{fmt(documented - served)}"
    )


def test_operations_have_id_summary_and_client_errors(spec: dict[str, Any]) -> None:
    """Every operation has a unique operationId and a summary, and a 4xx when it takes input."""
    problems: list[str] = []
    seen: dict[str, str] = {}
    for path, method, op, path_params in _operations(spec):
        where = f"{method} {path}"
        op_id = op.get("operationId")
        if not op_id:
            problems.append(f"{where}: no operationId")
        elif op_id in seen:
            problems.append(f"{where}: operationId {op_id!r} also used by {seen[op_id]}")
        else:
            seen[op_id] = where
        if not op.get("summary"):
            problems.append(f"{where}: no summary")
        takes_input = bool(path_params or op.get("parameters") or op.get("requestBody"))
        codes = [str(code) for code in op.get("responses", {})]
        if takes_input and not any(re.fullmatch(r"4\d\d|4XX", c) for c in codes):
            problems.append(f"{where}: takes input but documents no 4xx response")
    assert not problems, "\n".join(problems)


def test_schema_properties_are_camel_case(spec: dict[str, Any]) -> None:
    """Every schema property name in the spec is camelCase."""
    bad = [
        f"{where}: {name}" for where, name in _property_names(spec) if not CAMEL_CASE.match(name)
    ]
    assert not bad, "properties not in camelCase:\n" + "\n".join(bad)
