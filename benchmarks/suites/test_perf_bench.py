"""`pytest benchmarks`: one GRPO step of this suite against TRL's GRPOTrainer on pizza (fast), and the full
``grpo-bench bench grpo-vs-trl`` under ``-m slow`` (about 10 minutes on a quiet 2-core CPU)."""

import json
import subprocess
import sys

import pytest
import torch

from benchmarks.references.sides import WORKLOADS, Ours, Trl

WORKLOAD = WORKLOADS["pizza-mu1"]


@pytest.fixture(scope="module")
def sides():
    ours = Ours(WORKLOAD, seed=0, device="cpu")
    return ours, Trl(WORKLOAD, seed=0, device="cpu", task=ours.task)


@pytest.mark.parametrize("side", ["ours", "trl"])
def test_grpo_step_vs_trl(benchmark, sides, side):
    benchmark.group = f"one GRPO step, {WORKLOAD.name} (G={WORKLOAD.group_size}, {WORKLOAD.max_new_tokens} tokens)"
    runner = sides[0] if side == "ours" else sides[1]
    prompts = runner.task.train_prompts()[:1]
    metrics = benchmark.pedantic(runner.step, args=(prompts,), rounds=5, warmup_rounds=1)
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    benchmark.extra_info.update({k: metrics[k] for k in metrics if k.startswith(("time/", "tokens/"))})


@pytest.mark.slow
def test_full_grpo_vs_trl(tmp_path):
    """The whole command, as the lead regenerates results/perf (writes only under tmp_path here)."""
    command = [sys.executable, "-m", "benchmarks.cli.main", "bench", "grpo-vs-trl", "--out", str(tmp_path),
               "--readme", str(tmp_path / "README.md")]
    assert subprocess.run(command).returncode == 0
    report = json.loads((tmp_path / "perf.json").read_text())
    for comparison in report["comparisons"]:
        assert comparison["same_batch"]["max_abs_diff"] <= 1e-6
    assert (tmp_path / "scaling.png").stat().st_size > 0
