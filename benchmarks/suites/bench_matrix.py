"""`pytest benchmarks -m matrix`: a small matrix of every registered algorithm on pizza, run end to end
through `grpo-bench matrix` and `grpo-bench report`, and the sanity of its rows."""

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from algorithms import ALGORITHMS

ROOT = Path(__file__).absolute().parents[2]
BUDGET = 512  # generated completions per cell: 16-32 steps, enough for every algorithm to move on pizza

COLUMNS = [
    "task", "variant", "algo", "seed", "status", "steps", "budget", "completions_per_step", "completions_generated",
    "accuracy_before", "accuracy_after", "reward_before", "reward_after", "wall_clock_s", "process_wall_clock_s",
    "time_per_step_s", "tokens_generated", "tokens_per_second", "peak_memory_bytes", "peak_memory_kind",
    "param_bytes", "grad_bytes", "optimizer_bytes", "device_name", "precision", "version_torch",
    "version_transformers", "version_trl", "time_update_s",
]


@pytest.mark.matrix
def test_small_matrix_end_to_end(tmp_path):
    toml = tmp_path / "small.toml"
    toml.write_text(f"seeds = [0]\nbudget = {BUDGET}\neval_every = 256\ndevice = \"cpu\"\n\n[tasks.pizza]\neval_samples = 128\n\n"
                    + "".join(f"[algorithms.{name}]\n" for name in sorted(ALGORITHMS)))
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    for args in (["matrix", str(toml), "--out", str(out), "--no-progress", "--allow-dirty"], ["report", str(out)]):
        done = subprocess.run([sys.executable, "-m", "benchmarks.cli.main", *args], cwd=ROOT, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr

    cells = pd.read_csv(out / "tables" / "cells.csv")
    assert sorted(cells["algo"]) == sorted(ALGORITHMS) and (cells["status"] == "complete").all()
    missing = [c for c in COLUMNS if c not in cells.columns]
    assert not missing, f"columns missing from cells.csv: {missing}"
    # a warm worker's later cells keep their process peak apart (peak_memory_warm_bytes): it is not the cell's own
    own = [c for c in COLUMNS if c not in ("peak_memory_bytes", "tokens_per_second")]
    assert not cells[own].isna().any().any(), cells[own].isna().sum()[lambda s: s > 0]
    sampled = cells["tokens_generated"] > 0  # a cell that generated nothing (DPO's offline pairs) has no rate
    assert cells.loc[sampled, "tokens_per_second"].gt(0).all() and cells.loc[~sampled, "tokens_per_second"].isna().all()
    peaks = cells["peak_memory_bytes"].fillna(cells["peak_memory_warm_bytes"])
    assert (peaks > 0).all() and cells["peak_memory_bytes"].notna().any()
    for column in ("param_bytes", "optimizer_bytes", "wall_clock_s", "time_per_step_s", "process_wall_clock_s",
                   "time_update_s"):
        assert (cells[column] > 0).all(), column
    assert (cells["steps"] * cells["completions_per_step"] == BUDGET).all()
    assert (cells["completions_generated"] <= BUDGET).all()
    improved = cells.set_index("algo")["accuracy_after"] > cells.set_index("algo")["accuracy_before"]
    assert improved.all(), cells[["algo", "accuracy_before", "accuracy_after"]]

    evals = pd.read_csv(out / "tables" / "evals.csv")
    assert set(evals["phase"]) == {"before", "during", "after"}
    summary = pd.read_csv(out / "tables" / "summary.csv")
    assert len(summary) == len(ALGORITHMS)
    for png in ("reward_vs_samples", "reward_vs_wallclock", "final_accuracy", "peak_memory", "time_per_step",
                "diagnostics_pizza"):  # the KL among its per-step panels
        assert (out / "plots" / f"{png}.png").stat().st_size > 1000, png
