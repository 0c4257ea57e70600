"""``grpo-bench bench revisions``: one step at several git revisions, each in a worker importing its own tree."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


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
