"""``grpo-bench check shape`` (benchmarks/checks/shape.py): the import graph, the layering's verdicts and the sizes of
a planted tree whose every number is known, and the study on a tiny git repository of two commits. The graph's
reading of the real tree is held by tests/test_layout.py, which enforces the layering with these functions."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from benchmarks.checks import shape
from benchmarks.cli.main import main
from benchmarks.errors import UsageError


def _lines(head: str, body: str, n: int, tail: str) -> str:
    """A function of exactly ``n`` lines: its ``def``, n - 2 lines of ``body``, and ``tail``."""
    return head + body * (n - 2) + tail


# A tree with one arrow breaking each rule, two knots (one through a function-local import), a 71-line function and
# a 45-line method; every number below is counted by hand.
PLANTED = {
    "algorithms/__init__.py": "",
    "algorithms/grpo.py": "import torch\nfrom algorithms import losses\n\n\ndef f():\n    from tasks.base import Task\n"
                          "    return Task\n",
    "algorithms/losses.py": "def loss(x):\n    def inner():\n        return x\n    return inner()\n",
    "tasks/__init__.py": "",
    "tasks/base.py": "class Task:\n" + _lines("    def score(self):\n", "        x = 1\n", 45, "        return x\n"),
    "benchmarks/__init__.py": "",
    "benchmarks/api.py": "from benchmarks.cli.main import main\n",
    "benchmarks/io.py": "from benchmarks.store import Store\n",
    "benchmarks/store.py": "import benchmarks.io\n",
    "benchmarks/checks/__init__.py": "",
    "benchmarks/checks/same_batch.py": "from benchmarks.perf.bench import time_it\nfrom benchmarks import io\n",
    "benchmarks/perf/__init__.py": "",
    "benchmarks/perf/bench.py": _lines("def time_it():\n", "    x = 1\n", 71, "    return x\n"),
    "benchmarks/report/__init__.py": "",
    "benchmarks/report/matrix.py": "from benchmarks.harness.loop import train\n",
    "benchmarks/harness/__init__.py": "",
    "benchmarks/harness/loop.py": "def train():\n    from benchmarks.report import matrix\n",
    "benchmarks/cli/__init__.py": "",
    "benchmarks/cli/main.py": "from benchmarks.cli import run\n",
    "benchmarks/cli/run.py": "import benchmarks.harness.loop as loop\n",
}


def test_the_planted_tree_is_measured_exactly():
    measured = shape.measure(PLANTED)
    assert measured["cycles"] == [["benchmarks.harness.loop", "benchmarks.report.matrix", "benchmarks.harness.loop"],
                                  ["benchmarks.io", "benchmarks.store", "benchmarks.io"]]
    assert {r["rule"]: r["arrows"] for r in measured["rules"]} == {
        "algorithms/ and tasks/ stand alone": [["algorithms.grpo", "tasks.base"]],
        "nothing imports the command line": [["benchmarks.api", "benchmarks.cli.main"]],
        "the report reads run data only": [["benchmarks.report.matrix", "benchmarks.harness.loop"]],
        "nothing below the report imports it": [["benchmarks.harness.loop", "benchmarks.report.matrix"]],
        "checks/ and perf/ side by side": [["benchmarks.checks.same_batch", "benchmarks.perf.bench"]],
    }
    assert [r["rule"] for r in measured["rules"]] == list(shape.RULES)
    assert measured["local_imports"] == 2  # grpo's tasks.base, the loop's report.matrix
    # Arrows between rooms only (grpo -> losses, io <-> store and cli.main -> cli.run stay inside theirs), the bottom
    # room first; `from benchmarks import io` is the module io, `import torch` no project module.
    assert [(e["from"], e["to"], e["module_level"], e["function_local"], e["breaking"])
            for e in measured["room_edges"]] == [
        ("algorithms", "tasks", 0, 1, 1),
        ("benchmarks", "benchmarks.cli", 1, 0, 1),
        ("benchmarks.harness", "benchmarks.report", 0, 1, 1),
        ("benchmarks.checks", "benchmarks", 1, 0, 0),
        ("benchmarks.checks", "benchmarks.perf", 1, 0, 1),
        ("benchmarks.report", "benchmarks.harness", 1, 0, 1),
        ("benchmarks.cli", "benchmarks.harness", 1, 0, 0),
    ]
    assert [e["importers"] for e in measured["room_edges"]][:2] == [["algorithms.grpo"], ["benchmarks.api"]]
    assert measured["longest_functions"][:4] == [
        {"path": "benchmarks/perf/bench.py", "function": "time_it", "line": 1, "lines": 71},
        {"path": "tasks/base.py", "function": "Task.score", "line": 2, "lines": 45},
        {"path": "algorithms/losses.py", "function": "loss", "line": 1, "lines": 4},
        {"path": "algorithms/grpo.py", "function": "f", "line": 5, "lines": 3},
    ]
    assert {(f["function"], f["lines"]) for f in measured["longest_functions"]} >= {("loss.<locals>.inner", 2)}
    assert measured["functions"] == 6 and measured["functions_over"] == {"60": 1, "40": 2}
    assert measured["largest_modules"][:2] == [{"path": "benchmarks/perf/bench.py", "lines": 71},
                                               {"path": "tasks/base.py", "lines": 46}]
    assert measured["modules"] == len(PLANTED) and measured["lines"] == 71 + 46 + 7 + 4 + 1 * 8 + 2
    rooms = {r["room"]: (r["modules"], r["lines"]) for r in measured["rooms"]}
    assert rooms["benchmarks"] == (4, 3) and rooms["benchmarks.perf"] == (2, 71) and rooms["algorithms"] == (3, 11)
    assert list(rooms)[:3] == ["algorithms", "tasks", "benchmarks"]


def test_the_graph_is_read_as_the_layout_tests_read_it():
    sources = shape.modules(PLANTED)
    assert shape.module_name("benchmarks/checks/__init__.py") == "benchmarks.checks"
    assert shape.room("benchmarks/checks/cases/verl.py") == "benchmarks.checks" and shape.room("benchmarks/io.py") == \
        "benchmarks" and shape.room("algorithms/grpo.py") == "algorithms"
    assert shape.resolve_import("benchmarks.harness.loop.train", sources) == "benchmarks.harness.loop"
    assert shape.resolve_import("torch.nn", sources) is None
    graph = shape.import_graph(sources)
    assert graph["algorithms.grpo"] == {"algorithms.losses", "tasks.base"} and graph["tasks.base"] == set()
    assert shape.imported_names(PLANTED["algorithms/grpo.py"]) == {"torch", "algorithms", "tasks.base"}


def test_a_knot_of_three_is_one_cycle_through_its_first_module():
    graph = {"c": {"a"}, "a": {"b", "d"}, "b": {"c"}, "d": set(), "e": {"e"}}
    assert shape.find_cycles(graph) == [["a", "b", "c", "a"], ["e", "e"]]
    assert shape.find_cycles({"a": {"b"}, "b": set()}) == []


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path) -> tuple[Path, str, str]:
    """A git repository of two commits: the first with an import cycle, the second without it; each with a file
    outside the packages and a non-Python file inside them, which nothing reads."""
    root = tmp_path / "repo"
    (root / "benchmarks").mkdir(parents=True)
    _git(root, "init", "-q")
    (root / "setup.py").write_text("import benchmarks.io\n")
    (root / "benchmarks" / "data.txt").write_text("not python\n")
    (root / "benchmarks" / "__init__.py").write_text("")
    (root / "benchmarks" / "io.py").write_text("from benchmarks.store import Store\n")
    (root / "benchmarks" / "store.py").write_text("def f():\n    import benchmarks.io\n")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "first: io and store in a circle")
    first = _git(root, "rev-parse", "HEAD")
    (root / "benchmarks" / "store.py").write_text("def f():\n    return 1\n")
    _git(root, "commit", "-q", "-am", "second: no circle")
    return root, first, _git(root, "rev-parse", "HEAD")


def test_a_revision_is_read_from_git_not_from_the_working_tree(repo):
    root, first, _ = repo
    (root / "benchmarks" / "io.py").write_text("changed, not committed\n")
    assert shape.revision_files(str(root), first) == {
        "benchmarks/__init__.py": "", "benchmarks/io.py": "from benchmarks.store import Store\n",
        "benchmarks/store.py": "def f():\n    import benchmarks.io\n"}


def test_the_study_writes_its_report_and_rerender_writes_the_same_one(repo, tmp_path, capsys):
    root, first, second = repo
    out = tmp_path / "shape"
    assert main(["check", "shape", "--before", first[:7], "--repo", str(root), "--out", str(out)]) == 0
    result = json.loads((out / "shape.json").read_text())
    assert [r["commit"] for r in result["revisions"]] == [first, second]
    assert [r["revision"] for r in result["revisions"]] == [first[:7], "HEAD"]
    assert [len(s["cycles"]) for s in result["shapes"]] == [1, 0]
    report = (out / "report.md").read_text()
    assert report.startswith("# The code's shape, before and after\n\n")
    headline = report.splitlines()[2]
    assert headline == (f"**`{first[:8]}` -> `{second[:8]}`: import cycles 1 -> 0; arrows that break a layering rule "
                        "0 -> 0; functions over 60 lines 0 -> 0; largest module `benchmarks/store.py` 2 lines -> "
                        "`benchmarks/store.py` 2.**")
    assert capsys.readouterr().out.splitlines()[0] == headline
    assert "- cycle: `benchmarks.io` -> `benchmarks.store` -> `benchmarks.io`" in report
    assert "```mermaid\nflowchart TD\n" in report
    assert shape._importers({"from": "benchmarks", "importers": ["benchmarks", "benchmarks.api", "benchmarks.b",
                                                                  "benchmarks.c", "benchmarks.d"]}) == \
        "benchmarks, api, b, c and 1 more"
    assert f"Regenerate: `grpo-bench check shape --before {first[:7]} --repo {root} --out {out}`" in report
    written = (out / "report.md").read_bytes()
    (out / "report.md").unlink()
    assert main(["check", "shape", "--rerender", "--out", str(out), "--before", "not-read"]) == 0
    assert (out / "report.md").read_bytes() == written  # from the json: its command, nothing measured
    # the later revision with the cycle: the check fails, its report written all the same
    assert main(["check", "shape", "--before", "HEAD", "--after", first, "--repo", str(root), "--out", str(out)]) == 1
    assert "import cycles 0 -> 1" in (out / "report.md").read_text()


def test_a_bad_revision_is_one_line_and_exit_status_2(repo, tmp_path, capsys):
    root, _, _ = repo
    settings = shape.ShapeSettings(before="no-such-revision", repo=str(root), out=str(tmp_path / "shape"))
    with pytest.raises(UsageError, match="unknown revision 'no-such-revision'"):
        shape.compare(settings, "grpo-bench check shape")
    assert main(["check", "shape", "--before", "HEAD", "--after", "nope~3", "--repo", str(root),
                 "--out", str(tmp_path / "shape")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("grpo-bench: error: unknown revision 'nope~3'") and len(err.splitlines()) == 1
    assert not (tmp_path / "shape").exists()  # nothing written
    assert main(["check", "shape", "--repo", str(tmp_path), "--out", str(tmp_path / "shape")]) == 2  # no git checkout
    assert "unknown revision 'e56a20c'" in capsys.readouterr().err
