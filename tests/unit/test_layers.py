"""The orchestrator's imports keep to its layers: nothing private of the SDK, no dashboard code
reaching into the command line or the API, no API code reaching into the dashboard, the
dispatcher or the batcher (both go through the application layer), and no import circles."""

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


def test_the_dashboard_imports_nothing_of_the_command_line_or_the_api() -> None:
    """The dashboard (``ui``) borrows nothing from the orchestrator's or the SDK's CLI, nor
    from the API: what both need is in ``application``."""
    refused = ("stepline_server.cli", "stepline.cli", "stepline_server.api")
    assert _offending(SERVICE / "ui", refused) == []


def test_the_api_does_not_mount_the_dashboard() -> None:
    """``stepline_server.asgi`` mounts both; the API does not import the dashboard."""
    assert _offending(SERVICE / "api", ("stepline_server.ui",)) == []


def test_the_application_layer_imports_neither_the_api_nor_the_dashboard() -> None:
    refused = ("stepline_server.api", "stepline_server.ui", "stepline_server.cli")
    assert _offending(SERVICE / "application", refused) == []


_LOOPS = ("dispatcher", "batcher", "scheduler", "operations.wake", "alerts.wake", "gatherer")


def test_the_api_and_the_dashboard_reach_no_loop_directly() -> None:
    """Waking the dispatcher (or the scheduler, the operations and alerts loops), taking a run
    at once and applying progress are use cases of ``application``; the routes and pages drive
    no loop of the orchestrator."""
    found = sorted(
        f"{path.relative_to(SERVICE)}:{n}"
        for folder in ("api", "ui")
        for path in (SERVICE / folder).rglob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if any(f"{loop}." in line for loop in _LOOPS)
    )
    assert found == []


def _graph() -> dict[str, set[str]]:
    """Each orchestrator module and the orchestrator modules it imports (anywhere in it)."""
    modules = {}
    for path in SERVICE.rglob("*.py"):
        parts = ("stepline_server", *path.relative_to(SERVICE).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return {
        name: {
            target
            for imported in _imports(path)
            for target in (imported, imported.rpartition(".")[0])
            if target in modules and target != name
        }
        for name, path in modules.items()
    }


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, in a ring or directly (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles_outside_the_store() -> None:
    """No modules of the orchestrator import each other (at the top or inside a function),
    the store aside."""
    circles = [c for c in _circles(_graph()) if not all(".store." in m for m in c)]
    assert circles == []


def test_the_circle_check_finds_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
