"""The verdict's interval is calibrated: the coverage simulation (Welch t reaches nominal coverage with 3 and 5
seeds, the percentile bootstrap it replaced does not), the A/A false-separation rate on identical variants,
the matrix file's ``equivalent`` groups, and the report-side statistics beside the marks (power, collapse
with its Wilson interval, ScaleRL's scaling fit). Seeded and fast."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as st

from benchmarks.report import calibration, fits, stats, verdicts


# ------------------------------------------------------------------------------------------------
# Coverage
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def simulated():
    scenarios = {k: calibration.SCENARIOS[k] for k in ("equal spread", "unequal spread")}
    return calibration.coverage(("percentile", "paired", "welch"), (3, 5), sims=1500, reps=400, scenarios=scenarios,
                                seed=1)


def _coverage(table, method, seeds, scenario):
    return table[(table["method"] == method) & (table["seeds"] == seeds) & (table["scenario"] == scenario)]["coverage"].item()


@pytest.mark.parametrize("seeds", [3, 5])
@pytest.mark.parametrize("scenario", ["equal spread", "unequal spread"])
def test_the_verdicts_interval_reaches_nominal_coverage_and_the_bootstrap_did_not(simulated, seeds, scenario):
    assert stats.METHOD == "welch"
    chosen = _coverage(simulated, stats.METHOD, seeds, scenario)
    old = _coverage(simulated, "percentile", seeds, scenario)
    assert chosen >= 0.93, (seeds, scenario, chosen)
    assert old < 0.93 and old < chosen - 0.03, (seeds, scenario, old, chosen)


def test_the_simulated_intervals_are_the_report_functions_intervals():
    rng = np.random.default_rng(5)
    a, b = calibration.simulate_seeds(5, 4, 0.05, 0.05, 0.0, rng)
    low, high = calibration.welch_intervals(a, b)
    plow, phigh = calibration.paired_intervals(a, b)
    for i in range(4):
        diff, lo, hi = stats.welch_interval(a[i], b[i])
        assert (lo, hi) == pytest.approx((low[i], high[i]))
        ref = st.ttest_ind(a[i], b[i], equal_var=False).confidence_interval(0.95)
        assert (lo, hi) == pytest.approx((ref.low, ref.high))
        assert stats.paired_t_interval(a[i], b[i])[1:] == pytest.approx((plow[i], phigh[i]))
        ref = st.ttest_rel(a[i], b[i]).confidence_interval(0.95)
        assert (plow[i], phigh[i]) == pytest.approx((ref.low, ref.high))


def test_bca_is_computed_and_no_better_than_percentile_at_3_seeds():
    table = calibration.coverage(("percentile", "bca"), (3,), sims=400, reps=300,
                                 scenarios={"equal spread": calibration.SCENARIOS["equal spread"]}, seed=2)
    assert (table["coverage"] < 0.9).all()


# ------------------------------------------------------------------------------------------------
# A/A pairs
# ------------------------------------------------------------------------------------------------


def _identical_cells(tasks: int, variants: list[str], seeds: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = [{"task": f"t{t}", "variant": v, "seed": s, "final_accuracy": 0.7 + 0.05 * rng.standard_normal()}
            for t in range(tasks) for v in variants for s in range(seeds)]
    return pd.DataFrame(rows)


@pytest.mark.parametrize("seeds", [3, 5])
def test_identical_variants_are_separated_at_most_5_percent_of_the_time(seeds):
    variants = ["a", "b", "c", "d"]
    cells = _identical_cells(600, variants + ["other"], seeds, seed=seeds)
    rate, pairs = calibration.false_separation_rate(cells, [variants])
    assert pairs == 600 * 6  # "other" is in no group
    assert rate <= 0.05, rate  # expected about 0.036 (3 seeds) and 0.044 (5 seeds), seeded
    few = cells[cells["task"].isin([f"t{t}" for t in range(20)])]
    old, _ = calibration.false_separation_rate(few, [variants], method="percentile", reps=300)
    assert old > 0.08, old  # the bootstrap's narrow intervals separate identical variants


def test_equivalent_groups_come_from_the_matrix_file():
    toml = 'name = "m"\nequivalent = [["grpo(level=token,mu=1)", "grpo(level=sequence,mu=1)", "grpo_sapo"], ["x"]]\n'
    assert calibration.equivalent_groups({"toml": toml}) == [
        ["grpo(level=token,mu=1)", "grpo(level=sequence,mu=1)", "grpo_sapo"]]  # a group of one pairs nothing
    assert calibration.equivalent_groups({"toml": 'name = "m"\n'}) == []
    assert calibration.equivalent_groups(None) == []
    with pytest.raises(ValueError, match="list of lists"):
        calibration.equivalent_groups({"toml": 'equivalent = ["a", "b"]\n'})


# ------------------------------------------------------------------------------------------------
# Power, collapse, threshold, scaling fits
# ------------------------------------------------------------------------------------------------


def test_minimum_detectable_difference():
    df = 8
    expected = (st.t.ppf(0.975, df) + st.t.ppf(0.8, df)) * 0.05 * math.sqrt(2 / 5)
    assert stats.minimum_detectable_difference(0.05, 5) == pytest.approx(expected)
    assert stats.minimum_detectable_difference(0.05, 3) > stats.minimum_detectable_difference(0.05, 5)
    assert math.isnan(stats.minimum_detectable_difference(0.05, 1))
    cells = _identical_cells(2, ["a", "b"], 5, seed=0)
    table = verdicts.power(cells).set_index("task")
    sd = math.sqrt(cells[cells["task"] == "t0"].groupby("variant")["final_accuracy"].var().mean())
    assert table.loc["t0", "seeds"] == 5 and table.loc["t0", "pooled_sd"] == pytest.approx(sd)
    assert table.loc["t0", "mdd"] == pytest.approx(stats.minimum_detectable_difference(sd, 5))


def test_contenders_mdd_leaves_out_a_noisy_loser():
    """The MDD that decides the close calls is the contenders' (best and tied), not one inflated by a variant
    that collapses on some seeds: a, b near 0.9 with sd 0.01, c spread over 0.1-0.7."""
    rows = [{"task": "t", "variant": v, "seed": s, "final_accuracy": x}
            for v, xs in (("a", [0.90, 0.91, 0.89, 0.90, 0.92]), ("b", [0.89, 0.90, 0.91, 0.88, 0.90]),
                          ("c", [0.1, 0.7, 0.4, 0.2, 0.6]))
            for s, x in enumerate(xs)]
    cells = pd.DataFrame(rows)
    marks = pd.DataFrame({"task": ["t"] * 3, "variant": ["a", "b", "c"],
                          "mark": [stats.BEST, stats.TIED, stats.WORSE]})
    row = verdicts.power(cells, marks=marks).set_index("task").loc["t"]
    sd_ab = math.sqrt((np.var([0.90, 0.91, 0.89, 0.90, 0.92], ddof=1) + np.var([0.89, 0.90, 0.91, 0.88, 0.90], ddof=1)) / 2)
    assert row["contenders"] == "a, b" and row["contenders_seeds"] == 5
    assert row["contenders_sd"] == pytest.approx(sd_ab)
    assert row["contenders_mdd"] == pytest.approx(stats.minimum_detectable_difference(sd_ab, 5))
    assert row["contenders_mdd"] < 0.03 < row["mdd"]  # the pooled one carries c's spread
    # a best that stands alone is compared with its nearest rival
    alone = marks.assign(mark=[stats.BEST, stats.WORSE, stats.WORSE])
    assert verdicts.contenders(alone) == ["a", "b"]


def test_wilson_interval():
    assert stats.wilson_interval(0, 5) == pytest.approx((0.0, 0.4345), abs=1e-4)
    assert stats.wilson_interval(5, 5) == pytest.approx((0.5655, 1.0), abs=1e-4)
    low, high = stats.wilson_interval(1, 5)
    assert low == pytest.approx(0.0362, abs=1e-4) and high == pytest.approx(0.6245, abs=1e-4)
    assert all(math.isnan(v) for v in stats.wilson_interval(0, 0))


@pytest.mark.parametrize("curve, expected", [
    ([0.4, 0.8, 0.85, 0.5, 0.5], True),  # 0.35 below the peak at the end
    ([0.4, 0.8, 0.85, 0.5, 0.8], False),  # recovered
    ([0.4, 0.5, 0.45, 0.42, 0.39], True),  # ended below the start
    ([0.4, 0.6, 0.7, 0.65, 0.6], False),
])
def test_collapse(curve, expected):
    assert stats.collapsed(curve) is expected


def test_completions_to_threshold_is_interpolated_between_evaluations():
    x, y = [0, 64, 128, 192], [0.2, 0.5, 0.78, 0.8]
    assert stats.completions_to_threshold(x, y, 0.64) == pytest.approx(96.0)  # half way from 0.5 to 0.78
    assert stats.completions_to_threshold(x, y, 0.64, interpolate=False) == 128
    assert stats.completions_to_threshold(x, y, 0.1) == 0 and stats.completions_to_threshold(x, y, 0.9) == math.inf


def test_scaling_fit_recovers_a_known_sigmoid_and_extrapolates():
    grid = np.linspace(0, 8192, 9)
    truth = fits.sigmoid(grid[1:], 0.4, 0.85, 2000.0, 1.5)
    rng = np.random.default_rng(0)
    rows = []
    for seed in range(5):
        acc = np.concatenate([[0.4], truth + 0.01 * rng.standard_normal(len(truth))])
        rows += [{"task": "t", "variant": "v", "seed": seed, "completions": c, "accuracy": a} for c, a in zip(grid, acc)]
    table = fits.scaling_fits(pd.DataFrame(rows), reps=30)
    row = table.iloc[0]
    assert row["A"] == pytest.approx(0.85, abs=0.03) and row["C_mid"] == pytest.approx(2000, rel=0.15)
    assert row["A_low"] <= row["A"] <= row["A_high"] and row["C_mid_low"] <= row["C_mid"] <= row["C_mid_high"]
    assert row["half_mae"] < 0.03 and abs(row["half_final_error"]) < 0.05


# ------------------------------------------------------------------------------------------------
# In the verdicts
# ------------------------------------------------------------------------------------------------


def test_the_verdict_section_shows_power_collapse_scaling_and_the_aa_check():
    grid = np.linspace(0, 1024, 5)
    rng = np.random.default_rng(3)
    finals = {"a": 0.80, "b": 0.80, "c": 0.50}
    per_cell, long, cells = [], [], []
    for variant, final in finals.items():
        for seed in range(5):
            curve = 0.2 + (final - 0.2) * grid / (grid + 200) * 1.2 + 0.01 * rng.standard_normal(len(grid))
            curve[0] = 0.2
            if variant == "c" and seed == 0:
                curve[-1] = 0.1  # collapsed: ends below the start
            per_cell.append({"task": "t", "variant": variant, "seed": seed, "budget": 1024.0, "accuracy_before": 0.2,
                             "final_accuracy": curve[-1], "auc": stats.normalised_auc(grid, curve, 1024),
                             "collapsed": stats.collapsed(curve), "completions_to_threshold": 300.0})
            long += [{"task": "t", "variant": variant, "seed": seed, "completions": c, "accuracy": y}
                     for c, y in zip(grid, curve)]
            cells.append({"task": "t", "variant": variant, "seed": seed, "status": "complete", "wall_clock_s": 1.0,
                          "peak_memory_bytes": 2.0**20})
    curves = {"cells": pd.DataFrame(per_cell), "completions": pd.DataFrame(long), "thresholds": {"t": 0.6}}
    meta = {"toml": 'equivalent = [["a", "b"]]\nname = "m"\n'}
    analysis = verdicts.analyse(pd.DataFrame(cells), curves, reps=200, meta=meta)
    row = analysis["tasks"].set_index("variant").loc["c"]
    assert row["collapsed"] == 1 and row["collapse_rate"] == pytest.approx(0.2)
    assert (row["collapse_low"], row["collapse_high"]) == pytest.approx(stats.wilson_interval(1, 5))
    assert list(analysis["aa"][["a", "b"]].itertuples(index=False, name=None)) == [("a", "b")]
    assert set(analysis["scaling_fits"]["variant"]) == {"a", "b", "c"}
    text = verdicts.render(analysis)
    assert "MDD " in text and "(5 seeds, pooled seed-to-seed sd " in text
    assert "| 1/5 [0.04, 0.62] |" in text and "A/A check: of the 1 pairs" in text
    assert "asymptote A [95% CI]" in text
    brief = verdicts.render(analysis, scaling=False)
    assert "asymptote A [95% CI]" not in brief and "tables/scaling_fits.csv" in brief


# ------------------------------------------------------------------------------------------------
# grpo-bench calibration: the committed numbers
# ------------------------------------------------------------------------------------------------


def test_simulated_aa_false_separation_is_near_nominal_for_welch_and_high_for_the_bootstrap():
    from benchmarks.report import calibration_report

    table = calibration_report.simulated_false_separation(("welch", "percentile"), (3, 5), sims=2000, reps=500)
    rate = table.set_index(["method", "seeds"])["false_separation"]
    assert 0.02 <= rate[("welch", 3)] <= 0.07 and 0.02 <= rate[("welch", 5)] <= 0.07
    assert rate[("percentile", 3)] > 0.12  # the bootstrap the verdicts used to use: 2-4x the nominal rate


def test_calibration_report_reads_declared_groups_and_counts_separated_pairs(tmp_path, monkeypatch):
    from benchmarks.report import calibration_report

    matrix = tmp_path / "m.toml"
    matrix.write_text('equivalent = [["a", "b"]]\n')
    assert calibration_report.declared_groups({"toml": 'equivalent = [["x", "y"]]'}) == ([["x", "y"]], "the matrix file as it ran")
    groups, source = calibration_report.declared_groups({"toml": "name = 'm'", "file": str(matrix)})
    assert groups == [["a", "b"]] and "declared after the run" in source
    assert calibration_report.declared_groups({"toml": "name = 'm'"}) == ([], "none declared")

    rng = np.random.default_rng(0)
    cells = pd.DataFrame([{"task": t, "variant": v, "seed": s, "final_accuracy": base + shift + 0.01 * rng.standard_normal()}
                          for t, base in (("t1", 0.5), ("t2", 0.8)) for v, shift in (("a", 0.0), ("b", 0.0), ("c", 0.2))
                          for s in range(5)])
    cells.loc[(cells["task"] == "t2") & (cells["variant"] == "b"), "final_accuracy"] += 0.3  # a planted "A/A" gap
    monkeypatch.setattr("benchmarks.report.matrix.collect", lambda d: {"meta": {"toml": 'equivalent = [["a", "b"]]'},
                                                                       "cells": cells, "evals": None})
    monkeypatch.setattr("benchmarks.report.curves.build", lambda cells_, evals: {"cells": cells_})
    measured, sources = calibration_report.measured_false_separation([tmp_path / "m1"])
    assert sources == {"m1": "the matrix file as it ran"}
    assert measured.set_index("task")["separated"].to_dict() == {"t1": False, "t2": True}
    cover = calibration.coverage(("welch",), (3,), sims=200, reps=10)
    simulated = calibration_report.simulated_false_separation(("welch",), (3,), sims=200, reps=10)
    text = calibration_report.render(cover, simulated, measured, sources, "grpo-bench calibration m1")
    assert "1 of 2 separated (50%" in text and "| m1 | t2 | `a` | `b` |" in text


def test_calibration_command_refuses_a_directory_without_a_matrix(run_cli, tmp_path):
    code, _, err = run_cli("calibration", tmp_path, "--out", tmp_path / "out")
    assert code == 2 and "not a matrix directory" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli("calibration", tmp_path, "--sims", "5", "--out", tmp_path / "out")
    assert code == 2 and "--sims" in err
