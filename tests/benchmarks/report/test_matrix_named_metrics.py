"""The training metrics a matrix file's [report] names: per variant, the mean over seeds of each cell's mean over its
steps, in the matrix's README (hand-made store, no training); none named, no such table."""

import json

import pandas as pd
import pytest

from benchmarks.report.matrix import named_metric_means, report
from benchmarks.store import ResultStore
from tests.benchmarks.report.test_matrix import _write_cell

CPS = 32  # 8 steps of the test budget (256): a metric logged as v + 0.01 * step has the cell mean v + 0.045
TOML = '[report]\nmetrics = ["mismatch/kl_v2", "mismatch/ratio_outside"]\n'


def _matrix(out, toml):
    # variant "a" logs both metrics, v = 0.1 at seed 0 and 0.3 at seed 1; "b" logs only kl_v2, 0.2 at both seeds
    cells = [_write_cell(out, "t", "a", seed, CPS, [0.2, 0.3, 0.4, 0.5, 0.6], 1.0,
                         {"mismatch/kl_v2": 0.1 + 0.2 * seed, "mismatch/ratio_outside": 0.5}) for seed in (0, 1)]
    cells += [_write_cell(out, "t", "b", seed, CPS, [0.2, 0.3, 0.4, 0.5, 0.6], 1.0, {"mismatch/kl_v2": 0.2})
              for seed in (0, 1)]
    (out / "matrix.json").write_text(json.dumps({"name": "named", "cells": cells, "sessions": [], "toml": toml}))
    store = ResultStore.open(out)
    for cell in cells:
        spec = {k: v for k, v in cell.items() if k != "dir"}
        cell_dir = out / cell["dir"]
        store.put(cell["dir"], spec, json.loads((cell_dir / "summary.json").read_text()),
                  [json.loads(line) for line in (cell_dir / "metrics.jsonl").read_text().splitlines()])
    return out


def test_the_named_metrics_means_per_cell_and_per_variant(tmp_path):
    out = _matrix(tmp_path / "m", TOML)
    data = report(out, plot=False, progress=False)
    per_cell = named_metric_means(data["steps"], ["mismatch/kl_v2", "mismatch/ratio_outside"])
    assert per_cell["mismatch/kl_v2"].tolist() == pytest.approx([0.145, 0.345, 0.245, 0.245])
    assert per_cell["mismatch/ratio_outside"].iloc[:2].tolist() == pytest.approx([0.545, 0.545])
    assert per_cell["mismatch/ratio_outside"].iloc[2:].isna().all()  # "b" never logged it
    text = (out / "README.md").read_text()
    table = text[text.index("([report] metrics)"):]
    # "a": cells 0.145 and 0.345, mean 0.245, half-width t(0.975, 1) x sd 0.1414 / sqrt(2) = 12.706 x 0.1 = 1.27
    assert "| t | a | 2 | 0.245 ± 1.27 | 0.545 ± 0 |" in table
    assert "| t | b | 2 | 0.245 ± 0 | - |" in table


def test_no_named_metric_no_table(tmp_path):
    out = _matrix(tmp_path / "m", 'name = "named"\n')
    report(out, plot=False, progress=False)
    assert "[report] metrics" not in (out / "README.md").read_text()
    assert named_metric_means(pd.DataFrame(), ["x"]).columns.tolist() == ["task", "variant", "seed", "x"]
