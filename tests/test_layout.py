"""The layering, read from the source with ``ast``: algorithms/ and tasks/ never import each other or
benchmarks/, nothing imports the command-line entry module, engines never import the command line nor
argparse, the report reads run data and nothing below it imports the report, only the reference adapters
(benchmarks/references/) import a reference framework, and the import graph (function-level imports included)
has no cycle. And the tests mirror the code: tests/benchmarks/report/test_claims.py tests benchmarks/report/claims.py,
and only the few checks of the project as a whole sit at tests/ itself.

What counts as an import: every ``import X`` and absolute ``from X import Y`` statement, at module level or inside a
function (a function-local import still ties the two modules together; it only defers the cost), resolved to the
longest project module it names; ``from pkg import sub`` names the submodule where there is one. Relative imports
are not read (the project has none)."""

from __future__ import annotations

import ast
import shutil
import sys
from pathlib import Path
from typing import Iterator, Optional

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The reference frameworks' packages: their configs, trainers and functions are reached through the adapters.
REFERENCE_FRAMEWORKS = ("trl", "verl", "openrlhf")

# --- the layering: the packages read, and the rules the tests below enforce ------------------------------------------

PACKAGES = ("algorithms", "tasks", "benchmarks")
# What the report may read: its own modules, run files (io, the store), the markdown writer beside io, and the git
# history the cells' recorded commits are looked up in.
REPORT_READS = ("benchmarks.report", "benchmarks.io", "benchmarks.markdown", "benchmarks.errors", "benchmarks.store",
                "benchmarks.curve", "benchmarks.git")
# The layers the report sits on, beside the command line: none of them imports it.
BELOW_THE_REPORT = ("benchmarks.harness", "benchmarks.matrix", "benchmarks.checks", "benchmarks.perf", "algorithms",
                    "tasks")
# Correctness checks and performance benches stand side by side: what both need lives in benchmarks/references/.
SIDE_BY_SIDE = ("benchmarks.checks", "benchmarks.perf")
COMMAND_LINE = "benchmarks.cli"


def within(name: str, packages: tuple[str, ...]) -> bool:
    """``name`` is one of ``packages`` or a module inside one."""
    return any(name == p or name.startswith(p + ".") for p in packages)


# Each rule: its name -> whether the arrow importer -> imported breaks it. The tests below hold each one empty on the
# working tree, and each can fail: a planted arrow that breaks it is caught.
RULES = {
    "algorithms/ and tasks/ stand alone": lambda a, b: any(
        within(a, (p,)) and not within(b, (p,)) for p in ("algorithms", "tasks")),
    "nothing imports the command line": lambda a, b: (
        b == f"{COMMAND_LINE}.main" or (within(b, (COMMAND_LINE,)) and not within(a, (COMMAND_LINE,)))),
    "the report reads run data only": lambda a, b: within(a, ("benchmarks.report",)) and not within(b, REPORT_READS),
    "nothing below the report imports it": lambda a, b: (
        within(a, BELOW_THE_REPORT) and within(b, ("benchmarks.report",))),
    "checks/ and perf/ side by side": lambda a, b: any(
        within(a, (x,)) and within(b, (y,)) for x, y in (SIDE_BY_SIDE, SIDE_BY_SIDE[::-1])),
}


# --- the import graph of the working tree ----------------------------------------------------------------------------


