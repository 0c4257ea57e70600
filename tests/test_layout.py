"""The layering, read from the source with ``ast``: algorithms/ and tasks/ never import each other or
benchmarks/, nothing imports the command-line entry module, engines never import the command line nor
argparse, the report reads run data and nothing below it imports the report, only the reference adapters
(benchmarks/references/) import a reference framework, and the import graph (function-level imports included)
has no cycle. And the tests mirror the code: tests/benchmarks/report/test_claims.py tests benchmarks/report/claims.py,
and only the few checks of the project as a whole sit at tests/ itself."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from benchmarks.checks import shape
from benchmarks.checks.shape import PACKAGES, RULES, broken_rules, find_cycles, imported_names, within

ROOT = Path(__file__).resolve().parents[1]
# The reference frameworks' packages: their configs, trainers and functions are reached through the adapters.
REFERENCE_FRAMEWORKS = ("trl", "verl", "openrlhf")


# The graph and the rules are benchmarks/checks/shape.py's, which ``grpo-bench check shape`` reports at any two
# revisions: what these tests refuse on the working tree is what that report counts.
def _sources() -> dict[str, str]:
    """Every module of the working tree: its name -> its source."""
    return shape.modules(shape.working_tree_files(ROOT))


def import_graph() -> dict[str, set[str]]:
    return shape.import_graph(_sources())


def _broken(rule: str) -> list[tuple[str, str]]:
    """The arrows of the working tree's graph that break ``rule`` (one of shape.RULES)."""
    return broken_rules(import_graph())[rule]


def test_the_graph_sees_the_layout():
    graph = import_graph()
    assert "benchmarks.cli.main" in graph and "benchmarks.harness.loop" in graph and "algorithms.grpo" in graph
    assert "benchmarks.harness.loop" in graph["benchmarks.cli.run"] or "benchmarks.harness.config" in graph["benchmarks.cli.run"]


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
    workloads, both sides, the same-batch engine) lives in benchmarks/references/sides.py, which both import."""
    graph = import_graph()
    broken = broken_rules(graph)["checks/ and perf/ side by side"]
    assert not broken, broken
    assert "benchmarks.references.sides" in graph["benchmarks.checks.same_batch"]
    assert "benchmarks.references.sides" in graph["benchmarks.perf.grpo_vs_trl"]


def test_a_planted_check_on_a_bench_is_caught(monkeypatch):
    graph = import_graph()
    monkeypatch.setattr(sys.modules[__name__], "import_graph",
                        lambda: {**graph, "benchmarks.checks.same_batch": {"benchmarks.perf.grpo_vs_trl"}})
    with pytest.raises(AssertionError, match="benchmarks.checks.same_batch"):
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
    monkeypatch.setattr(sys.modules[__name__], "import_graph", lambda: shape.import_graph(sources))
    with pytest.raises(AssertionError, match="import cycles: benchmarks.io -> benchmarks.store -> benchmarks.io"):
        test_no_import_cycles()


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
