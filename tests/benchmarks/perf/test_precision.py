"""grpo-bench bench precision: each variant's steps at every training precision, interleaved, summarised per 1,280
completions, the speed-up read from the same rounds; --resume keeps what was measured."""

from __future__ import annotations

import json
import statistics

import pytest

from benchmarks.errors import UsageError
from benchmarks.perf.precision import CELL_COMPLETIONS, PrecisionBenchSettings, run_precision_bench

MATRIX = 'name = "p"\nseeds = [0]\nbudget = 64\n[tasks.pizza]\n[algorithms.grpo]\n[algorithms.ppo]\n'


def test_steps_summary_and_resume(tmp_path):
    matrix = tmp_path / "m.toml"
    matrix.write_text(MATRIX)
    out = tmp_path / "out"
    settings = PrecisionBenchSettings(matrix=str(matrix), variants=("grpo",), rounds=2, out=str(out))
    run_precision_bench(settings, log=lambda line: None)
    report = json.loads((out / "precision.json").read_text())
    grpo = report["variants"]["grpo"]
    assert set(grpo) == {"fp32", "bf16", "bf16, fp32 logits"}
    per_cell = {label: [s["time/step"] / s["completions"] * CELL_COMPLETIONS for s in r["steps"]] for label, r in grpo.items()}
    assert all(len(v) == 2 for v in per_cell.values())
    for label, r in grpo.items():
        assert r["cell_s"] == pytest.approx(statistics.median(per_cell[label]))
        ratios = [a / b for a, b in zip(per_cell["fp32"], per_cell[label])]
        assert r["speedup"] == pytest.approx(statistics.median(ratios))
        assert r["speedup_ci95"][0] <= r["speedup"] <= r["speedup_ci95"][1]
        # the phases are parts of the step
        assert 0 < sum(v for v in r["phases_cell_s"].values() if v) <= r["cell_s"] * 1.01
    assert grpo["fp32"]["speedup"] == 1.0
    assert "| grpo | bf16 |" in (out / "precision.md").read_text()
    # --resume keeps grpo as measured and measures only ppo
    run_precision_bench(PrecisionBenchSettings(**{**settings.__dict__, "variants": ("grpo", "ppo"), "resume": True}),
                        log=lambda line: None)
    again = json.loads((out / "precision.json").read_text())
    assert again["variants"]["grpo"] == grpo and set(again["variants"]) == {"grpo", "ppo"}
    # PPO's separate critic is timed inside its update; GRPO has none
    for label, r in again["variants"]["ppo"].items():
        assert 0 < r["critic_cell_s"] < r["phases_cell_s"]["update"]
        assert grpo[label]["critic_cell_s"] is None
    assert "| ppo | fp32 |" in (out / "precision.md").read_text() and "of it the critic" in (out / "precision.md").read_text()


def test_bad_input_is_one_line(tmp_path):
    with pytest.raises(UsageError, match="--rounds must be >= 2"):
        run_precision_bench(PrecisionBenchSettings(rounds=1, out=str(tmp_path)))
