"""The verdicts say when the could-be-best variants score no more than one answer given to every question would
(letter_counting's shortcut: "1" is right 57% of the time, and GRPO learned to answer "1" to everything)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from benchmarks.report import stats, verdicts


def _analysis(finals: dict, shares: dict, *, baseline=0.57, recorded=True, noisy=("c",)):
    grid = np.linspace(0, 1024, 5)
    rng = np.random.default_rng(0)
    per_cell, long, cells = [], [], []
    for variant, final in finals.items():
        for seed in range(4):
            curve = np.concatenate([[0.27], np.full(4, final)])
            if variant in noisy:
                curve[1:] += 0.01 * rng.standard_normal(4)
            per_cell.append({"task": "t", "variant": variant, "seed": seed, "budget": 1024.0, "accuracy_before": 0.27,
                             "final_accuracy": curve[-1], "auc": stats.normalised_auc(grid, curve, 1024),
                             "collapsed": False, "completions_to_threshold": 300.0})
            long += [{"task": "t", "variant": variant, "seed": seed, "completions": c, "accuracy": y}
                     for c, y in zip(grid, curve)]
            cell = {"task": "t", "variant": variant, "seed": seed, "status": "complete", "wall_clock_s": 1.0,
                    "peak_memory_bytes": 2.0**20}
            if recorded:
                cell.update(constant_baseline_after=baseline, answer_top_share_after=shares[variant])
            cells.append(cell)
    curves = {"cells": pd.DataFrame(per_cell), "completions": pd.DataFrame(long), "thresholds": {"t": 0.5}}
    return verdicts.analyse(pd.DataFrame(cells), curves, reps=100, scaling=False)


def test_a_set_no_better_than_the_constant_baseline_is_said_to_rank_a_shortcut():
    analysis = _analysis({"a": 0.57, "b": 0.57, "c": 0.40}, {"a": 1.0, "b": 0.98, "c": 0.6})
    text = verdicts.render(analysis, scaling=False)
    sentence = next(s for s in analysis["sentences"] if s.startswith("On `t`"))
    assert "`c` is worse than the best" in sentence
    assert sentence.endswith("But none of the set is above the constant baseline (0.570: one answer given to every "
                             "question scores that): what ranks there is how close a policy comes to the answers' "
                             "distribution, not the skill.")
    assert ("Constant baseline (the best single answer given to every question): 0.570; primary metric not above "
            "it: `a`, `b` and `c`.") in text
    assert "most common one (1.00: the same answer to every question; mean over seeds): `a` 1.00, `b` 0.98, `c` 0.60." in text


def test_a_set_above_the_baseline_gets_no_warning_and_cells_without_it_no_line():
    analysis = _analysis({"a": 0.80, "b": 0.50}, {"a": 0.3, "b": 0.9}, baseline=0.57)
    text = verdicts.render(analysis, scaling=False)
    assert "But " not in " ".join(analysis["sentences"])
    assert "primary metric not above it: `b`." in text  # b is worse, and below the baseline: said in its section
    unrecorded = verdicts.render(_analysis({"a": 0.57, "b": 0.40}, {}, recorded=False), scaling=False)
    assert "Constant baseline" not in unrecorded and "constant baseline" not in unrecorded


def test_part_of_the_set_at_the_baseline_is_named():
    analysis = _analysis({"a": 0.575, "b": 0.562, "c": 0.40}, {"a": 0.5, "b": 1.0, "c": 0.6}, noisy=("a", "b", "c"))
    sentence = next(s for s in analysis["sentences"] if s.startswith("On `t`"))
    assert "could be best: `a` and `b`" in sentence, sentence
    assert "But `b` of the set is not above the constant baseline (0.570" in sentence
