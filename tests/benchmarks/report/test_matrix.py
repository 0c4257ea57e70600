"""grpo-bench report on a hand-made matrix directory (no training): learning curves on the completions
grid, AUC and completions-to-threshold per cell, the verdict section and its sentences, README
sections, the plots; the report's import boundary; plan.py's evaluation points; the ablation plot."""

import ast
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from benchmarks.report import verdicts
from benchmarks.report.matrix import report
from benchmarks.store import ResultStore
from tests.conftest import ROOT

BUDGET, EVERY = 256, 64


def _write_cell(out: Path, task: str, variant: str, seed: int, cps: int, curve: list[float], seconds: float,
                extra_metrics: dict) -> dict:
    """A complete cell whose held-out accuracy follows ``curve`` at 0, 64, ..., 256 completions."""
    rel = f"{task}/{variant}/seed{seed}"
    cell_dir = out / rel
    cell_dir.mkdir(parents=True)
    steps = BUDGET // cps
    rows = []
    for step in range(1, steps + 1):
        row = {"step": step, "completions": float(cps), "reward/mean": curve[min(len(curve) - 1, step * cps // EVERY)],
               "tokens/generated": 3.0 * cps, "time/step": seconds / steps, "time/wall": seconds * step / steps,
               **{k: v + 0.01 * step for k, v in extra_metrics.items()}}
        if step * cps % EVERY == 0 and step != steps:
            row["eval/accuracy"] = curve[step * cps // EVERY]
        rows.append(row)
    (cell_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"status": "complete", "task": task, "algo": variant, "seed": seed, "steps": steps,
               "accuracy_before": curve[0], "accuracy_after": curve[-1], "reward_before": curve[0], "reward_after": curve[-1],
               "completions_generated": float(BUDGET), "tokens_generated": 3.0 * BUDGET, "tokens_per_second": 100.0,
               "wall_clock_s": seconds, "time_per_step_s": seconds / steps, "process_wall_clock_s": seconds + 2,
               "peak_memory_bytes": 2**20 * (100 + 10 * cps), "peak_memory_kind": "process_peak_rss",
               "param_bytes": 1000, "grad_bytes": 1000, "optimizer_bytes": 2000, "device_name": "test CPU", "precision": "fp32",
               "phase_seconds": {"generate": seconds / 2, "update": seconds / 2}, "versions": {"torch": "x"}}
    (cell_dir / "summary.json").write_text(json.dumps(summary))
    return {"dir": rel, "task_label": task, "task": task, "variant": variant, "algo": variant, "seed": seed,
            "steps": steps, "budget": BUDGET, "completions_per_step": cps, "eval_every": EVERY // cps}


# (variant, completions per step, training seconds): different completions per step, one eval grid.
VARIANTS = [("fast", 16, 1.0), ("steady", 32, 3.0), ("slow", 8, 2.0)]


def _curves(task: str, variant: str, seed: int) -> list[float]:
    jitter = 0.01 * (seed - 1)
    if task == "easy":  # saturated: everyone ends at >= 0.95
        return [0.5, 0.9, 0.96, 0.97, 0.97 + jitter]
    final = {"fast": 0.80, "steady": 0.79, "slow": 0.40}[variant]
    # each variant's own noise beside the seed's shared part (0 at seed 1, whose curve other tests read exactly)
    jitter += {"fast": (-0.004, 0.0, 0.004), "steady": (0.004, 0.0, -0.004), "slow": (0.002, 0.0, -0.002)}[variant][seed]
    return [0.2, 0.2 + (final - 0.2) / 2, final - 0.02, final + jitter / 2, final + jitter]


@pytest.fixture(scope="module")
def matrix_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "m"
    cells = []
    for task in ("easy", "hard"):
        for variant, cps, seconds in VARIANTS:
            for seed in range(3):
                extra = {"entropy": 1.0, "kl": 0.1, "groups/tied_fraction": 0.2} if variant != "slow" else {"entropy": 1.0}
                cells.append(_write_cell(out, task, variant, seed, cps, _curves(task, variant, seed), seconds, extra))
    (out / "matrix.json").write_text(json.dumps({"name": "test", "cells": cells, "sessions": []}))
    store = ResultStore.open(out)  # what a matrix keeps as its cells end; the report reads it alone
    for cell in cells:
        cell_dir = out / cell["dir"]
        spec = {k: v for k, v in cell.items() if k != "dir"}
        store.put(cell["dir"], spec, json.loads((cell_dir / "summary.json").read_text()),
                  [json.loads(line) for line in (cell_dir / "metrics.jsonl").read_text().splitlines()])
        shutil.rmtree(cell_dir)  # the cells' folders are working space: the report must not need them
    return out


@pytest.fixture(scope="module")
def reported(matrix_dir, tmp_path_factory):
    readme = tmp_path_factory.mktemp("readme") / "README.md"
    readme.write_text("# project\n\nprose above\n")
    data = report(matrix_dir, readme=str(readme), section="results-test", plot=True)
    return data, readme


def test_curves_share_one_grid_and_are_measured(reported):
    data, _ = reported
    curves = data["curves"]
    by_cell = curves["completions"].groupby(["task", "variant", "seed"])["completions"].apply(list)
    assert all(points == [0, 64, 128, 192, 256] for points in by_cell)  # 5 points, whatever the completions per step
    assert curves["aligned"] == {"easy": True, "hard": True} and curves["completions"]["measured"].all()
    cell = curves["cells"].set_index(["task", "variant", "seed"]).loc[("hard", "fast", 1)]
    # [0.2, 0.5, 0.78, 0.8, 0.8] over 0..256 by 64: trapezoid / 256
    assert cell["auc"] == pytest.approx((0.35 + 0.64 + 0.79 + 0.8) / 4)
    assert curves["thresholds"]["hard"] == pytest.approx(0.8 * 0.80)
    # linear between 0.5 at 64 and 0.78 at 128 completions; the first evaluation at or above it is still recorded
    assert cell["completions_to_threshold"] == pytest.approx(96) and cell["completions_to_threshold_measured"] == 128
    slow = curves["cells"][(curves["cells"]["task"] == "hard") & (curves["cells"]["variant"] == "slow")]
    assert (slow["completions_to_threshold"] == math.inf).all()  # 0.40 never reaches 0.64


def test_verdicts_rank_mark_and_say_only_what_holds(reported):
    data, _ = reported
    analysis = data["analysis"]
    hard = analysis["tasks"][analysis["tasks"]["task"] == "hard"].set_index("variant")
    assert list(hard.index) == ["fast", "steady", "slow"]
    assert hard["mark"].to_dict() == {"fast": "not resolved", "steady": "not resolved", "slow": "worse"}
    assert hard["in_best_set"].to_dict() == {"fast": True, "steady": True, "slow": False}
    assert hard.loc["slow", "worse_by"] > 0.3 and hard.loc["fast", "p_best"] > hard.loc["steady", "p_best"]
    assert hard.loc["slow", "completions_to_threshold"] == math.inf and hard.loc["slow", "threshold_reached"] == 0
    assert analysis["saturated"] == {"easy": True, "hard": False}
    sentences = analysis["sentences"]
    assert sentences[0].startswith("Primary metric: final accuracy; no margin of equivalence (none is claimed); NOT stated")
    assert sentences[1] == "`easy` ranks nothing: every variant's mean is at or above 0.95."
    assert sentences[2].startswith("On `hard`, could be best: `fast` and `steady` (2 of 3; P(best): `fast` ")
    assert ("`slow` is worse than the best by at least" in sentences[2]
            and "not separated is not equivalent: 2 of the set are not resolved" in sentences[2]
            and "of the set, `fast` has the lowest mean training time (1.0 s)" in sentences[2])
    text = verdicts.render(analysis)
    assert "| 3 | slow | 3 | 0.400 | [" in text and "not reached (0/3)" in text and "#### `easy` (ranks nothing: saturated)" in text
    assert "#### All tasks (`easy`, `hard`)" in text


def test_guidance_rules_on_constructed_marks():
    def table(rows):
        return pd.DataFrame([{"task": t, "variant": v, "mark": m, "primary_mean": f, "saturated": False, "wall_clock_s": s,
                              "in_best_set": m in ("best", "not resolved", "equivalent to best"), "p_best": p,
                              "gap_low": 0.05 if m == "best" else -0.1, "worse_by": 0.2 if m == "worse" else math.nan}
                             for t, v, m, f, s, p in rows])

    spec = {"primary": "last_3", "margin": 0.02, "stated": True, "stated_at": "2026-11-26T00:00:00+00:00"}
    power = pd.DataFrame({"task": ["a", "b"], "mdd": [0.08, 0.08], "set_reproduced": [0.9, 0.5]})
    none = table([("a", "x", "not resolved", 0.6, 2.0, 0.7), ("a", "y", "not resolved", 0.5, 1.0, 0.3)])
    said = verdicts.guidance(none, power, spec)
    assert said[0] == ("Primary metric: mean accuracy of the last 3 evaluations; margin of equivalence +-0.02; stated in "
                       "the matrix file before its cells ran (2026-11-26T00:00:00+00:00).")
    assert said[1].startswith("On `a` the procedure separates none of the 2 variants: any could be the best (P(best): "
                              "`x` 0.70, `y` 0.30)")
    assert said[1].endswith("A rerun of this design gives back the same set 90% of the time.")
    both = table([("a", "x", "best", 0.6, 2.0, 0.99), ("a", "y", "worse", 0.3, 1.0, 0.01), ("b", "x", "not resolved", 0.6, 2.0, 0.5),
                  ("b", "y", "equivalent to best", 0.6, 1.5, 0.5), ("b", "z", "worse", 0.1, 0.5, 0.0)])
    said = verdicts.guidance(both, power, spec)
    assert said[1].startswith("On `a`, `x` is best: above every other variant by at least 0.050 (simultaneous 95%); "
                              "`y` is worse than the best by at least 0.200")
    assert "equivalent to the best within +-0.02: `y`" in said[2] and "1 of the set is not resolved at this design's MDD 0.080" in said[2]
    assert "; `z` is worse than the best by at least 0.200" in said[2]
    assert said[-1] == "`x` could be best on all 2 tasks that rank."
    split = table([("a", "x", "best", 0.6, 1.0, 1.0), ("a", "y", "worse", 0.2, 1.0, 0.0), ("b", "x", "worse", 0.2, 1.0, 0.0),
                   ("b", "y", "best", 0.6, 1.0, 1.0)])
    assert verdicts.guidance(split, power, spec)[-1] == "No variant could be best on all 2 tasks that rank."
    many = table([("a", "x", "best", 0.9, 1.0, 1.0)] + [("a", f"w{i}", "worse", 0.2, 1.0, 0.0) for i in range(4)])
    assert "; the other 4 are worse than the best by at least 0.200" in verdicts.guidance(many, power, spec)[1]
    three = table([("a", "x", "best", 0.9, 1.0, 1.0)] + [("a", f"w{i}", "worse", 0.2, 1.0, 0.0) for i in range(3)])
    assert "; `w0`, `w1` and `w2` are worse than the best by at least 0.200" in verdicts.guidance(three, power, spec)[1]
    few = table([("a", "x", "too few seeds", 0.6, 1.0, math.nan), ("a", "y", "too few seeds", 0.2, 1.0, math.nan)])
    assert verdicts.guidance(few, power, spec)[1] == "`a`: fewer than two variants with 3 or more seeds, so no verdict."
    alone = table([("a", "x", "too few seeds", 0.6, 1.0, math.nan)])  # one variant, however many seeds
    assert verdicts.guidance(alone, power, spec)[1] == "`a`: one variant, nothing to compare, so no verdict."
    late = verdicts.guidance(few, power, {"primary": "final", "margin": None, "stated": False})[0]
    assert "NOT stated before the cells ran" in late


def test_readme_sections_tables_and_plots(reported, matrix_dir):
    data, readme = reported
    text = readme.read_text()
    assert text.startswith("# project\n\nprose above\n")
    section = text[text.index("<!-- grpo-bench:results-test -->"):text.index("<!-- /grpo-bench:results-test -->")]
    assert "#### Every measured number" not in section and "/README.md)." in section  # header lines and a link
    verdict_section = text[text.index("<!-- grpo-bench:results-test-verdicts -->"):]
    assert "On `hard`, could be best: `fast` and `steady`" in verdict_section
    own = (matrix_dir / "README.md").read_text()
    assert own.index("### Verdicts") < own.index("#### Every measured number")  # the verdicts lead
    for name in ("curves", "curve_metrics", "verdicts", "overall", "probability_of_improvement", "performance_profiles"):
        assert len(pd.read_csv(matrix_dir / "tables" / f"{name}.csv")) > 0, name
    plots = {p.name for p in (matrix_dir / "plots").glob("*.png")}
    assert {"accuracy_vs_completions.png", "accuracy_vs_seconds.png", "diagnostics_easy.png", "diagnostics_hard.png",
            "performance_profile.png", "probability_of_improvement.png", "interval_estimates.png",
            "final_accuracy.png", "reward_vs_samples.png"} <= plots
    assert "](plots/diagnostics_hard.png)" in own


def test_report_is_reproducible(reported, matrix_dir):
    data, _ = reported
    again = report(matrix_dir, plot=False)
    assert again["analysis"]["tasks"].equals(data["analysis"]["tasks"])
    assert again["analysis"]["overall"].equals(data["analysis"]["overall"])


def test_the_report_reads_files_only():
    """No module of benchmarks/report imports the harness, the command line or the matrix runner."""
    for path in (ROOT / "benchmarks" / "report").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                assert not name.startswith(("benchmarks.harness", "benchmarks.cli", "benchmarks.matrix")), (path.name, name)


# ------------------------------------------------------------------------------------------------
# Evaluation points (plan.py) and the ablation plot
# ------------------------------------------------------------------------------------------------

MATRIX = """\
seeds = [0]
budget = 256
eval_every = {every}

[tasks.pizza]

[algorithms.grpo]
[algorithms.reinforce]
[algorithms.rloo]
"""


def test_every_variant_is_evaluated_at_the_same_completion_counts(tmp_path):
    from benchmarks.matrix import parse

    path = tmp_path / "m.toml"
    path.write_text(MATRIX.format(every=32))
    plan = parse(path)
    points = {c.variant: [s * c.completions_per_step for s in range(c.eval_every, c.steps + 1, c.eval_every)] for c in plan.cells}
    assert {c.completions_per_step for c in plan.cells} == {8, 16, 32}
    assert all(p == [32 * k for k in range(1, 9)] for p in points.values()), points


def test_an_eval_interval_that_would_misalign_the_curves_is_refused(tmp_path, capsys):
    from benchmarks.cli.main import main

    path = tmp_path / "m.toml"
    path.write_text(MATRIX.format(every=40))
    assert main(["matrix", str(path), "--out", str(tmp_path / "o"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "m.toml:3:" in err and "eval_every 40 completions is not a multiple of grpo's 32 completions per step" in err


def test_verdicts_matrix_evaluates_at_least_8_points_on_one_grid_per_task(tmp_path):
    from benchmarks.matrix import parse
    from tasks import TASKS

    text = (ROOT / "benchmarks" / "matrices" / "verdicts.toml").read_text()
    if "addition" not in TASKS:  # being registered by tasks/addition.py
        start = text.index("[tasks.addition]")
        text = text[:start] + text[text.index("[algorithms.", start):]
    path = tmp_path / "default.toml"
    path.write_text(text)
    plan = parse(path)
    grids = {}
    for c in plan.cells:
        points = tuple(s * c.completions_per_step for s in range(c.eval_every, c.steps, c.eval_every)) + (c.budget,)
        grids.setdefault(c.task_label, set()).add(points)
    for task, grid in grids.items():
        assert len(grid) == 1 and len(next(iter(grid))) + 1 >= 9, (task, grid)  # + the evaluation before training
    assert len({c.variant for c in plan.cells}) == 13 and len({c.seed for c in plan.cells}) == 5


def test_a_readme_may_take_the_header_without_the_verdicts(matrix_dir, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# project\n")
    report(matrix_dir, readme=str(readme), section="demo", plot=False, verdicts_section=False)
    text = readme.read_text()
    assert "<!-- grpo-bench:demo -->" in text and "grpo-bench:demo-verdicts" not in text


def test_collapse_plot_shows_the_run_that_learned_then_fell(tmp_path):
    from benchmarks.report import plots

    def cell(variant, before, peak, final, collapsed):
        return {"task": "t", "variant": variant, "seed": 0, "accuracy_before": before, "peak_accuracy": peak,
                "final_accuracy": final, "collapsed": collapsed}

    cells = pd.DataFrame([cell("drifts", 0.9, 0.9, 0.0, True),    # falls furthest, but only from its start
                          cell("learns", 0.2, 0.8, 0.3, True),    # learned, then fell: the one to look at
                          cell("steady", 0.2, 0.7, 0.7, False)])
    evals = pd.DataFrame([{"task": "t", "variant": v, "seed": 0, "samples": x, "accuracy": y}
                          for v, ys in [("drifts", [0.9, 0.5, 0.0]), ("learns", [0.2, 0.8, 0.3]), ("steady", [0.2, 0.5, 0.7])]
                          for x, y in zip([0, 10, 20], ys)])
    steps = pd.DataFrame([{"task": "t", "variant": v, "seed": 0, "step": i, "samples": 2 * i, "reward/mean": i % 3,
                           "kl": 0.1 * i} for v in ("drifts", "learns", "steady") for i in range(1, 11)])
    written = plots._collapse({"evals": evals, "steps": steps}, {"cells": cells}, tmp_path)
    assert written == [("collapse.png", "a collapse up close: t, learns, seed 0, per-step diagnostics around it")]
    assert (tmp_path / "collapse.png").stat().st_size > 0
    no_collapse = cells.assign(collapsed=False)
    assert plots._collapse({"evals": evals, "steps": steps}, {"cells": no_collapse}, tmp_path / "none") == []


def test_agreement_counts_flipped_marks_and_differences_of_means_whose_interval_misses_0(tmp_path, monkeypatch):
    """The means are compared by the rerun's mean minus the first's with Welch's interval over both runs' seeds
    (scipy's own Welch test checks the numbers), not by the rerun's mean inside the first's interval: variant a's
    rerun mean lies outside the first's interval and its difference still covers 0."""
    from scipy import stats as st

    from benchmarks.report import agreement

    spread = np.array([-0.02, -0.01, 0.0, 0.01, 0.02])

    def verdicts(rows):
        # the final accuracy deliberately elsewhere: the marks, and so the agreement, are on the primary metric
        return pd.DataFrame([{"task": "t", "variant": v, "seeds": len(values), "primary_all_mean": float(np.mean(values)),
                              "primary_all_low": float(np.mean(values)) - 0.02, "primary_all_high": float(np.mean(values)) + 0.02,
                              "primary_values": tuple(values), "primary_metric": "last_3", "final_mean": 0.1,
                              "final_mean_low": 0.0, "final_mean_high": 0.2, "mark": mark, "saturated": False}
                             for v, values, mark in rows])

    first = verdicts([("a", 0.80 + spread, "best"), ("b", 0.79 + spread, "tied with best"), ("c", 0.50 + spread, "worse")])
    wide = np.tile([-0.06, 0.06], 8)
    rerun = verdicts([("a", 0.83 + wide, "best"), ("b", 0.70 + wide / 6, "worse"), ("c", 0.51 + wide / 6, "worse")])
    monkeypatch.setattr(agreement, "matrix_verdicts", lambda d: first if d.name == "first" else rerun)
    table = agreement.agreement(tmp_path / "first", tmp_path / "rerun").set_index("variant")
    assert table["same_mark"].to_dict() == {"a": True, "b": False, "c": True}
    assert table["consistent"].to_dict() == {"a": True, "b": False, "c": True}
    for v in "abc":
        b_values, a_values = rerun.set_index("variant").loc[v, "primary_values"], first.set_index("variant").loc[v, "primary_values"]
        scipy_ci = st.ttest_ind(b_values, a_values, equal_var=False).confidence_interval(0.95)
        assert table.loc[v, ["difference_low", "difference_high"]].tolist() == pytest.approx([scipy_ci.low, scipy_ci.high])
    assert table.loc["a", "primary_all_mean_b"] > table.loc["a", "primary_all_high_a"]  # outside, yet consistent
    text = agreement.render(table.reset_index(), "first", "rerun")
    assert ("**2 of 3 marks agree on the tasks that rank; 2 of 3 differences of means (rerun minus first, Welch's "
            "95% interval) cover 0.**") in text
    assert "Primary metric (the marks' and the means'): `last_3`." in text
    assert ("| t | a | 5 / 16 | 0.800 [0.780, 0.820] | 0.830 [0.810, 0.850] | best | best | yes | "
            f"+0.030 [{table.loc['a', 'difference_low']:+.3f}, {table.loc['a', 'difference_high']:+.3f}] | yes |") in text
    rerun.loc[rerun["variant"] == "b", "mark"] = "too few seeds (< 3)"  # a partial rerun makes no claim about b
    rerun.at[int(np.flatnonzero(rerun["variant"] == "b")[0]), "primary_values"] = (0.70,)  # nor has it a spread
    text = agreement.render(agreement.agreement(tmp_path / "first", tmp_path / "rerun"), "first", "rerun")
    assert ("**2 of 2 marks agree on the tasks that rank (1 without a mark in one run, too few seeds or nothing to "
            "compare, not counted); 2 of 2 differences of means (rerun minus first, Welch's 95% interval) cover 0 (1 "
            "with fewer than 2 seeds in a run, not compared).**") in text
    assert "| t | b | 5 / 16 | 0.790 [0.770, 0.810] | 0.700 [0.680, 0.720] | tied with best | too few seeds (< 3) | - | - | - |" in text
    rerun["primary_metric"] = "final"  # another design: said, not silently compared
    assert "the runs measure different things" in agreement.render(agreement.agreement(tmp_path / "first", tmp_path / "rerun"), "first", "rerun")


def test_matrix_verdicts_give_each_variants_primary_metric_with_its_own_bootstrap_interval(tmp_path, monkeypatch):
    """What agreement compares: each variant's primary metric over its own seeds (not the procedure's pooled
    spread), with the report's stratified-bootstrap interval, and the final accuracy where no primary is stated."""
    from benchmarks.report import matrix as matrix_report
    from benchmarks.report import stats

    rng = np.random.default_rng(0)
    spread = {"steady": 0.002, "wild": 0.08}
    cells = pd.DataFrame([{"task": "t", "variant": v, "seed": s, "primary": 0.5 + sd * rng.standard_normal(),
                           "final_accuracy": 0.9} for v, sd in spread.items() for s in range(8)])
    tasks = pd.DataFrame([{"task": "t", "variant": v, "seeds": 8, "mark": "not resolved"} for v in spread])
    data = {"curves": {"cells": cells}, "analysis": {"tasks": tasks, "spec": {"primary": "last_3"}}}
    monkeypatch.setattr(matrix_report, "collect", lambda out: {})
    monkeypatch.setattr(matrix_report, "analyse", lambda collected: data)
    table = matrix_report.matrix_verdicts(tmp_path).set_index("variant")
    assert set(table["primary_metric"]) == {"last_3"}
    for v in spread:
        mine = cells[cells["variant"] == v]["primary"].to_numpy()
        expected = stats.mean_and_iqm({v: mine}).iloc[0]
        assert table.loc[v, "primary_all_mean"] == pytest.approx(mine.mean())
        assert table.loc[v, "primary_values"] == pytest.approx(tuple(mine))  # seed order, what agreement's Welch reads
        assert (table.loc[v, "primary_all_low"], table.loc[v, "primary_all_high"]) == pytest.approx(
            (expected["mean_low"], expected["mean_high"]))
    widths = table["primary_all_high"] - table["primary_all_low"]
    assert widths["wild"] > 10 * widths["steady"]  # each variant's own spread
    data["curves"]["cells"] = cells.drop(columns="primary")  # no stated primary: the final accuracy
    assert matrix_report.matrix_verdicts(tmp_path)["primary_all_mean"].tolist() == pytest.approx([0.9, 0.9])


def test_curves_too_short_for_a_fit_say_so_in_one_line():
    from benchmarks.report import verdicts

    frame = pd.DataFrame({"variant": ["a", "b"], "saturated": [False, False]})
    nan = float("nan")
    fitted = pd.DataFrame([{"task": "t", "variant": v, "R0": 0.15, "A": nan, "A_low": nan, "A_high": nan, "C_mid": nan,
                            "C_mid_low": nan, "C_mid_high": nan, "B": nan, "half_mae": nan, "half_final_error": nan}
                           for v in "ab"])
    lines = verdicts._scaling_lines({"scaling_fits": fitted}, "t", frame)
    assert lines == ["", "Compute scaling: no ScaleRL fit, the curves have too few evaluations for its four parameters."]
    fitted.loc[0, ["A", "A_low", "A_high", "C_mid", "C_mid_low", "C_mid_high", "B", "half_mae", "half_final_error"]] = \
        [0.9, 0.8, 1.0, 500, 400, 600, 1.5, 0.01, 0.02]
    table = verdicts._scaling_lines({"scaling_fits": fitted}, "t", frame)[-1]
    assert "| a | 0.150 | 0.900 [0.800, 1.000] | 500 [400, 600] | 1.50 | - | 0.010 | +0.020 |" in table and "| b |" not in table


def test_a_fit_the_curve_cannot_fix_says_so_instead_of_printing_nan():
    """Evaluations every 320 of 1280 completions: the first half holds 2 points for 3 parameters, so there is no
    half-budget check (a '-' and why, never 'nan'); an asymptote whose interval runs to the bound is named."""
    from benchmarks.report import fits, verdicts

    grid = np.array([0, 320, 640, 960, 1280.0])
    rng = np.random.default_rng(1)
    climbing = fits.sigmoid(grid[1:], 0.16, 0.9, 5000.0, 1.2)  # far from its asymptote at the budget
    rows = [{"task": "t", "variant": "a", "seed": s, "completions": c, "accuracy": y}
            for s in range(4) for c, y in zip(grid, np.r_[0.16, climbing + 0.01 * rng.standard_normal(4)])]
    fitted = fits.scaling_fits(pd.DataFrame(rows), reps=30)
    row = fitted.iloc[0]
    assert row["points"] == 4 and row["half_points"] == 2 and np.isnan(row["half_mae"])
    assert "A" in row["unfixed"].split(", ")  # the curve is too early to say where it levels off
    frame = pd.DataFrame({"variant": ["a"], "saturated": [False]})
    caption, _, table = verdicts._scaling_lines({"scaling_fits": fitted}, "t", frame)[1:]
    assert "nan" not in table and table.splitlines()[-1].endswith("| - | - |")
    assert "fitted on 4 evaluations after the start for 3 free parameters" in caption
    assert "the first half of the budget holds 2 evaluation(s) after the start, fewer than the 3" in caption
    assert fits.unfixed({"A": (0.5, 0.4, 0.6), "C_mid": (300.0,), "B": (10.0,)}, 1280.0) == "B"
    assert fits.unfixed({"A": (0.5, 0.4, 1.0), "C_mid": (1.28,), "B": (2.0,)}, 1280.0) == "A, C_mid"


def test_the_wall_clock_line_says_when_a_resumed_cell_trained_longer_than_its_last_process():
    """A resumed cell's training time adds up its attempts, its process time is the last attempt's: the line
    must not call training a part of the process time then."""
    from benchmarks.report.matrix import wall_clock_line

    sessions = [{"elapsed_s": 100.0, "jobs": 1, "cells_run": 2}]
    fresh = pd.DataFrame({"matrix_session": [0, 0], "process_wall_clock_s": [60.0, 50.0], "wall_clock_s": [40.0, 30.0]})
    assert "cell time summed over workers (not a wall-clock): 110 s, of which training 70 s." in wall_clock_line(sessions, fresh)
    resumed = fresh.assign(wall_clock_s=[90.0, 30.0])
    line = wall_clock_line(sessions, resumed)
    # "of which" only where the part is a part: the resumed cell is counted apart from the other
    assert ("1 cell(s) took 50 s, of which training 30 s; 1 resumed cell(s) trained 90 s over every attempt, and "
            "their last attempts' processes took 60 s (their earlier attempts' process time is not recorded).") in line
    # a cell whose session is not recorded: the sessions that ran cells are listed, never summed into a wall-clock
    two = [{"elapsed_s": 100.0, "jobs": 1, "cells_run": 1}, {"elapsed_s": 40.0, "jobs": 2, "cells_run": 1}]
    line = wall_clock_line(two, fresh.assign(matrix_session=[0, None]))
    assert line.startswith("Matrix wall-clock: 100 s, the elapsed time of the 1 session(s) that ran the 1 complete cells "
                           "shown (1 cell(s) at a time); the store does not say which session ran 1 of the cells")
    assert "; 1 session(s) ran cells: 40 s (1 cell runs, 2 at a time);" in line


def test_readme_naming_the_results_index_writes_it_once_with_the_verdicts(matrix_dir, tmp_path):
    # `grpo-bench report results/X --readme results/README.md`: the index is the page --readme names; it was
    # written twice (once brief, once with the verdicts) and listed twice in "wrote ..."
    out = tmp_path / "results" / "m"
    shutil.copytree(matrix_dir, out)
    index = tmp_path / "results" / "README.md"
    index.write_text("# results\n")
    data = report(out, readme=str(index), plot=False)
    text = index.read_text()
    assert text.count("<!-- grpo-bench:matrix-m -->") == 1 and text.count("<!-- grpo-bench:matrix-m-verdicts -->") == 1
    assert [Path(p).resolve() for p in data["written"]].count(index.resolve()) == 1


def test_peak_memory_is_a_mean_over_the_cells_that_ran_first_in_their_process(tmp_path):
    """A warm local worker's later cells read a process peak that grows with the cells run before: the report keeps
    only the first-in-process cells' peaks (a fresh subprocess's, a worker's first cell's, a GPU's own), says how many
    of the seeds those are, and shows '-' where none is."""
    out = tmp_path / "m"
    # (variant, executor records per seed, peak MiB per seed): fast's seed 0 ran first in its worker; steady ran in
    # fresh processes (no worker index); slow only as later cells of a warm worker; gpu's peaks are reset per cell.
    layout = {"fast": ([{"executor": "local", "worker_cell_index": i} for i in range(3)], [1000, 1500, 1700]),
              "steady": ([{"executor": "subprocess"}] * 3, [900, 910, 950]),
              "slow": ([{"executor": "local", "worker_cell_index": i} for i in (1, 2, 3)], [2000, 2100, 2200]),
              "gpu": ([{"executor": "local", "worker_cell_index": i} for i in (1, 2, 3)], [300, 310, 320])}
    cells = []
    for variant, (records, peaks) in layout.items():
        for seed in range(3):
            cps = dict((v, c) for v, c, _ in VARIANTS).get(variant, 16)
            cells.append(_write_cell(out, "hard", variant, seed, cps, _curves("hard", variant if variant in
                                     ("fast", "steady", "slow") else "fast", seed), 1.0, {}))
            path = out / cells[-1]["dir"] / "summary.json"
            summary = json.loads(path.read_text()) | records[seed] | {"peak_memory_bytes": peaks[seed] * 2**20}
            if variant == "gpu":
                summary["peak_memory_kind"] = "cuda_max_memory_allocated"
            path.write_text(json.dumps(summary))
    (out / "matrix.json").write_text(json.dumps({"name": "test", "cells": cells, "sessions": []}))
    store = ResultStore.open(out)
    for cell in cells:
        store.put(cell["dir"], {k: v for k, v in cell.items() if k != "dir"},
                  json.loads((out / cell["dir"] / "summary.json").read_text()),
                  [json.loads(line) for line in (out / cell["dir"] / "metrics.jsonl").read_text().splitlines()])

    data = report(out, plot=False)
    by_variant = data["cells"].groupby("variant")
    assert by_variant["peak_memory_bytes"].mean().dropna().div(2**20).to_dict() == pytest.approx(
        {"fast": 1000, "steady": 920, "gpu": 310}) and by_variant["peak_memory_bytes"].count()["slow"] == 0
    assert by_variant["peak_memory_warm_bytes"].count().to_dict() == {"fast": 2, "steady": 0, "slow": 3, "gpu": 0}
    summary = data["summary"].set_index("variant")
    assert summary.loc["fast", "peak_memory_n"] == 1 and summary.loc["steady", "peak_memory_n"] == 3
    text = (out / "README.md").read_text()
    measured = text[text.index("#### Every measured number"):text.index("What a cell costs, by phase")]
    row = {line.split(" | ")[1]: line for line in measured.splitlines() if line.startswith("| hard |")}
    assert "1000 ± n/a (1 seed) (1 of 3 fresh)" in row["fast"] and "920 ± " in row["steady"]
    assert "fresh" not in row["steady"] and " | - | " in row["slow"]
    ranked = text[text.index("### Verdicts"):text.index("#### Every measured number")].splitlines()
    verdict = {line.split(" | ")[1]: line for line in ranked if line[2:3].isdigit() and line.split(" | ")[1] in layout}
    assert verdict["fast"].rstrip(" |").endswith("| 1000 (1 of 3 fresh)") and verdict["slow"].rstrip(" |").endswith("| -")
    assert verdict["steady"].rstrip(" |").endswith("| 920") and verdict["gpu"].rstrip(" |").endswith("| 310")


def test_a_variant_left_out_says_why_too_few_seeds_or_nothing_to_compare():
    """The table's mark for a variant outside the model: its own seeds (< 3), or no second variant to compare it
    with (the real-LM A/A: one variant on 24 seeds is not "too few seeds")."""
    from benchmarks.report.matrix import analyse, collect

    root = Path(__file__).resolve().parents[3] / "results"
    alone = verdicts.render(analyse(collect(root / "calibration" / "aa-number-sequence"))["analysis"])
    row = next(line for line in alone.splitlines() if line.startswith("| 1 | grpo | 24 |"))
    assert "| nothing to compare (no other variant with 3+ seeds) |" in row and "too few" not in row
    probe = verdicts.render(analyse(collect(root / "reasoning-gym" / "grid-edge-number-sequence"))["analysis"])
    rows = [line for line in probe.splitlines() if line.startswith("| ") and "| 2 |" in line[:40]]
    assert len(rows) == 7 and all("| too few seeds (< 3) |" in line for line in rows)  # 2 seeds each


def test_agreement_compares_the_cells_both_stores_ran_answer_by_answer(tmp_path):
    """A cell of the second store with the same experiment as one of the first (whatever either matrix calls its
    variant) is compared question by question at every evaluation and step by step on the mean reward; a cell with
    another seed or setting, or one not complete, is not compared."""
    from benchmarks.report import agreement
    from benchmarks.store import ResultStore

    def spec(variant, seed, lr=1e-5, checkpoint_every=10):
        return {"algo": "ppo", "algo_options": {"learning_rate": lr}, "budget": 64, "seed": seed, "steps": 2,
                "task": "reasoning_gym", "task_label": "t", "variant": variant, "checkpoint_every": checkpoint_every}

    def environment(transformers="5.25.0", commit="9338659aa", threads="1", dirty=False):
        return {"code": {"commit": commit, "dirty": dirty}, "device_name": "cpu (1 threads)",
                "rounding": {"OMP_NUM_THREADS": threads}, "versions": {"torch": "2.13.0", "transformers": transformers}}

    def cell(store, relpath, spec, after="0110", step_answers="0100", rewards=(0.25, 0.5), status="complete",
             env=None):
        summary = {"status": status, "eval_questions": {"before": {"questions/correct": "0100"},
                                                        "after": {"questions/correct": after}}}
        if env is not None:
            summary["config"] = {"environment": env}
        rows = [{"step": 1, "reward/mean": rewards[0], "questions/correct": step_answers},
                {"step": 2, "reward/mean": rewards[1]}]
        store.put(relpath, spec, summary, rows)

    def toy_cell(store, relpath, spec, after):  # a task that records accuracies, not answers
        store.put(relpath, spec, {"status": "complete", "accuracy_before": 0.25, "accuracy_after": after},
                  [{"step": 1, "reward/mean": 0.5, "eval/accuracy": 0.5}, {"step": 2, "reward/mean": 0.5}])

    first, second = ResultStore.open(tmp_path / "a"), ResultStore.open(tmp_path / "b")
    for seed in (0, 1, 2):
        cell(first, f"t/ppo/seed{seed}", spec("ppo", seed), env=environment(transformers="5.24.0", commit="d1fb0d8ff",
                                                                           dirty=seed == 1))
    cell(first, "t/ppo/seed3", spec("ppo", 3), status="failed")
    cell(first, "t/ppo/seed6", spec("ppo", 6), env=environment())
    cell(second, "t/ppo_1epoch/seed0", spec("ppo_1epoch", 0, checkpoint_every=5),  # the same experiment: exact
         env=environment(threads="2"))
    cell(second, "t/ppo_1epoch/seed1", spec("ppo_1epoch", 1), after="1111", rewards=(0.25, 0.75),  # 2 answers, 1 reward
         env=environment())
    cell(second, "t/ppo_1epoch/seed6", spec("ppo_1epoch", 6), after="0000", env=environment())  # nothing explains it
    cell(second, "t/ppo_1epoch/seed2", spec("ppo_1epoch", 2, lr=3e-5))  # another setting: not the same experiment
    cell(second, "t/ppo_1epoch/seed3", spec("ppo_1epoch", 3))  # the first's failed: nothing to compare
    cell(second, "t/ppo_1epoch/seed4", spec("ppo_1epoch", 4), status="failed")
    toy_cell(first, "t/ppo/seed5", spec("ppo", 5), after=0.75)
    toy_cell(second, "t/ppo_1epoch/seed5", spec("ppo_1epoch", 5), after=0.8)
    table = agreement.shared_cells(tmp_path / "a", tmp_path / "b").set_index("second")
    assert list(table.index) == ["t/ppo_1epoch/seed0", "t/ppo_1epoch/seed1", "t/ppo_1epoch/seed5",
                                 "t/ppo_1epoch/seed6"]
    assert table["environment"].to_dict() == {
        "t/ppo_1epoch/seed0": "code d1fb0d8 -> 9338659; transformers 5.24.0 -> 5.25.0; OMP_NUM_THREADS 1 -> 2",
        "t/ppo_1epoch/seed1": "code d1fb0d8 -> 9338659; code with uncommitted changes (first); transformers 5.24.0 -> "
                              "5.25.0",
        "t/ppo_1epoch/seed5": "not recorded", "t/ppo_1epoch/seed6": ""}
    assert table.loc["t/ppo_1epoch/seed0", "first"] == "t/ppo/seed0"
    assert table[["evaluations", "same_evaluations", "questions", "questions_differing", "steps", "same_rewards"]
                 ].to_dict("index") == {
        "t/ppo_1epoch/seed0": {"evaluations": 3, "same_evaluations": 3, "questions": 12, "questions_differing": 0,
                               "steps": 2, "same_rewards": 2},
        "t/ppo_1epoch/seed1": {"evaluations": 3, "same_evaluations": 2, "questions": 12, "questions_differing": 2,
                               "steps": 2, "same_rewards": 1},
        "t/ppo_1epoch/seed5": {"evaluations": 3, "same_evaluations": 2, "questions": 0, "questions_differing": 0,
                               "steps": 2, "same_rewards": 2},  # accuracies 0.25 and 0.5 alike, 0.75 against 0.8
        "t/ppo_1epoch/seed6": {"evaluations": 3, "same_evaluations": 2, "questions": 12, "questions_differing": 2,
                               "steps": 2, "same_rewards": 2}}
    text = agreement.render(pd.DataFrame(), "a", "b", table.reset_index())
    assert ("**1 of 4 cells that ran the same experiment in both (the same settings, seed, budget, task and evaluation) "
            "reproduced the first exactly") in text
    assert "; of the 3 that did not, 1 ran with the same recorded code, libraries, rounding settings and device" in text
    assert "| t/ppo/seed5 | t/ppo_1epoch/seed5 | 2 of 3 | - (not recorded) | 2 of 2 | not recorded |" in text
    assert ("| t/ppo/seed1 | t/ppo_1epoch/seed1 | 2 of 3 | 2 of 12 | 1 of 2 | code d1fb0d8 -> 9338659; "
            "code with uncommitted changes (first); transformers 5.24.0 -> 5.25.0 |") in text
    assert "| t/ppo/seed6 | t/ppo_1epoch/seed6 | 2 of 3 | 2 of 12 | 2 of 2 | nothing recorded differs |" in text
    assert "No complete cells in common" in text  # no variant in common: the cells' section alone
    verdict = pd.DataFrame([{"task": "t", "variant": "ppo", "seeds_a": 3, "seeds_b": 3, "primary_all_mean_a": 0.5,
                             "primary_all_low_a": 0.4, "primary_all_high_a": 0.6, "primary_all_mean_b": 0.5,
                             "primary_all_low_b": 0.4, "primary_all_high_b": 0.6, "mark_a": "best", "mark_b": "best",
                             "same_mark": True, "consistent": True, "difference": 0.0, "difference_low": -0.1,
                             "difference_high": 0.1, "saturated_a": False, "primary_metric_a": "final",
                             "primary_metric_b": "final"}])
    headline = agreement.render(verdict, "a", "b", table.reset_index()).splitlines()[2]
    assert headline.endswith("cover 0; 1 of 4 cells both ran reproduced the first exactly.**")
    explained = agreement.render(pd.DataFrame(), "a", "b", table.reset_index().iloc[1:2])
    assert ("**0 of 1 cells that ran the same experiment in both (the same settings, seed, budget, task and evaluation) "
            "reproduced the first exactly: every evaluation (answer by answer where the task records its answers, else "
            "its accuracy) and every training step's mean reward; every one that did not (1) recorded another code, "
            "library version, rounding setting or device.**") in explained
    exact = agreement.render(pd.DataFrame(), "a", "b", table.reset_index().iloc[:1])
    assert "**1 of 1 cells that ran the same experiment in both" in exact and "that did not" not in exact


def test_agreement_of_two_different_matrices_says_their_marks_are_not_a_reruns():
    from benchmarks.report import agreement

    table = pd.DataFrame([{"task": "t", "variant": "a", "seeds_a": 5, "seeds_b": 5, "primary_all_mean_a": 0.5,
                           "primary_all_low_a": 0.4, "primary_all_high_a": 0.6, "primary_all_mean_b": 0.5,
                           "primary_all_low_b": 0.4, "primary_all_high_b": 0.6, "mark_a": "worse", "mark_b": "best",
                           "same_mark": False, "consistent": True, "difference": 0.0,
                           "difference_low": -0.1, "difference_high": 0.1, "saturated_a": False, "primary_metric_a": "final",
                           "primary_metric_b": "final"}])
    assert "**0 of 1 marks agree" in agreement.render(table, "a", "b", matrices=("m", "m"))
    text = agreement.render(table, "a", "b", matrices=("m", "n"))
    assert "**Different matrices (`m`, `n`): each marks its variants against its own others" in text
    assert "0 of 1 marks agree" not in text


def test_agreements_difference_of_means_misses_0_about_5_percent_of_the_time_when_nothing_changed():
    """What the agreement page says of its means ("each interval misses 0 with probability about 5% when nothing
    changed"), simulated at the designs the real-LM runs use (3 to 8 seeds a run, the same distribution in both):
    Welch's interval on the difference, as agreement computes it. The rerun's mean inside the first run's 95%
    percentile-bootstrap interval (the one its table prints), what it read before, is no such test: it misses far
    more often."""
    from benchmarks.report.stats import welch_interval

    rng = np.random.default_rng(7)
    for n_first, n_rerun in ((3, 3), (4, 4), (6, 6), (8, 4)):
        runs = 3000
        first, rerun = rng.normal(0.4, 0.03, (runs, n_first)), rng.normal(0.4, 0.03, (runs, n_rerun))
        misses = np.mean([not (low <= 0.0 <= high) for _, low, high in map(welch_interval, rerun, first)])
        assert 0.03 <= misses <= 0.065, (n_first, n_rerun, misses)
        boot = np.take_along_axis(first[:, None, :], rng.integers(0, n_first, (runs, 400, n_first)), axis=2).mean(axis=2)
        low, high = np.percentile(boot, [2.5, 97.5], axis=1)
        outside = np.mean((rerun.mean(axis=1) < low) | (rerun.mean(axis=1) > high))
        assert outside > 0.2, (n_first, n_rerun, outside)
