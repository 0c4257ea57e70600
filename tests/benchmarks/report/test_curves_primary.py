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
