"""``grpo-bench bench revisions``: one step at several git revisions, each in a worker importing its own tree."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
from pathlib import Path

import pytest

from benchmarks.errors import UsageError
from benchmarks.perf.revisions import Worker
from tests.conftest import ROOT


def _git_checkout() -> bool:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _git_checkout(), reason="needs the project's git history")
def test_two_workers_on_one_revision_take_the_same_steps(run_cli, tmp_path):
    """The same commit twice: each worker imports its extracted tree, and with one seed they draw the same
    prompts and sample the same completions, round after round; the report says so per revision."""
    code, out, err = run_cli("bench", "revisions", "HEAD", "HEAD", "--workloads", "pizza-mu1", "--rounds", "2",
                             "--threads", "1", "--repo", str(ROOT), "--out", str(tmp_path))
    assert code == 0, err
    report = json.loads((tmp_path / "revisions.json").read_text())
    (workload,) = report["workloads"]
    first, second = workload["revisions"]
    assert first["commit"] == second["commit"] and len(first["commit"]) == 40
    assert first["rounds"] == second["rounds"] == 2
    assert first["tokens_generated"] == second["tokens_generated"]  # the same batches
    assert [s["loss"] for s in first["steps"]] == [s["loss"] for s in second["steps"]]
    assert first["speedup_vs_first"] == 1.0 and second["speedup_vs_first"] > 0
    assert all(s["time/step"] > 0 for s in first["steps"])
    text = (tmp_path / "revisions.md").read_text()
    assert text.splitlines()[2].startswith(f"**`{first['commit'][:8]}` against `{first['commit'][:8]}`, median step: pizza-mu1 ")
    assert first["subject"][:40] in text and "## pizza-mu1" in text and "Regenerate: `grpo-bench bench revisions" in text


def test_bad_revisions_are_one_line(run_cli, tmp_path):
    for args, message in ((["nope-not-a-revision", "HEAD"], "unknown revision 'nope-not-a-revision'"),
                          (["HEAD"], "at least two revisions"),
                          (["HEAD", "HEAD", "--workloads", "nope"], "unknown workload 'nope'"),
                          (["HEAD", "HEAD", "--rounds", "1"], "--rounds must be >= 2")):
        code, out, err = run_cli("bench", "revisions", *args, "--repo", str(ROOT), "--out", str(tmp_path))
        assert code == 2, (args, err)
        assert message in err and len(err.strip().splitlines()) == 1


# A revision's tree reduced to what the worker imports from it: its harness's ``resolve`` and ``build``; the algorithm
# writes, each step, where it was imported from, the import path it saw, the settings and the prompts it got to the
# file the settings name (the worker passes on only a step's times, loss and tokens).
STUB_HARNESS = """
import json, os, sys

def resolve(settings):
    return settings, None, {}

class _Task:
    def train_prompts(self):
        return ["a", "b", "c"]

class _Algo:
    def __init__(self, settings):
        self.settings = settings

    def step(self, prompts):
        seen = {"file": __file__, "path": sys.path[:2], "cwd": os.getcwd(), "said": self.settings, "prompts": prompts}
        with open(self.settings["notes"], "a") as f:
            f.write(json.dumps(seen) + "\\n")
        return {"time/update": 0.5, "loss": 1.0, "tokens/generated": 3}

def build(rc, config, task_options):
    return _Task(), None, _Algo(rc), None
"""


def _stub_tree(root: Path) -> Path:
    (root / "benchmarks" / "harness").mkdir(parents=True)
    (root / "benchmarks" / "__init__.py").write_text("")
    (root / "benchmarks" / "harness" / "__init__.py").write_text(STUB_HARNESS)
    return root


def test_the_worker_is_this_checkouts_and_runs_the_trees_code(tmp_path, monkeypatch):
    """The worker file comes from this checkout and the tree needs none (an older revision has none): it imports
    the tree's benchmarks ahead of the working directory, which stays the caller's, as ``python -c`` had it."""
    tree = _stub_tree(tmp_path / "tree")
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    settings = {"task": "stub", "prompts_per_step": 2, "seed": 3, "notes": str(tmp_path / "notes.jsonl")}
    worker = Worker(tree, "stub", settings, 3, 1, tmp_path / "worker.log")
    try:
        steps = [worker.step(), worker.step()]
    finally:
        worker.close()
    first, second = (json.loads(line) for line in (tmp_path / "notes.jsonl").read_text().splitlines())
    assert worker.threads == 1
    assert first["file"] == str(tree / "benchmarks" / "harness" / "__init__.py")
    assert first["path"] == [str(tree), ""] and first["cwd"] == str(tmp_path / "cwd")
    assert first["said"] == settings  # the caller's workload, built by the tree's harness
    rng = random.Random(3)
    assert [first["prompts"], second["prompts"]] == [[rng.choice(["a", "b", "c"]) for _ in range(2)] for _ in range(2)]
    assert all(s["time/update"] == 0.5 and s["time/step"] > 0 and s["loss"] == 1.0 for s in steps)


def test_a_worker_that_imports_another_tree_is_refused(tmp_path, monkeypatch):
    """A tree without a benchmarks package: the worker finds the working directory's, and that is an error."""
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(_stub_tree(tmp_path / "other"))
    with pytest.raises(UsageError, match="imported .*other/benchmarks/__init__.py, not its own tree"):
        Worker(tmp_path / "empty", "stub", {"task": "stub"}, 0, 1, tmp_path / "worker.log")


def test_a_worker_killed_mid_run_is_one_line_that_says_so(tmp_path, monkeypatch):
    """A worker the kernel kills (for memory, say) between steps: the next step is a UsageError naming the signal,
    not a broken pipe's traceback."""
    tree = _stub_tree(tmp_path / "tree")
    monkeypatch.chdir(tmp_path)
    worker = Worker(tree, "stub", {"task": "stub", "notes": str(tmp_path / "notes.jsonl")}, 0, 1, tmp_path / "w.log")
    try:
        worker.step()
        os.kill(worker.proc.pid, signal.SIGKILL)
        worker.proc.wait(timeout=30)
        with pytest.raises(UsageError, match="stopped: killed by signal 9 \\(the kernel kills for memory with 9\\)"):
            worker.step()
    finally:
        worker.close()


def test_the_report_names_the_machine_without_the_callers_thread_count():
    """The workers run on their own thread count, which each workload's heading states; the caller's (the environment
    measured in the bench's own process) is not theirs."""
    from benchmarks.perf.revisions import render_markdown

    report = {"environment": {"device_name": "AMD EPYC (2 threads)", "versions": {"torch": "2"}},
              "load": {"load_1min": [1.0], "cpus": 2}, "revisions": [{}, {}], "workloads": [], "command": "c"}
    text = render_markdown(report)
    assert "on AMD EPYC (torch 2)" in text and "2 threads" not in text


def test_a_dpo_workload_reads_as_pairs_a_step():
    """DPO's workload counts pairs, not a group of G completions of one prompt: the heading says what a step takes
    (the committed side-by-side run of DPO's step, rendered again)."""
    from benchmarks.perf.revisions import render_markdown

    report = json.loads(Path("results/perf/revisions-dpo/revisions.json").read_text())
    text = render_markdown(report)
    assert "## chain_sum-dpo: reasoning_gym, dpo, 16 pairs a step, beta 0.1, bf16" in text and "x G" not in text
    assert text + "\n" == Path("results/perf/revisions-dpo/revisions.md").read_text()  # the committed page is this
