"""The report's primary metric reads every evaluation in the order it ran, as the tuning stage does: a cell whose
evaluations all sit at one completion count (DPO draws its samples up front) still has its last 3 evaluations."""

import math

import pandas as pd
import pytest

from benchmarks.curve import accuracy_curve, primary_value
from benchmarks.report import curves


def _frames(samples_at_evals):
    cells = pd.DataFrame([{"task": "t", "variant": "v", "algo": "v", "seed": 0, "budget": 1280.0, "eval_every": 10,
                           "completions_per_step": 32.0, "status": "complete"}])
    accuracy = [0.10, 0.40, 0.45, 0.47, 0.50]
    phases = ["before", "step", "step", "step", "after"]
    evals = pd.DataFrame([{"task": "t", "variant": "v", "seed": 0, "samples": s, "accuracy": a, "time/wall": 10.0 * i,
                           "phase": p} for i, (s, a, p) in enumerate(zip(samples_at_evals, accuracy, phases))])
    return cells, evals


@pytest.mark.parametrize("samples", [
    [0.0, 320.0, 640.0, 960.0, 1280.0],      # a GRPO cell: an evaluation every 320 completions
    [0.0, 1280.0, 1280.0, 1280.0, 1280.0],   # a DPO cell: its 1,280 samples drawn before the first step
])
def test_last_3_is_the_mean_of_the_last_three_evaluations(samples):
    cells, evals = _frames(samples)
    row = curves.build(cells, evals, "last_3")["cells"].iloc[0]
    assert row["primary"] == pytest.approx((0.45 + 0.47 + 0.50) / 3)
    # the tuning stage's reading of the same cell gives the same number
    metrics = [{"completions": s1 - s0, **({"eval/accuracy": a} if p == "step" else {})}
               for s0, s1, a, p in zip(samples, samples[1:], [0.40, 0.45, 0.47, 0.50], ["step", "step", "step", "end"])]
    x, y = accuracy_curve({"accuracy_before": 0.10, "accuracy_after": 0.50, "completions_generated": 1280.0}, metrics)
    assert primary_value("last_3", x, y, 1280.0) == pytest.approx(row["primary"])


def test_too_few_evaluations_is_still_nan():
    cells, evals = _frames([0.0, 1280.0, 1280.0, 1280.0, 1280.0])
    row = curves.build(cells, evals.iloc[[0, 4]], "last_3")["cells"].iloc[0]
    assert math.isnan(row["primary"])


def test_the_report_names_the_variant_whose_curve_over_completions_is_too_short(tmp_path):
    """A DPO-shaped variant (every evaluation at the budget) keeps its primary metric and its mark; the curve metrics
    are withheld for the task, and the page says whose curve is too short instead of blaming every curve."""
    import json

    from benchmarks.report.matrix import report
    from benchmarks.store import ResultStore
    from tests.benchmarks.report.test_matrix import BUDGET, _write_cell

    out = tmp_path / "m"
    cells = []
    for variant in ("steady", "upfront"):
        for seed in range(3):
            curve = [0.2, 0.4, 0.5 + 0.01 * seed, 0.55, 0.6 + 0.01 * seed]
            cell = _write_cell(out, "t", variant, seed, 32, curve, 2.0, {})
            if variant == "upfront":  # its samples all drawn before the first step
                path = out / cell["dir"] / "metrics.jsonl"
                rows = [json.loads(line) for line in path.read_text().splitlines()]
                for i, row in enumerate(rows):
                    row["completions"] = float(BUDGET) if i == 0 else 0.0
                path.write_text("".join(json.dumps(r) + "\n" for r in rows))
            cells.append(cell)
    (out / "matrix.json").write_text(json.dumps({"name": "test", "cells": cells, "sessions": []}))
    store = ResultStore.open(out)
    for cell in cells:
        cell_dir = out / cell["dir"]
        store.put(cell["dir"], {k: v for k, v in cell.items() if k != "dir"},
                  json.loads((cell_dir / "summary.json").read_text()),
                  [json.loads(line) for line in (cell_dir / "metrics.jsonl").read_text().splitlines()])
    report(out, plot=False)
    verdicts = pd.read_csv(out / "tables" / "verdicts.csv").set_index("variant")
    assert verdicts["primary_mean"].notna().all() and (verdicts["model_seeds"] == 3).all()
    assert verdicts.loc["upfront", "curve_evaluations"] == 1 and verdicts.loc["steady", "curve_evaluations"] == 4
    text = (out / "README.md").read_text()
    assert ("AUC and completions to a threshold are not shown: the curve over completions of `upfront` has fewer "
            "than 3 distinct completion counts after the start") in text
