"""pass@k in a matrix's report, read from a hand-made store (no training): per task and variant the mean pass@k
before and after training with t-intervals over seeds, after - before paired by seed, the variants without pass@k
named, pass@k columns in cells.csv; a matrix without pass@k shows nothing new and the verdicts never read it."""

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from benchmarks.report import passk_table
from benchmarks.report.matrix import collect, report
from benchmarks.store import ResultStore

BUDGET, CPS = 64, 16
SEEDS = (0, 1, 2)
# Variant a's pass@1 before training differs a lot from seed to seed and its gain little: the interval of after -
# before paired by seed is narrow, an unpaired one (after's spread and before's added) is wide.
BEFORE_1 = {0: 0.10, 1: 0.30, 2: 0.50}
GAIN_1 = {0: 0.20, 1: 0.22, 2: 0.18}
BEFORE_4, AFTER_4 = {0: 0.40, 1: 0.55, 2: 0.70}, {0: 0.50, 1: 0.60, 2: 0.90}


def _cell(variant, seed, pass_at_k=None, status="complete"):
    """(planned cell, summary, metrics rows) of a cell of task t: 4 steps of 16 completions, one evaluation."""
    steps = BUDGET // CPS
    spec = {"task_label": "t", "task": "t", "variant": variant, "algo": "grpo", "seed": seed, "steps": steps,
            "budget": BUDGET, "completions_per_step": CPS, "settings": {"learning_rate": 1e-4}}
    rows = [{"step": s, "completions": float(CPS), "loss": 0.1 * s, "reward/mean": 0.2, "time/step": 0.5,
             "time/wall": 0.5 * s, **({"eval/accuracy": 0.3 + 0.01 * seed} if s == 2 else {})}
            for s in range(1, steps + 1)]
    summary = {"status": status, "task": "t", "seed": seed, "steps": steps, "accuracy_before": 0.1,
               "accuracy_after": 0.4 + 0.05 * seed + (0.1 if variant == "a" else 0.0), "reward_before": 0.1,
               "reward_after": 0.4, "completions_generated": BUDGET, "wall_clock_s": 3.0, "time_per_step_s": 0.75,
               "precision": "fp32", "device": "cpu", "device_name": "cpu"}
    if status != "complete":
        summary = {"status": status, "error": "RuntimeError: planted", "seed": seed}
    if pass_at_k:
        summary["pass_at_k_before"], summary["pass_at_k_after"] = pass_at_k
    return {"dir": f"t/{variant}/seed{seed}", **spec}, summary, rows


def _matrix(tmp_path, cells, name="m"):
    out = tmp_path / name
    out.mkdir()
    store = ResultStore.open(out)
    for cell, summary, rows in cells:
        store.cells[cell["dir"]] = {"spec": {k: v for k, v in cell.items() if k != "dir"}, "summary": summary}
        store.steps[cell["dir"]] = rows
    store.write()
    (out / "matrix.json").write_text(json.dumps({"name": name, "cells": [c for c, _, _ in cells], "sessions": []}))
    return out


def _planted(tmp_path):
    """Variant a: pass@1 and pass@4 on every seed; b: pass@1 on seeds 0 and 1, its seed 2 failed; c: none."""
    cells = []
    for seed in SEEDS:
        before = {"1": BEFORE_1[seed], "4": BEFORE_4[seed]}
        after = {"1": BEFORE_1[seed] + GAIN_1[seed], "4": AFTER_4[seed]}
        cells.append(_cell("a", seed, (before, after)))
        b = ({"1": 0.2}, {"1": 0.1 + 0.1 * seed})
        cells.append(_cell("b", seed, b, status="failed" if seed == 2 else "complete"))
        cells.append(_cell("c", seed))
    return _matrix(tmp_path, cells)


def test_the_means_and_the_paired_difference_are_the_t_intervals_over_seeds(tmp_path):
    table = passk_table.summarize(collect(_planted(tmp_path))["cells"])
    assert set(zip(table["variant"], table["k"])) == {("a", 1), ("a", 4), ("b", 1)}  # c recorded none
    a1 = table[(table["variant"] == "a") & (table["k"] == 1)].iloc[0]
    before = np.array([BEFORE_1[s] for s in SEEDS])
    after = before + np.array([GAIN_1[s] for s in SEEDS])
    paired = stats.ttest_rel(after, before).confidence_interval(0.95)
    assert (a1["difference_low"], a1["difference_high"]) == pytest.approx((paired.low, paired.high), abs=1e-12)
    assert a1["difference_mean"] == pytest.approx(0.20)
    # the paired interval, not one over the two means' spreads (which would reach below 0 here)
    unpaired = stats.ttest_ind(after, before, equal_var=False).confidence_interval(0.95)
    assert unpaired.low < 0 < paired.low and paired.high - paired.low < 0.2 * (unpaired.high - unpaired.low)
    low, high = stats.t.interval(0.95, 2, loc=after.mean(), scale=stats.sem(after))
    assert a1["after_mean"] == pytest.approx(after.mean()) and a1["after_ci95"] == pytest.approx((high - low) / 2)
    assert (a1["seeds"], a1["n_before"], a1["n_after"], a1["n_paired"]) == (3, 3, 3, 3)
    a4 = table[(table["variant"] == "a") & (table["k"] == 4)].iloc[0]
    assert a4["difference_mean"] == pytest.approx(np.mean([AFTER_4[s] - BEFORE_4[s] for s in SEEDS]))
    b1 = table[table["variant"] == "b"].iloc[0]  # its failed seed is left out of the means
    assert (b1["seeds"], b1["after_mean"], b1["before_ci95"]) == (2, pytest.approx(0.15), pytest.approx(0.0))


