"""The layering, read from the source with ``ast``: algorithms/ and tasks/ never import each other or
benchmarks/, nothing imports the command-line entry module, engines never import the command line,
and the import graph (function-level imports included) has no cycle."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("algorithms", "tasks", "benchmarks")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def _resolve(name: str, modules: dict) -> str | None:
    """The project module an import statement names (the longest known prefix), or None for a library."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in modules:
            return candidate
    return None


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from pkg import sub` names the submodule when there is one, else the package
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module for a in node.names]
            else:
                continue
            edges |= {t for t in (_resolve(x, modules) for x in targets) if t and t != name}
        graph[name] = edges
    return graph


def test_the_graph_sees_the_layout():
    graph = import_graph()
    assert "benchmarks.cli.main" in graph and "benchmarks.harness.loop" in graph and "algorithms.grpo" in graph
    assert "benchmarks.harness.loop" in graph["benchmarks.cli.run"] or "benchmarks.harness.config" in graph["benchmarks.cli.run"]


def test_algorithms_and_tasks_stand_alone():
    for name, edges in import_graph().items():
        if name.startswith("algorithms"):
            assert not [e for e in edges if not e.startswith("algorithms")], (name, edges)
        if name.startswith("tasks"):
            assert not [e for e in edges if not e.startswith("tasks")], (name, edges)


def test_nothing_imports_the_command_line():
    for name, edges in import_graph().items():
        assert "benchmarks.cli.main" not in edges, name
        if not name.startswith("benchmarks.cli"):
            assert not [e for e in edges if e.startswith("benchmarks.cli")], (name, edges)


def test_no_import_cycles():
    graph = import_graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_a_planted_cycle_is_caught(tmp_path, monkeypatch):
    """The cycle check can fail: a graph with a -> b -> a is refused."""
    import pytest

    monkeypatch.setattr(__import__(__name__), "import_graph", lambda: {"a": {"b"}, "b": {"a"}})
    with pytest.raises(AssertionError, match="import cycle"):
        test_no_import_cycles()
