"""The crossed seeds x questions analysis: per-question scores read from a store add up to the stored primary metric,
the ANOVA components and Satterthwaite's degrees of freedom recover planted designs, the crossed interval covers the
skill-level difference where the seeds-only one under-covers, and the population line says which one a mark speaks
for."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from benchmarks.curve import cell_scores
from benchmarks.errors import UsageError
from benchmarks.io import encode_correct
from benchmarks.report import crossed
from benchmarks.store import ResultStore

ROOT = Path(__file__).resolve().parents[3]
REAL = ROOT / "results" / "reasoning-gym"


# ------------------------------------------------------------------------------------------------
# The estimator on planted tables
# ------------------------------------------------------------------------------------------------


def test_the_components_recover_a_planted_crossed_design():
    rng = np.random.default_rng(0)
    s, q = 300, 400
    d = 0.05 + rng.normal(0, 0.2, (s, 1)) + rng.normal(0, 0.3, (1, q)) + rng.normal(0, 0.5, (s, q))
    f = crossed.crossed_variance(d)
    assert f["sigma2_seed"] == pytest.approx(0.04, rel=0.2)
    assert f["sigma2_question"] == pytest.approx(0.09, rel=0.2)
    assert f["sigma2_residual"] == pytest.approx(0.25, rel=0.02)
    assert f["seed_part"] == pytest.approx(f["sigma2_seed"] / s)
    assert f["question_part"] == pytest.approx(f["sigma2_question"] / q)
    assert f["residual_part"] == pytest.approx(f["sigma2_residual"] / (s * q))
    # untruncated, the variance is (MS_seed + MS_question - MS_residual) / (S Q), the parts' sum
    assert f["variance"] == pytest.approx(f["seed_part"] + f["question_part"] + f["residual_part"], rel=1e-12)
    # the seeds-only variance: the row means' spread over S, blind to the question part
    assert f["seeds_variance"] == pytest.approx(d.mean(1).var(ddof=1) / s, rel=1e-12)
    assert f["seeds_variance"] == pytest.approx(f["seed_part"] + f["residual_part"], rel=1e-12)


def test_satterthwaite_reaches_its_limits_and_truncation_drops_a_part():
    rng = np.random.default_rng(1)
    a, b = rng.normal(0, 1, (6, 1)), rng.normal(0, 1, (1, 50))
    seeds_only = crossed.crossed_variance(np.broadcast_to(a, (6, 50)))
    # every question the same within a seed: the paired-by-seed t, S - 1 degrees of freedom
    assert seeds_only["df"] == pytest.approx(5.0) and seeds_only["question_part"] == 0.0
    assert seeds_only["variance"] == pytest.approx(a.var(ddof=1) / 6)
    assert seeds_only["variance"] == pytest.approx(seeds_only["seeds_variance"])
    questions_only = crossed.crossed_variance(np.broadcast_to(b, (6, 50)))
    # every seed the same: the question draw alone, Q - 1 degrees of freedom, and nothing the seeds can see
    assert questions_only["df"] == pytest.approx(49.0) and questions_only["seeds_variance"] == pytest.approx(0.0)
    assert questions_only["variance"] == pytest.approx(b.var(ddof=1) / 50)
    # a seed part estimated below 0 reads 0, and the variance stays the seeds-only one plus the question part
    noisy = np.broadcast_to(b, (6, 50)) + rng.normal(0, 1, (6, 50))
    flat = noisy - 0.9 * (noisy.mean(1, keepdims=True) - noisy.mean())  # row means closer: MS_seed < MS_residual
    f = crossed.crossed_variance(flat)
    assert float(f["seeds_variance"]) < float(f["residual_part"]) and f["seed_part"] == 0.0 and f["sigma2_seed"] == 0.0
    assert f["question_part"] > 0 and f["variance"] == pytest.approx(f["seeds_variance"] + f["question_part"])
    # vectorised over leading axes: a stack of tables gives each table's own numbers
    stack = crossed.crossed_variance(np.stack([np.broadcast_to(a, (6, 50)), np.broadcast_to(b, (6, 50)), flat]))
    for field in ("variance", "df"):
        assert stack[field] == pytest.approx([float(g[field]) for g in (seeds_only, questions_only, f)])
    assert np.isnan(crossed.crossed_variance(np.ones((1, 5)))["variance"])


def test_the_seeds_only_half_width_is_the_paired_t():
    rng = np.random.default_rng(2)
    y_i, y_j = rng.random((5, 40)), rng.random((5, 40))
    f = crossed.crossed_variance(y_i - y_j)
    from scipy import stats as st

    paired = st.ttest_rel(y_i.mean(1), y_j.mean(1))
    low, high = paired.confidence_interval(0.95)
    assert f["difference"] == pytest.approx(np.mean(y_i.mean(1) - y_j.mean(1)))
    assert crossed.half_width(f["seeds_variance"], f["seeds_df"]) == pytest.approx((high - low) / 2)


# ------------------------------------------------------------------------------------------------
# Coverage: a planted question effect and seed effect
# ------------------------------------------------------------------------------------------------


def _designs(designs: int, seeds: int, questions: int, *, gain: float, seed_sd: float, rng) -> np.ndarray:
    """Paired differences (designs, seeds, questions) of two variants' per-question correct/wrong, each design a
    fresh draw of seeds and questions: question q has difficulty p_q ~ U(0.34, 0.64), variant i gains
    delta_i + U(-gain, gain) on it (variants gain differently on different questions), seed s moves variant i by
    U(-seed_sd, seed_sd) (its own training run) and by a part both variants share (common random numbers). Every
    probability stays in [0, 1], so the skill-level difference (over the question and seed populations) is
    delta_0 - delta_1 = 0.02 exactly."""
    difficulty = rng.uniform(0.34, 0.64, (designs, 1, 1, questions))
    gains = np.array([0.02, 0.0])[None, :, None, None] + rng.uniform(-gain, gain, (designs, 2, 1, questions))
    runs = rng.uniform(-seed_sd, seed_sd, (designs, 2, seeds, 1))
    shared = rng.uniform(-0.01, 0.01, (designs, 1, seeds, 1))
    p = difficulty + gains + runs + shared
    assert 0.0 <= p.min() and p.max() <= 1.0
    y = (rng.random(p.shape) < p).astype(float)
    return y[:, 0] - y[:, 1]


def test_the_crossed_interval_covers_the_skill_difference_where_the_seeds_only_one_does_not():
    rng = np.random.default_rng(3)
    d = _designs(4000, 6, 300, gain=0.29, seed_sd=0.03, rng=rng)
    f = crossed.crossed_variance(d)
    miss = np.abs(f["difference"] - 0.02)
    covered = np.mean(miss <= crossed.half_width(f["variance"], f["df"]))
    covered_seeds = np.mean(miss <= crossed.half_width(f["seeds_variance"], f["seeds_df"]))
    share = float(np.median(f["question_part"] / f["seeds_variance"]))
    # measured: crossed 0.946, seeds-only 0.902 with the question part 0.63 of the seeds-only variance (median)
    assert 0.93 <= covered <= 0.97, covered
    assert covered_seeds < 0.92 and covered - covered_seeds > 0.04, (covered, covered_seeds)
    assert 0.4 < share < 1.0, share
    # no question effect to add: the crossed interval does not over-cover, and agrees with the seeds-only one
    d = _designs(4000, 6, 300, gain=0.0, seed_sd=0.06, rng=rng)
    f = crossed.crossed_variance(d)
    miss = np.abs(f["difference"] - 0.02)
    assert 0.93 <= np.mean(miss <= crossed.half_width(f["variance"], f["df"])) <= 0.97
    assert 0.93 <= np.mean(miss <= crossed.half_width(f["seeds_variance"], f["seeds_df"])) <= 0.97


def test_a_seed_part_estimated_below_zero_does_not_narrow_the_interval_at_few_seeds():
    # 2 seeds, a seed part and little question part: MS_seed < MS_residual happens often. Truncating the seed
    # component inside the variance moved it onto the residual's degrees of freedom and covered 88% (measured).
    rng = np.random.default_rng(6)
    d = _designs(4000, 2, 300, gain=0.1, seed_sd=0.08, rng=rng)
    f = crossed.crossed_variance(d)
    assert (f["seeds_variance"] < f["residual_part"]).mean() > 0.2
    assert (f["variance"] >= f["seeds_variance"]).all()
    covered = np.mean(np.abs(f["difference"] - 0.02) <= crossed.half_width(f["variance"], f["df"]))
    assert 0.93 <= covered <= 0.97, covered  # measured 0.940


# ------------------------------------------------------------------------------------------------
# On the committed real-LM stores
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def number_sequence():
    return crossed.question_scores(REAL / "verdict-number-sequence")


def test_per_question_scores_add_up_to_the_stored_primary_metric(number_sequence):
    frame = number_sequence
    assert frame.attrs["primary"] == "last_2" and frame["question"].max() == 299
    stored = pd.read_csv(REAL / "verdict-number-sequence" / "tables" / "curve_metrics.csv")
    cells = frame.groupby(["task", "variant", "seed"])["score"].mean().reset_index().merge(stored)
    assert len(cells) == 48  # 8 variants x 6 seeds, every one matched
    np.testing.assert_allclose(cells["score"], cells["primary"], rtol=0, atol=1e-12)
    by_variant = cells.groupby("variant")[["score", "primary"]].mean()
    np.testing.assert_allclose(by_variant["score"], by_variant["primary"], rtol=0, atol=1e-12)
    # a per-question score is a mean of 0/1 evaluations: last_2 takes 0, 1/2 or 1
    assert set(np.unique(frame["score"])) <= {0.0, 0.5, 1.0}


def test_the_question_part_on_the_real_store(number_sequence):
    pairs = crossed.pair_variances(number_sequence)
    assert len(pairs) == 28 and (pairs["seeds"] == 6).all() and (pairs["questions"] == 300).all()
    assert (pairs["question_part"] >= 0).all() and (pairs["question_part"] > 0).mean() > 0.6
    # measured: median 0.066 of the seeds-only variance (chain_sum's store: 0.10); where the question part is
    # positive the crossed variance is larger than the seeds-only one
    share = pairs["question_share"].median()
    assert 0.02 < share < 0.5, share
    positive = pairs[pairs["question_part"] > 0]
    assert (positive["variance"] > positive["seeds_variance"]).all()
    variance, df, parts = crossed.pair_variance_crossed(number_sequence, "ppo", "dpo")
    row = pairs[(pairs["variant_i"] == "ppo") & (pairs["variant_j"] == "dpo")].iloc[0]
    assert variance == pytest.approx(row["variance"]) and df == pytest.approx(row["df"])
    assert parts["question_share"] == pytest.approx(row["question_share"]) and parts["seeds"] == 6
    flipped, _, flipped_parts = crossed.pair_variance_crossed(number_sequence, "dpo", "ppo")
    assert flipped == pytest.approx(variance) and flipped_parts["difference"] == pytest.approx(-parts["difference"])
    var_matrix, df_matrix = crossed.pair_matrices(pairs, ["ppo", "dpo", "grpo"])
    assert var_matrix[1, 0] == var_matrix[0, 1] == pytest.approx(variance) and np.isnan(var_matrix[0, 0])
    seeds_matrix, seeds_df = crossed.pair_matrices(pairs, ["ppo", "dpo"], crossed=False)
    assert seeds_matrix[0, 1] == pytest.approx(parts["seeds_variance"]) and seeds_df[0, 1] == 5.0


def test_which_population_a_mark_speaks_for(number_sequence):
    assert crossed.population(number_sequence, crossed=False) == "these 300 questions, new seeds"
    assert crossed.population(number_sequence, crossed=True).startswith(crossed.NEW_DRAW)


def test_the_tuning_stage_reads_as_the_tuning_choice_does():
    directory = REAL / "verdict-letter-counting"  # a matrix whose evaluation cells have not run
    frame = crossed.question_scores(directory, stage="tuning")
    store = ResultStore.open(directory)
    meta = json.loads((directory / "matrix.json").read_text())
    scores = frame.groupby(["variant", "seed"])["score"].mean()
    checked = 0
    for spec in meta["tuning"]["cells"]:
        summary = store.summary(spec["dir"])
        if not summary or summary.get("status") != "complete":
            continue
        expected = cell_scores(summary, store.metrics(spec["dir"]), "last_2", spec["budget"])[0]
        point = Path(spec["dir"]).parent.name
        assert scores[(f"{spec['variant']} {point}", spec["seed"])] == pytest.approx(expected, abs=1e-12)
        checked += 1
    assert checked == len(scores) >= 40
    variance, df, parts = crossed.pair_variance_crossed(frame, "grpo learning_rate=3e-05", "ppo learning_rate=3e-05")
    assert parts["seeds"] == 2 and parts["questions"] == 300 and variance > 0 and df >= 1


# ------------------------------------------------------------------------------------------------
# Stores written here: per-seed question draws, missing records, bad input
# ------------------------------------------------------------------------------------------------


def _write(out: Path, *, per_seed_draw: bool = False, records: bool = True, seeds: int = 4, q: int = 30) -> Path:
    """A finished two-variant matrix (addition), every evaluation with a per-question record; ``per_seed_draw``: each
    seed's cells evaluate that seed's own problem draw (``problem_seed`` set to the seed)."""
    out.mkdir(parents=True)
    store = ResultStore.open(out)
    rng = np.random.default_rng(5)
    cells = []
    for variant in ("grpo", "rloo"):
        for seed in range(seeds):
            evals = [encode_correct([[bool(c)] for c in rng.random(q) < 0.5]) for _ in range(3)]
            accuracy = [float(np.mean([int(c) for c in e["questions/correct"]])) for e in evals]
            options = {"problem_seed": seed} if per_seed_draw else {}
            spec = {"task_label": "addition", "task": "addition", "task_options": options, "variant": variant,
                    "algo": variant, "seed": seed, "steps": 2, "budget": 64, "completions_per_step": 32,
                    "eval_every": 1}
            rel = f"addition/{variant}/seed{seed}"
            rows = [{"step": 1, "completions": 32.0, "time/wall": 1.0, "eval/accuracy": accuracy[1],
                     **(evals[1] if records else {})}, {"step": 2, "completions": 32.0, "time/wall": 2.0}]
            summary = {"status": "complete", "steps": 2, "accuracy_before": accuracy[0], "accuracy_after": accuracy[2],
                       "completions_generated": 64.0, "wall_clock_s": 2.0,
                       **({"eval_questions": {"before": evals[0], "after": evals[2]}} if records else {})}
            store.put(rel, spec, summary, rows)
            cells.append({"dir": rel, **spec})
    (out / "matrix.json").write_text(json.dumps({"name": out.name, "cells": cells, "sessions": [],
                                                 "analysis": {"primary": "last_2", "margin": None}}))
    return out


def test_a_task_that_draws_its_questions_per_seed_is_covered_by_the_seeds(tmp_path):
    fixed = crossed.question_scores(_write(tmp_path / "fixed"))
    assert crossed.population(fixed, crossed=False) == "these 30 questions, new seeds"
    drawn = crossed.question_scores(_write(tmp_path / "drawn", per_seed_draw=True))
    line = crossed.population(drawn, crossed=False)
    assert line.startswith(crossed.NEW_DRAW) and "seeds-only analysis covers it" in line
    assert crossed.population(drawn, crossed=True) == line
    # the scores are the same either way: only what they speak for differs
    np.testing.assert_array_equal(fixed["score"], drawn["score"])
    variance, df, parts = crossed.pair_variance_crossed(tmp_path / "fixed", "grpo", "rloo")
    assert parts["seeds"] == 4 and parts["questions"] == 30 and math.isfinite(variance) and df > 0


def test_bad_input_is_one_usage_error(tmp_path):
    with pytest.raises(UsageError, match="per-question records"):
        crossed.question_scores(_write(tmp_path / "old", records=False))
    frame = crossed.question_scores(_write(tmp_path / "new"))
    with pytest.raises(UsageError, match="no variant 'ppo'"):
        crossed.pair_variance_crossed(frame, "grpo", "ppo")
    with pytest.raises(UsageError, match="no task 'gsm8k'"):
        crossed.pair_variances(frame, task="gsm8k")
    with pytest.raises(UsageError, match="missing score"):
        crossed.pair_variances(frame.drop(columns="score"))
    with pytest.raises(UsageError, match="stage 'final'"):
        crossed.question_scores(tmp_path / "new", stage="final")
    with pytest.raises(UsageError, match="no such directory"):
        crossed.question_scores(tmp_path / "absent")
    with pytest.raises(UsageError, match="no result store"):
        crossed.question_scores(tmp_path / "absent", stage="tuning")
    with pytest.raises(UsageError, match="holds last_2 scores, not auc"):
        crossed.pair_variances(frame, "auc")
    broken = _write(tmp_path / "broken")
    store = ResultStore.open(broken)
    summary = store.summary("addition/grpo/seed0")
    summary["eval_questions"]["after"]["questions/correct"] = "7" * 30  # 7 right of 1 sample
    store.put("addition/grpo/seed0", store.spec("addition/grpo/seed0"), summary, store.metrics("addition/grpo/seed0"))
    with pytest.raises(UsageError, match="cell addition/grpo/seed0: its per-question records cannot be read"):
        crossed.question_scores(broken)
