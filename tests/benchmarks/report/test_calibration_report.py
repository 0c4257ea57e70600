"""``grpo-bench calibration`` (benchmarks/report/calibration_report.py): the verdict procedure's family-wise error
simulated at a matrix's design, on real A/A cells and on declared pairs; and the report-side statistics beside the
marks (collapse with its Wilson interval, ScaleRL's scaling fit). Seeded and fast."""

import math

import numpy as np
import pandas as pd
import pytest

from benchmarks.report import fits, stats, verdicts
from tests.conftest import ROOT


# ------------------------------------------------------------------------------------------------
# Power, collapse, threshold, scaling fits
# ------------------------------------------------------------------------------------------------


def test_wilson_interval():
    assert stats.wilson_interval(0, 5) == pytest.approx((0.0, 0.4345), abs=1e-4)
    assert stats.wilson_interval(5, 5) == pytest.approx((0.5655, 1.0), abs=1e-4)
    low, high = stats.wilson_interval(1, 5)
    assert low == pytest.approx(0.0362, abs=1e-4) and high == pytest.approx(0.6245, abs=1e-4)
    assert all(math.isnan(v) for v in stats.wilson_interval(0, 0))


@pytest.mark.parametrize("curve, expected", [
    ([0.4, 0.8, 0.85, 0.5, 0.5], True),  # 0.35 below the peak at the end
    ([0.4, 0.8, 0.85, 0.5, 0.8], False),  # recovered
    ([0.4, 0.5, 0.45, 0.42, 0.39], False),  # ended a little below the start: not a collapse
    ([0.4, 0.6, 0.7, 0.65, 0.6], False),
    ([0.4, 0.8, 0.4, 0.8, 0.45], True),  # fell, recovered, fell again: still 0.35 below its peak at the end
    ([0.5, 0.3, 0.2, 0.1], True),  # never learned, and fell 0.4 below its start
])
def test_collapse(curve, expected):
    assert stats.collapsed(curve) is expected


@pytest.mark.parametrize("curve, expected", [([0.4, 0.4, 0.3, 0.39], True), ([0.4, 0.41, 0.3], False), ([0.4], False)])
def test_never_learned(curve, expected):
    assert stats.never_learned(curve) is expected


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
                curve[-1] = 0.1  # collapsed: ends 0.3 or more below its peak
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
    assert "MDD (the gap to the best called" in text and "Model: blocked by seed (3 variants x 5 seeds" in text
    assert "| 1/5 [0.04, 0.62] |" in text and "A/A check: of the 1 pairs" in text
    assert "asymptote A [95% CI]" in text
    brief = verdicts.render(analysis, scaling=False)
    assert "asymptote A [95% CI]" not in brief and "tables/scaling_fits.csv" in brief


# ------------------------------------------------------------------------------------------------
# grpo-bench calibration: the committed numbers
# ------------------------------------------------------------------------------------------------


def test_calibration_report_on_a_real_aa_matrix_and_declared_pairs(monkeypatch):
    """The A/A part cuts one variant's cells into null matrices and judges them; a matrix of two variants is no
    A/A; declared pairs separated or not are counted in the headline."""
    from benchmarks.report import calibration_report, inference

    rng = np.random.default_rng(0)
    aa = pd.DataFrame({"task": "t", "variant": "g", "seed": range(40), "primary": 0.9 + 0.01 * rng.standard_normal(40)})
    monkeypatch.setattr(calibration_report, "_primary_cells", lambda d: ("aa", {"primary": "final", "margin": 0.02}, aa))
    summary, rates = calibration_report.real_aa("aa", shapes=((6, 3), (4, 5), (15, 4)), draws=200, outer=20, inner=50,
                                                reps=300)
    assert summary["cells"] == 40 and list(rates["variants"]) == [6, 4]  # 15 x 4 needs 60 cells
    assert (rates["false_claim"] <= 0.12).all() and (rates["low"] <= rates["high"]).all()
    two = aa.assign(variant=["g", "h"] * 20)
    monkeypatch.setattr(calibration_report, "_primary_cells", lambda d: ("m", {"primary": "final"}, two))
    with pytest.raises(ValueError, match="one variant, found 2"):
        calibration_report.real_aa("m")
    pairs = pd.DataFrame({"matrix": ["m", "m"], "task": ["t1", "t2"], "a": ["a", "a"], "b": ["b", "b"],
                          "diff": [0.0, 0.3], "half_width": [0.05, 0.05], "separated": [False, True]})
    sim = pd.DataFrame([{"matrix": "m", "task": "t1", "variants": 3, "seeds": 5, "scenario": "global null",
                         **inference.family_error(inference.Design(3, 5), sims=100, reps=100)}])
    text = calibration_report.render(sim, [(summary, rates)], pairs, "grpo-bench calibration m --aa aa")
    assert "1 of 2 declared-equivalent pairs separated" in text and "| m | t2 | `a` | `b` |" in text
    assert "on real A/A replicates of `aa` (6 x 3:" in text
    other = ({**summary, "matrix": "aa-real", "dir": "aa-real"}, rates.iloc[:1])  # a second --aa, reported on its own
    both = calibration_report.render(sim, [(summary, rates), other], pairs, "grpo-bench calibration m --aa aa aa-real")
    assert both.count("## Real A/A replicates") == 1 and "`aa-real` (aa-real)" in both
    assert "on real A/A replicates of `aa` (6 x 3:" in both and "on real A/A replicates of `aa-real` (6 x 3:" in both