def module_name(path: str) -> str:
    """'benchmarks/report/claims.py' -> 'benchmarks.report.claims'; a package's __init__.py is the package."""
    parts = list(Path(path).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> dict[str, str]:
    """Every module of the working tree's packages: its name -> its source."""
    return {module_name(p.relative_to(ROOT).as_posix()): p.read_text()
            for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def resolve_import(name: str, modules: dict) -> Optional[str]:
    """The project module an import statement names (the longest known prefix), or None for a library."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in modules:
            return candidate
    return None


def _import_statements(tree: ast.AST) -> Iterator[tuple[ast.stmt, bool]]:
    """Every import statement of ``tree``, with whether it sits inside a function."""

    def walk(node: ast.AST, local: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, local
            yield from walk(child, local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    return walk(tree, False)


def imported_names(source: str) -> set[str]:
    """Every module an import statement of ``source`` names, libraries included (the argparse and framework rules)."""
    names = set()
    for node, _ in _import_statements(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif node.module and node.level == 0:
            names.add(node.module)
    return names



def graph_of(modules: dict[str, str]) -> dict[str, set[str]]:
    """Every module -> the project modules its import statements name, function-level imports included."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, source in modules.items():
        for node, _ in _import_statements(ast.parse(source, filename=name)):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif node.module and node.level == 0:
                # `from pkg import sub` names the submodule when there is one, else the package
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                           for a in node.names]
            else:
                continue
            graph[name] |= {t for t in (resolve_import(x, modules) for x in targets) if t and t != name}
    return graph


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` reaches through one or more arrows (itself only when it sits on a cycle)."""
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _shortest_cycle(graph: dict[str, set[str]], start: str, knot: set[str]) -> list[str]:
    """The shortest path from ``start`` back to itself inside its knot (breadth first), ``[start, ..., start]``."""
    came_from: dict[str, Optional[str]] = {start: None}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            if start in graph.get(node, ()):
                path = [node]
                while came_from[path[-1]] is not None:
                    path.append(came_from[path[-1]])
                return path[::-1] + [start]
            for nxt in sorted(graph.get(node, set()) & knot):
                if nxt not in came_from:
                    came_from[nxt] = node
                    following.append(nxt)
        frontier = following
    raise ValueError(f"{start} is on no cycle")


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per knot of the graph (modules that each reach every other through imports): the shortest path from
    the knot's first module back to itself, ``[a, b, ..., a]``; empty when there is no cycle. One per knot rather than
    every cycle, so that the count is of tangles to undo (one knot of n modules may hold very many cycles)."""
    reach = {node: _reachable(graph, node) for node in graph}
    knots: list[set[str]] = []
    for node in sorted(graph):
        if node in reach[node] and not any(node in knot for knot in knots):
            knots.append({node} | {m for m in reach[node] if node in reach.get(m, ())})
    return [_shortest_cycle(graph, min(knot), knot) for knot in knots]


def broken_rules(graph: dict[str, set[str]]) -> dict[str, list[tuple[str, str]]]:
    """Each rule of RULES -> the arrows (importer, imported) that break it, sorted; an empty list: kept."""
    arrows = sorted((a, b) for a, targets in graph.items() for b in targets)
    return {rule: [(a, b) for a, b in arrows if breaks(a, b)] for rule, breaks in RULES.items()}



def import_graph() -> dict[str, set[str]]:
    return graph_of(_sources())


def _broken(rule: str) -> list[tuple[str, str]]:
    """The arrows of the working tree's graph that break ``rule`` (one of RULES)."""
    return broken_rules(import_graph())[rule]


def test_the_graph_sees_the_layout():
    graph = import_graph()
    assert "benchmarks.cli.main" in graph and "benchmarks.harness.loop" in graph and "algorithms.grpo" in graph
    assert {"benchmarks.harness.loop", "benchmarks.harness.config"} & graph["benchmarks.cli.run"]


def test_algorithms_and_tasks_stand_alone():
    broken = _broken("algorithms/ and tasks/ stand alone")
    assert not broken, broken


def test_nothing_imports_the_command_line():
    broken = _broken("nothing imports the command line")
    assert not broken, broken


@pytest.mark.parametrize("rule, arrow", [
    ("algorithms/ and tasks/ stand alone", ("algorithms.grpo", "tasks.base")),
    ("algorithms/ and tasks/ stand alone", ("tasks.pizza", "benchmarks.io")),
    ("nothing imports the command line", ("benchmarks.harness.loop", "benchmarks.cli.options")),
    ("nothing imports the command line", ("benchmarks.cli.run", "benchmarks.cli.main")),
], ids=["algorithms-import-tasks", "tasks-import-benchmarks", "harness-imports-cli", "cli-imports-its-entry"])
def test_a_planted_arrow_that_breaks_a_rule_is_caught(rule, arrow, monkeypatch):
    graph = import_graph()
    planted = {**graph, arrow[0]: graph.get(arrow[0], set()) | {arrow[1]}}
    monkeypatch.setattr(sys.modules[__name__], "import_graph", lambda: planted)
    test = {"algorithms/ and tasks/ stand alone": test_algorithms_and_tasks_stand_alone,
            "nothing imports the command line": test_nothing_imports_the_command_line}[rule]
    with pytest.raises(AssertionError, match=arrow[0]):
        test()
    assert RULES[rule](*arrow) and not any(other(*arrow) for name, other in RULES.items() if name != rule)


def test_only_the_command_line_sees_argparse():
    """Flags become typed settings in benchmarks/cli; an engine takes those settings, never a Namespace."""
    for name, source in _sources().items():
        if not within(name, ("benchmarks.cli",)):
            assert not [n for n in imported_names(source) if within(n, ("argparse",))], name


def test_a_planted_argparse_import_is_caught(monkeypatch):
    planted = "def settings():\n    import argparse\n"
    monkeypatch.setattr(sys.modules[__name__], "_sources", lambda: {"benchmarks.harness.engine": planted})
    with pytest.raises(AssertionError, match="benchmarks.harness.engine"):
        test_only_the_command_line_sees_argparse()


def test_only_the_reference_adapters_import_the_frameworks():
    """A check or a bench builds TRL's config and trainer through benchmarks/references/trl.py (one mapping of our
    names to TRL's), never with ``from trl import GRPOConfig`` of its own."""
    for name, source in _sources().items():
        if not within(name, ("benchmarks.references",)):
            assert not [n for n in imported_names(source) if within(n, REFERENCE_FRAMEWORKS)], name


def test_a_planted_framework_import_is_caught(monkeypatch):
    planted = "def args():\n    from trl import GRPOConfig\n    return GRPOConfig(output_dir='x')\n"
    monkeypatch.setattr(sys.modules[__name__], "_sources", lambda: {"benchmarks.perf.bench": planted})
    with pytest.raises(AssertionError, match="benchmarks.perf.bench"):
        test_only_the_reference_adapters_import_the_frameworks()


def test_the_report_reads_run_data_and_sits_on_top():
    for rule in ("the report reads run data only", "nothing below the report imports it"):
        broken = _broken(rule)
        assert not broken, (rule, broken)


@pytest.mark.parametrize("graph", [{"benchmarks.report.matrix": {"benchmarks.harness.loop"}},
                                   {"benchmarks.matrix.execute": {"benchmarks.report.matrix"}}],
                         ids=["report-imports-the-harness", "the-matrix-imports-the-report"])
def test_a_planted_report_import_is_caught(graph, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "import_graph", lambda: graph)
    with pytest.raises(AssertionError):
        test_the_report_reads_run_data_and_sits_on_top()


def test_the_checks_and_the_benches_sit_side_by_side():
    """A correctness check never stands on a performance bench, nor a bench on a check: what both need (the
    workloads, both sides, the same-batch engine) lives in benchmarks/references/, which both may import."""
    graph = import_graph()
    broken = broken_rules(graph)["checks/ and perf/ side by side"]
    assert not broken, broken
    assert "benchmarks.references.sides" in graph["benchmarks.perf.vs_trl"]


def test_a_planted_check_on_a_bench_is_caught(monkeypatch):
    graph = import_graph()
    monkeypatch.setattr(sys.modules[__name__], "import_graph",
                        lambda: {**graph, "benchmarks.checks.trl": {"benchmarks.perf.vs_trl"}})
    with pytest.raises(AssertionError, match="benchmarks.checks.trl"):
        test_the_checks_and_the_benches_sit_side_by_side()


def test_no_import_cycles():
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in cycles)


def test_a_planted_cycle_is_caught(monkeypatch):
    """The cycle check can fail: a graph with a -> b -> a is refused, and so is one through a function-local import
    in real source."""
    monkeypatch.setattr(sys.modules[__name__], "import_graph", lambda: {"a": {"b"}, "b": {"a"}})
    with pytest.raises(AssertionError, match="import cycles: a -> b -> a"):
        test_no_import_cycles()
    sources = {"benchmarks.io": "from benchmarks.store import x\n",
               "benchmarks.store": "def f():\n    import benchmarks.io\n"}
    monkeypatch.setattr(sys.modules[__name__], "import_graph", lambda: graph_of(sources))
    with pytest.raises(AssertionError, match="import cycles: benchmarks.io -> benchmarks.store -> benchmarks.io"):
        test_no_import_cycles()


# A tree with one arrow breaking each rule and two knots, one through a function-local import.
PLANTED = {
    "algorithms/__init__.py": "",
    "algorithms/grpo.py": "import torch\nfrom algorithms import losses\n\n\n"
                          "def f():\n    from tasks.base import Task\n",
    "algorithms/losses.py": "def loss(x):\n    return x\n",
    "tasks/__init__.py": "",
    "tasks/base.py": "class Task:\n    pass\n",
    "benchmarks/__init__.py": "",
    "benchmarks/api.py": "from benchmarks.cli.main import main\n",
    "benchmarks/io.py": "from benchmarks.store import Store\n",
    "benchmarks/store.py": "import benchmarks.io\n",
    "benchmarks/checks/__init__.py": "",
    "benchmarks/checks/trl.py": "from benchmarks.perf.bench import time_it\nfrom benchmarks import io\n",
    "benchmarks/perf/__init__.py": "",
    "benchmarks/perf/bench.py": "def time_it():\n    return 1\n",
    "benchmarks/report/__init__.py": "",
    "benchmarks/report/matrix.py": "from benchmarks.harness.loop import train\n",
    "benchmarks/harness/__init__.py": "",
    "benchmarks/harness/loop.py": "def train():\n    from benchmarks.report import matrix\n",
    "benchmarks/cli/__init__.py": "",
    "benchmarks/cli/main.py": "from benchmarks.cli import run\n",
    "benchmarks/cli/run.py": "import benchmarks.harness.loop as loop\n",
}


def test_the_planted_tree_breaks_each_rule_once_and_has_two_knots():
    graph = graph_of({module_name(path): source for path, source in PLANTED.items()})
    assert broken_rules(graph) == {
        "algorithms/ and tasks/ stand alone": [("algorithms.grpo", "tasks.base")],
        "nothing imports the command line": [("benchmarks.api", "benchmarks.cli.main")],
        "the report reads run data only": [("benchmarks.report.matrix", "benchmarks.harness.loop")],
        "nothing below the report imports it": [("benchmarks.harness.loop", "benchmarks.report.matrix")],
        "checks/ and perf/ side by side": [("benchmarks.checks.trl", "benchmarks.perf.bench")],
    }
    assert find_cycles(graph) == [["benchmarks.harness.loop", "benchmarks.report.matrix", "benchmarks.harness.loop"],
                                  ["benchmarks.io", "benchmarks.store", "benchmarks.io"]]


def test_the_graph_reads_imports_as_the_layering_means_them():
    sources = {module_name(path): source for path, source in PLANTED.items()}
    assert module_name("benchmarks/checks/__init__.py") == "benchmarks.checks"
    assert resolve_import("benchmarks.harness.loop.train", sources) == "benchmarks.harness.loop"
    assert resolve_import("torch.nn", sources) is None
    graph = graph_of(sources)
    # `from algorithms import losses` is the module losses; a function-local import is an arrow too; torch is none
    assert graph["algorithms.grpo"] == {"algorithms.losses", "tasks.base"} and graph["tasks.base"] == set()
    assert graph["benchmarks.checks.trl"] == {"benchmarks.perf.bench", "benchmarks.io"}
    assert imported_names(PLANTED["algorithms/grpo.py"]) == {"torch", "algorithms", "tasks.base"}


def test_a_knot_of_three_is_one_cycle_through_its_first_module():
    graph = {"c": {"a"}, "a": {"b", "d"}, "b": {"c"}, "d": set(), "e": {"e"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"], ["e", "e"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


# --- the tests mirror the code -------------------------------------------------------------------------------------
# tests/<dirs>/test_<name>.py tests <dirs>/<name>.py or the folder <dirs>/<name>/
# (tests/benchmarks/report/test_claims.py: benchmarks/report/claims.py). A second file on one module, or a file on one
# feature of it, adds its topic after the module's name (tests/algorithms/test_rollout_shared_prefix.py:
# algorithms/rollout.py). Every folder under tests/ mirrors a package and is one itself (tests/__init__.py says why),
# so two files in different folders may share a name (checks/ and perf/test_precision.py).

# The only test files at tests/ itself: each checks the project as a whole, not one module.
CROSS_CUTTING = {
    "test_layout.py",        # the packages' layering (above) and this layout of the tests
    "test_readme.py",        # the README's set-up commands that CI runs, its links, benchmarks/README.md's Layout table
    "test_dependencies.py",  # every package's imports against pyproject.toml's dependencies; every module imports
}


def _tested_module(test_file: Path, root: Path) -> Path | None:
    """The module or package ``test_file`` (tests/<dirs>/test_<name>[_<topic>].py) tests, or None."""
    folder = root / test_file.parent.relative_to(root / "tests")
    words = test_file.stem.removeprefix("test_").split("_")
    for n in range(len(words), 0, -1):  # the longest name first: test_trl_train.py is trl_train.py's, not trl.py's
        name = "_".join(words[:n])
        # a module, a package, or a folder of files (tests/benchmarks/test_matrices.py: benchmarks/matrices/)
        if (folder / f"{name}.py").is_file() or (folder / name).is_dir():
            return folder / name
    return None


def mirror_problems(root: Path = ROOT) -> list[str]:
    """Every file or folder under ``root``/tests that breaks the mirror, with what is wrong, one line each."""
    tests, problems = root / "tests", []
    for path in sorted(tests.rglob("*")):
        relative = path.relative_to(root).as_posix()
        if "__pycache__" in path.parts:
            continue
        if path.is_dir():
            mirrored = root / path.relative_to(tests)
            if path.relative_to(tests).parts[0] not in PACKAGES or not (mirrored / "__init__.py").is_file():
                problems.append(f"{relative}/: no package {mirrored.relative_to(root).as_posix()}/ to mirror")
            if not (path / "__init__.py").is_file():
                problems.append(f"{relative}/: no __init__.py (two test files of one name would collide)")
        elif path.suffix != ".py" or path.name in ("__init__.py", "conftest.py"):
            continue
        elif path.parent == tests:
            if path.name.startswith("test_") and path.name not in CROSS_CUTTING:
                problems.append(f"{relative}: at tests/ itself but not cross-cutting: move it beside the module it "
                                "tests, or add it to CROSS_CUTTING with why")
        elif not path.name.startswith("test_"):
            problems.append(f"{relative}: only test_*.py, __init__.py and conftest.py sit in the folders under tests/")
        elif _tested_module(path, root) is None:
            folder = path.parent.relative_to(tests).as_posix()
            problems.append(f"{relative}: no {folder}/{path.stem.removeprefix('test_')}.py or {folder}/"
                            f"{path.stem.removeprefix('test_')}/ (nor a module its name starts with) to test")
    return problems


def test_the_tests_mirror_the_modules_they_test():
    assert not mirror_problems(), "\n".join(mirror_problems())
    assert all((ROOT / "tests" / name).is_file() for name in CROSS_CUTTING)  # the allow-list names only what is there
    assert _tested_module(ROOT / "tests/benchmarks/report/test_claims.py", ROOT) == ROOT / "benchmarks/report/claims"


def test_a_test_file_of_no_module_is_caught(tmp_path):
    """A tree of the project's shape: one file of each kind passes, and each break of the mirror is named."""
    for module in ("benchmarks/__init__.py", "benchmarks/report/__init__.py", "benchmarks/report/claims.py",
                   "benchmarks/harness/__init__.py", "algorithms/__init__.py", "algorithms/rollout.py"):
        (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / module).write_text("")
    for test in ("__init__.py", "conftest.py", "test_layout.py", "benchmarks/__init__.py", "benchmarks/test_harness.py",
                 "benchmarks/report/__init__.py", "benchmarks/report/test_claims.py", "algorithms/__init__.py",
                 "algorithms/test_rollout_shared_prefix.py"):
        (tmp_path / "tests" / test).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "tests" / test).write_text("")
    assert mirror_problems(tmp_path) == []
    for planted, problem in [("benchmarks/report/test_nonexistent.py", "no benchmarks/report/nonexistent.py"),
                             ("algorithms/test_rollouts.py", "no algorithms/rollouts.py"),
                             ("test_claims.py", "at tests/ itself but not cross-cutting"),
                             ("benchmarks/report/helpers.py", "only test_*.py"),
                             ("benchmarks/reports/__init__.py", "no package benchmarks/reports/"),
                             ("docs/__init__.py", "no package docs/")]:
        path = tmp_path / "tests" / planted
        new_folder = not path.parent.exists()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
        found = mirror_problems(tmp_path)
        where = f"tests/{Path(planted).parent.as_posix()}/" if new_folder else f"tests/{planted}"
        assert len(found) == 1 and found[0].startswith(where) and problem in found[0], (planted, found)
        if new_folder:
            shutil.rmtree(path.parent)
        else:
            path.unlink()
    assert mirror_problems(tmp_path) == []
    (tmp_path / "tests" / "benchmarks" / "report" / "__init__.py").unlink()
    assert mirror_problems(tmp_path) == [
        "tests/benchmarks/report/: no __init__.py (two test files of one name would collide)"]