def test_the_report_shows_a_table_per_task_names_the_variants_left_out_and_leaves_the_verdicts_alone(tmp_path):
    out = _planted(tmp_path)
    data = report(out, plot=False, progress=False)
    readme = (out / "README.md").read_text()
    section = readme[readme.index("#### pass@k before and after training"):]
    before = np.array([BEFORE_1[s] for s in SEEDS])
    paired = stats.ttest_rel(before + np.array([GAIN_1[s] for s in SEEDS]), before).confidence_interval(0.95)
    row_a = next(line for line in section.splitlines() if line.startswith("| a |"))
    assert row_a.startswith(f"| a | 3 | {before.mean():.3f} ± ")
    assert f"+0.200 [{paired.low:+.3f}, {paired.high:+.3f}]" in row_a
    row_b = next(line for line in section.splitlines() if line.startswith("| b |"))
    assert row_b.startswith("| b | 2 | 0.200 ± 0.000 | 0.150 ± ") and row_b.endswith("| - | - | - |")  # no pass@4
    assert "Left out on `t` (no complete cell recorded pass@k): `c`." in section
    assert "pass@4 after - before" in section
    verdicts = readme[readme.index("### Verdicts"):readme.index("#### Every measured number")]
    assert "pass@" not in verdicts and "pass_at" not in data["analysis"]["tasks"].columns.str.cat()
    cells = pd.read_csv(out / "tables" / "cells.csv")
    a = cells[cells["variant"] == "a"].set_index("seed")
    assert a["pass_at_1_after"].to_dict() == pytest.approx({s: BEFORE_1[s] + GAIN_1[s] for s in SEEDS})
    assert a["pass_at_4_before"].to_dict() == pytest.approx(BEFORE_4)
    assert cells.loc[cells["variant"] == "c", "pass_at_1_after"].isna().all()
    assert not any("pass" in c for c in pd.read_csv(out / "tables" / "evals.csv").columns)  # no dict in a CSV cell
    table = pd.read_csv(out / "tables" / "pass_at_k.csv")
    assert len(table) == 3 and "tables/pass_at_k.csv" in readme
    page = (out / "index.html").read_text()
    shown = page[page.index('<section id="pass-at-k">'):page.index('<section id="cost">')]
    assert f"+0.200 [{paired.low:+.3f}, {paired.high:+.3f}]" in shown and "<code>c</code>" in shown


def test_a_single_seed_says_its_interval_is_not_there(tmp_path):
    out = _matrix(tmp_path, [_cell("a", 0, ({"1": 0.2}, {"1": 0.5}))])
    text = passk_table.markdown(collect(out)["cells"])
    assert "| a | 1 | 0.200 ± n/a (1 seed) | 0.500 ± n/a (1 seed) | +0.300 [n/a (1 seed)] |" in text


def test_a_matrix_without_pass_at_k_shows_nothing_new(tmp_path):
    out = _matrix(tmp_path, [_cell(v, s) for v in ("a", "b") for s in SEEDS])
    report(out, plot=False, progress=False)
    assert "pass@" not in (out / "README.md").read_text() and "pass-at-k" not in (out / "index.html").read_text()
    assert not (out / "tables" / "pass_at_k.csv").exists()
    assert not any(c.startswith("pass_at") for c in pd.read_csv(out / "tables" / "cells.csv").columns)
    assert passk_table.markdown(collect(out)["cells"]) == ""


def test_cell_columns_orders_k_as_numbers():
    columns = passk_table.cell_columns({"pass_at_k_before": {"16": 0.5, "4": 0.3}, "pass_at_k_after": {"16": 0.6}})
    assert list(columns) == ["pass_at_4_before", "pass_at_16_before", "pass_at_16_after"]
    assert passk_table.cell_columns({"pass_at_k_before": None}) == {} and not math.isnan(columns["pass_at_4_before"])
