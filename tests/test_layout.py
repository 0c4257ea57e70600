"""The layering, read from the source with ``ast``: algorithms/ and tasks/ never import each other or
benchmarks/, nothing imports the command-line entry module, engines never import the command line nor
argparse, the report reads run data and nothing below it imports the report, only the reference adapters
(benchmarks/references/) import a reference framework, and the import graph (function-level imports included)
has no cycle."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("algorithms", "tasks", "benchmarks")
# What the report may read: its own modules, run files (io, the store) and the markdown writer beside io.
REPORT_READS = ("benchmarks.report", "benchmarks.io", "benchmarks.markdown", "benchmarks.errors", "benchmarks.store",
                "benchmarks.curve")
# The layers the report sits on, beside the command line: none of them imports it.
BELOW_THE_REPORT = ("benchmarks.harness", "benchmarks.matrix", "benchmarks.checks", "benchmarks.perf", "algorithms", "tasks")
# The reference frameworks' packages: their configs, trainers and functions are reached through the adapters.
REFERENCE_FRAMEWORKS = ("trl", "verl", "openrlhf")


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


def _within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def _imported_names(path: Path) -> set[str]:
    """Every module an import statement of ``path`` names, libraries included."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


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


def test_only_the_command_line_sees_argparse():
    """Flags become typed settings in benchmarks/cli; an engine takes those settings, never a Namespace."""
    for name, path in _modules().items():
        if not _within(name, ("benchmarks.cli",)):
            assert not [n for n in _imported_names(path) if _within(n, ("argparse",))], name


def test_a_planted_argparse_import_is_caught(tmp_path, monkeypatch):
    planted = tmp_path / "engine.py"
    planted.write_text("def settings():\n    import argparse\n")
    monkeypatch.setattr(sys.modules[__name__], "_modules", lambda: {"benchmarks.harness.engine": planted})
    with pytest.raises(AssertionError, match="benchmarks.harness.engine"):
        test_only_the_command_line_sees_argparse()


def test_only_the_reference_adapters_import_the_frameworks():
    """A check or a bench builds TRL's config and trainer through benchmarks/references/trl.py (one mapping of our
    names to TRL's), never with ``from trl import GRPOConfig`` of its own."""
    for name, path in _modules().items():
        if not _within(name, ("benchmarks.references",)):
            assert not [n for n in _imported_names(path) if _within(n, REFERENCE_FRAMEWORKS)], name


def test_a_planted_framework_import_is_caught(tmp_path, monkeypatch):
    planted = tmp_path / "bench.py"
    planted.write_text("def args():\n    from trl import GRPOConfig\n    return GRPOConfig(output_dir='x')\n")
    monkeypatch.setattr(sys.modules[__name__], "_modules", lambda: {"benchmarks.perf.bench": planted})
    with pytest.raises(AssertionError, match="benchmarks.perf.bench"):
        test_only_the_reference_adapters_import_the_frameworks()


def test_the_report_reads_run_data_and_sits_on_top():
    for name, edges in import_graph().items():
        if _within(name, ("benchmarks.report",)):
            assert not [e for e in edges if not _within(e, REPORT_READS)], (name, edges)
        if _within(name, BELOW_THE_REPORT):
            assert not [e for e in edges if _within(e, ("benchmarks.report",))], (name, edges)


@pytest.mark.parametrize("graph", [{"benchmarks.report.matrix": {"benchmarks.harness.loop"}},
                                   {"benchmarks.matrix.execute": {"benchmarks.report.matrix"}}],
                         ids=["report-imports-the-harness", "the-matrix-imports-the-report"])
def test_a_planted_report_import_is_caught(graph, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "import_graph", lambda: graph)
    with pytest.raises(AssertionError):
        test_the_report_reads_run_data_and_sits_on_top()


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
    monkeypatch.setattr(sys.modules[__name__], "import_graph", lambda: {"a": {"b"}, "b": {"a"}})
    with pytest.raises(AssertionError, match="import cycle"):
        test_no_import_cycles()