def test_calibration_command_refuses_a_directory_without_a_matrix(run_cli, tmp_path):
    code, _, err = run_cli("calibration", tmp_path, "--out", tmp_path / "out")
    assert code == 2 and "not a matrix directory" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli("calibration", tmp_path, "--sims", "5", "--out", tmp_path / "out")
    assert code == 2 and "--sims" in err
    code, _, err = run_cli("calibration", tmp_path, "--claims-sims", "50", "--out", tmp_path / "out")
    assert code == 2 and "--claims-sims must be at least 100, got 50" in err and len(err.strip().splitlines()) == 1


def test_calibration_report_judges_a_claims_matrix_at_its_design_and_on_the_aa_cells(monkeypatch):
    """--claims FILE: the claims' procedure simulated at the file's own design (variants, seeds, contrasts) and on the
    A/A cells cut into null matrices of the same variants and contrasts."""
    from benchmarks.matrix import parse
    from benchmarks.report import calibration_report

    design = calibration_report.claims_design(parse(ROOT / "benchmarks/matrices/claims_toy.toml"))
    assert (design["k"], design["n"], len(design["pairs"]), design["margin"]) == (15, 8, 12, 0.02)
    assert design["pairs"][0] == (design["variants"].index("clip_higher_mu2"), design["variants"].index("grpo_mu2"))
    rates = calibration_report.claims_simulated(design, sims=100, reps=200)
    assert list(rates["scenario"])[0] == "global null, equal sds" and len(rates) == 1 + 2 * calibration_report.CLAIM_PATTERNS
    assert (rates["false_claim"] <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / 100)).all()
    first = np.random.default_rng(3)  # each spread's first pattern is the single draw of before, the same generator
    half, one = (np.exp(first.normal(0.0, s, design["k"])) for s in (0.5, 1.0))
    labels = list(rates["scenario"])
    assert labels[1] == f"global null, log-sd spread 0.5, sd pattern 1 of 4 (largest/smallest sd {half.max() / half.min():.1f})"
    assert labels[5] == f"global null, log-sd spread 1, sd pattern 1 of 4 (largest/smallest sd {one.max() / one.min():.1f})"
    ratios = {label.rsplit("sd ", 1)[1] for label in labels[5:]}
    assert len(ratios) > 1  # the further patterns are other draws, not the first one again
    rng = np.random.default_rng(1)
    aa = pd.DataFrame({"task": "t", "variant": "g", "seed": range(60), "primary": 0.86 + 0.008 * rng.standard_normal(60)})
    monkeypatch.setattr(calibration_report, "_primary_cells", lambda d: ("aa", {"primary": "last_3", "margin": 0.02}, aa))
    real = calibration_report.claims_real_aa(design, "aa", draws=100, outer=5, inner=20, reps=200)
    assert (real["variants"], real["seeds"]) == (15, 4) and real["low"] <= real["high"]  # 60 cells: 4 seeds each
    text = calibration_report.render(pd.DataFrame(), [], pd.DataFrame(), "grpo-bench calibration", [(design, rates, real)])
    assert "## The claims of `claims-toy`" in text and "the claims of `claims-toy` (simulated at most" in text
    assert "15 variants and contrasts at 4 seeds each" in text


