"""The orchestrator's imports keep to its layers: nothing private of the SDK, no dashboard code
reaching into the command line."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SERVICE = Path(__file__).resolve().parents[2] / "service" / "stepline_server"


def _imports(path: Path) -> Iterator[str]:
    """Every module ``path`` imports, as dotted names (``from a import b`` gives ``a.b``)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def _offending(folder: Path, refused: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{path.relative_to(SERVICE)}: {name}"
        for path in folder.rglob("*.py")
        for name in _imports(path)
        if any(name == r or name.startswith(r) for r in refused)
    )


def test_the_orchestrator_imports_only_the_sdks_public_modules() -> None:
    """No module of the orchestrator imports one of the SDK's private modules (``stepline._x``):
    what it needs is public (``stepline.wire``, ``stepline.protocol``, ``stepline.cli``)."""
    assert _offending(SERVICE, ("stepline._",)) == []


def test_the_dashboard_imports_nothing_of_the_command_line() -> None:
    """The dashboard (``ui``) borrows nothing from the orchestrator's or the SDK's CLI."""
    assert _offending(SERVICE / "ui", ("stepline_server.cli", "stepline.cli")) == []