def test_calibration_report_simulates_a_planned_design_before_its_cells_run():
    """--plans FILE: a tuned matrix file's variants and evaluation seeds (not its tuning seeds), simulated under the
    global null with equal and unequal spreads and heavy tails, and under partial nulls; the headline names it."""
    from benchmarks.matrix import parse
    from benchmarks.report import calibration_report

    (design,) = calibration_report.plan_designs(parse(ROOT / "benchmarks/matrices/rg_verdict_chain_sum.toml"))
    assert (design["name"], design["task"], design["k"], design["n"]) == ("rg-verdict-chain-sum", "chain_sum", 8, 8)
    (lc,) = calibration_report.plan_designs(parse(ROOT / "benchmarks/matrices/rg_verdict_letter_counting.toml"))
    assert (lc["k"], lc["n"]) == (8, 6)
    rates = calibration_report.plan_simulated(design, sims=100, reps=500)
    assert list(rates["scenario"]) == [
        "global null, equal sds", "global null, unequal sds (log-sd spread 0.5)",
        "global null, unequal sds (log-sd spread 1)", "global null, one variant's sd 5x the others'",
        "global null, t noise (4 df)",
        "top 2 equal, the rest 1 sd apart below", "top 3 equal, the rest 1 sd apart below",
        "top 6 equal, the rest 1 sd apart below"]
    assert (rates["false_claim"] <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / 100)).all()  # unequal spreads included
    # the partial nulls have variants to call worse, and they are (pairs-v2, the current, two variants' shares of
    # 49 residual df; paired-v3, each pair on its own 7 per-seed df, gave 0.83 with the top 6 tied)
    assert (rates["any_worse"].iloc[5:] > 0.9).all()
    text = calibration_report.render(pd.DataFrame(), [], pd.DataFrame(), "grpo-bench calibration", planned=rates)
    assert "## Simulated at planned designs, before their cells run" in text
    assert f"at `rg-verdict-chain-sum`'s planned 8 x 8 (chain_sum) at most {rates['false_claim'].max():.3f} over 8" in text


def test_calibration_shows_its_progress_case_by_case_to_the_last(monkeypatch, capsys):
    """A calibration at --sims 1000 runs for many minutes: it counts its cases (each design's scenarios, each plan's,
    the A/A shapes, each claims file's spreads and its A/A part) up front and reports them done, all of them."""
    from benchmarks.matrix import parse
    from benchmarks.progress import progress
    from benchmarks.report import calibration_report, inference

    calls, claim_sims = [], []
    monkeypatch.setattr(inference, "family_error", lambda d, **kw: calls.append(d) or {"false_claim": 0.0})
    monkeypatch.setattr(inference, "contrast_error",
                        lambda *a, **kw: calls.append(a) or claim_sims.append(kw["sims"]) or {"false_claim": 0.0})
    design = {"matrix": "m", "task": "t", "k": 3, "n": 4, "sds": [0.01, 0.02, 0.01], "sd": 0.013}
    monkeypatch.setattr(calibration_report, "matrix_designs", lambda dirs: [design])
    monkeypatch.setattr(calibration_report, "declared_pairs", lambda dirs: pd.DataFrame())
    aa = pd.DataFrame({"task": "t", "variant": "g", "seed": range(10), "primary": np.linspace(0.8, 0.9, 10)})
    monkeypatch.setattr(calibration_report, "_primary_cells", lambda d: ("aa", {"primary": "final", "margin": 0.02}, aa))
    calibration_report.calibration(["m"], aa=["aa"], sims=100,
                                   claims=[parse(ROOT / "benchmarks/matrices/claims_toy.toml")],
                                   plans=[parse(ROOT / "benchmarks/matrices/rg_verdict_chain_sum.toml")],
                                   progress=progress, claims_sims=500)
    # 2 scenarios at m's 3 variants, 8 at the plan's 8 x 8, 4 A/A shapes (10 cells fill none), the claims' equal sds
    # and 4 sd patterns at each of 2 unequal spreads, + 1 on the A/A cells
    assert len(calls) == 2 + 8 + 9 and claim_sims == [500] * 9  # --claims-sims for the claims, --sims elsewhere
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("calibration (100 simulated matrices a case, 500 a claims case): 24/24 cases")



# ------------------------------------------------------------------------------------------------
# crossed-v4: the questions sampled too
# ------------------------------------------------------------------------------------------------


def test_crossed_v4_design_is_the_stores_own_parts():
    """The real-LM number_sequence store's design for crossed-v4's simulation: 8 x 6 x 300, each pair's seed,
    question and residual components split per variant (a pair's sum of two variants' comes close to its own), and
    the question share crossed.py reports. The split keeps the pairs' mean component (least squares, but for the
    clip at 1% of it: 1.03 of the question components' measured); the question components fit an additive split less
    well than the residuals (measured: median misfit 0.32 of the mean pair's question component, 0.07 of its
    residual one)."""
    from benchmarks.report import calibration_report, crossed, inference

    store = ROOT / "results" / "reasoning-gym" / "verdict-number-sequence"
    (design,) = calibration_report.crossed_designs([store, ROOT / "results" / "verdicts-tuned"])  # no records there
    assert (design["k"], design["n"], design["questions"], design["margin"]) == (8, 6, 300, 0.03)
    pairs = crossed.pair_variances(store)
    assert design["question_share"] == pytest.approx(pairs["question_share"].median(), rel=1e-9)
    index = {v: i for i, v in enumerate(design["variants"])}
    i, j = pairs["variant_i"].map(index).to_numpy(), pairs["variant_j"].map(index).to_numpy()
    for name, column in (("residual_sds", "sigma2_residual"), ("question_sds", "sigma2_question")):
        split = np.asarray(design[name]) ** 2
        assert (split[i] + split[j]).mean() == pytest.approx(pairs[column].mean(), rel=0.05), name
    split = np.asarray(design["residual_sds"]) ** 2
    assert np.median(np.abs(split[i] + split[j] - pairs["sigma2_residual"])) < 0.1 * pairs["sigma2_residual"].mean()
    scenarios = calibration_report._crossed_scenarios(design)
    assert [label for label, _ in scenarios][-1] == "global null, question parts x5"
    assert np.allclose(scenarios[-1][1].question_sd ** 2, 5 * np.asarray(design["question_sds"]) ** 2)
    assert all(d.questions == 300 and d.margin == 0.03 for _, d in scenarios)
    assert inference.PROCEDURES["crossed-v4"].per_question


def test_crossed_v4_on_the_real_aa_cells_and_its_section(tmp_path):
    """The A/A store's 24 cells with their per-question records cut into null matrices, judged by crossed-v4; the
    section lands between its markers, and ``main`` rewrites it alone, leaving the rest of the page as it was."""
    from benchmarks.markdown import update_section
    from benchmarks.report import calibration_report

    summary, rates = calibration_report.crossed_real_aa(ROOT / "results" / "calibration" / "aa-number-sequence",
                                                        shapes=((8, 3), (5, 5)), draws=100, outer=3, inner=20,
                                                        reps=200)
    assert summary["cells"] == 24 and summary["questions"] == 300 and summary["variant"] == "grpo"
    assert list(rates["variants"]) == [8] and rates["false_claim"].iloc[0] <= 0.15  # 5 x 5 needs 25 cells
    rates_of = {f"{p} {k}": 0.04 for p in ("crossed-v4", "pairs-v2")
                for k in ("false_claim", "noncoverage", "false_equivalent", "any_worse")}
    sim = pd.DataFrame([{"matrix": "m", "task": "t", "variants": 8, "seeds": 6, "questions": 300,
                         "scenario": "global null", "sims": 1000, **rates_of}])
    result = {"designs": [{"matrix": "m", "task": "t", "question_share": 0.07}], "simulated": sim,
              "real_aa": [(summary, rates)], "sims": 1000, "reps": 500}
    page = calibration_report.render_calibration({"simulated": pd.DataFrame(), "real_aa": [],
                                                  "declared_pairs": pd.DataFrame(), "claims": [], "crossed": result},
                                                 "grpo-bench calibration m")
    assert "| m | t | 8 x 6 x 300 | 0.07 | global null | 0.040 +-0.006 |" in page
    assert page.count("<!-- grpo-bench:crossed-v4 -->") == 1
    path = tmp_path / "report.md"
    path.write_text(page + "\n## After\n")
    update_section(path, calibration_report.CROSSED_SECTION, "rewritten")
    text = path.read_text()
    assert "rewritten" in text and "8 x 6 x 300" not in text and text.endswith("## After\n")
    assert text.startswith(page[:page.index("<!-- grpo-bench:crossed-v4 -->")])


def test_crossed_v4_calibration_command_refuses_bad_input(capsys, tmp_path):
    from benchmarks.report import calibration_report

    for argv, message in ((["--bogus"], "unknown option --bogus"), ([], "no DIR"),
                          ([str(tmp_path)], "not a result store"), (["x", "--sims", "many"], "--sims takes a number"),
                          (["x", "--sims"], "an option without its value"), (["x", "--sims", "10"], "at least 100")):
        assert calibration_report.main(argv) == 2, argv
        assert message in capsys.readouterr().err, argv
    assert calibration_report.main(["--help"]) == 0 and "crossed-v4" in capsys.readouterr().out
