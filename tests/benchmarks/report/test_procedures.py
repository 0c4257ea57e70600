"""The verdict procedures by name (benchmarks/report/inference.py's PROCEDURES): the one a matrix registered, each
pair's spread from its own cells in paired-v3, marks within c's Monte Carlo error printed as fragile, both procedures'
marks in the verdict section, and paired-v3's family-wise error at the committed designs and on the real A/A cells."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from benchmarks.report import inference, stats, verdicts
from tests.conftest import ROOT

RESULTS = ROOT / "results"


def _limit(sims: int, rate: float = 0.05) -> float:
    """The nominal rate plus two binomial standard errors of a simulation of ``sims`` matrices."""
    return rate + 2 * math.sqrt(rate * (1 - rate) / sims)


def test_the_registered_procedure_follows_the_analysis():
    assert inference.PROCEDURE == "pairs-v2"  # paired-v3 is offered, not current: more conservative at most designs
    assert set(inference.PROCEDURES) == {"pooled-v1", "pairs-v2", "paired-v3", "crossed-v4"}  # crossed-v4: offered
    assert inference.registered({"procedure": "pairs-v2", "stated_at": "2026-12-07T00:00:00+00:00"}) == "pairs-v2"
    assert inference.registered({"stated_at": "2026-11-27T23:59:59+00:00"}) == "pooled-v1"
    assert inference.registered({"stated_at": "2026-11-28T04:31:23+00:00"}) == "pairs-v2"
    assert inference.registered({"margin": 0.02}) is None and inference.registered(None) is None


def _crn(n: int = 8, seed: int = 0) -> dict:
    """Two close variants sharing most of each seed's noise (common random numbers) and a third, far below,
    whose seeds spread 0.2: a 0.01 gap that the pair's own per-seed differences resolve."""
    rng = np.random.default_rng(seed)
    shared = 0.02 * rng.standard_normal(n)
    return {"a": dict(enumerate(0.80 + shared + 0.002 * rng.standard_normal(n))),
            "b": dict(enumerate(0.79 + shared + 0.002 * rng.standard_normal(n))),
            "wide": dict(enumerate(0.50 + 0.2 * rng.standard_normal(n)))}


def _wide(seed: int = 0, n: int = 8) -> dict:
    """Two variants 0.1 apart whose seeds spread 0.01, and a third, far below, whose seeds spread 0.2: one pooled
    sd (pooled-v1) gives the close pair the wide variant's spread, pairs-v2's shares of the residuals much less."""
    rng = np.random.default_rng(seed)
    return {"a": dict(enumerate(0.8 + 0.01 * rng.standard_normal(n))),
            "b": dict(enumerate(0.7 + 0.01 * rng.standard_normal(n))),
            "wide": dict(enumerate(0.5 + 0.2 * rng.standard_normal(n)))}


def test_each_pair_rests_on_its_own_per_seed_differences():
    """paired-v3's standard error of a pair is the sd of its per-seed differences over sqrt(n): no other variant's
    noise in it (pairs-v2's two-way residuals give the close pair a share of the wide variant's)."""
    data = _crn()
    _, f = inference.compare(data, procedure="paired-v3")
    d = np.array(list(data["a"].values())) - np.array(list(data["b"].values()))
    assert math.isclose(f.pair_se[0, 1], d.std(ddof=1) / math.sqrt(8), rel_tol=1e-9)
    _, without = inference.compare({v: data[v] for v in ("a", "b")}, procedure="paired-v3")
    assert math.isclose(without.pair_se[0, 1], f.pair_se[0, 1], rel_tol=1e-9)  # the wide variant changes nothing
    _, v2 = inference.compare(data, procedure="pairs-v2")
    assert v2.half_widths[0, 1] / v2.c > 5 * f.pair_se[0, 1]  # the leak the pair's own cells remove
    marks = inference.compare(data, procedure="paired-v3")[0].set_index("variant")
    assert marks.loc["b", "mark"] == inference.WORSE and marks.loc["a", "mark"] == inference.BEST
    assert inference.compare(data, procedure="pairs-v2")[0].set_index("variant").loc["b", "mark"] != inference.WORSE


def test_a_mark_within_the_critical_values_monte_carlo_error_is_fragile():
    """Two variants whose gap sits between c's lower band and c: "worse" at c - 2 SE, not at c; printed fragile."""
    rng = np.random.default_rng(1)
    base, noise = 0.5 + 0.05 * rng.standard_normal(10), 0.01 * rng.standard_normal(10)
    data = {"a": dict(enumerate(base + noise)), "b": dict(enumerate(base))}
    for procedure in ("pairs-v2", "paired-v3"):  # the current procedure and the one that rests on its own c
        _, f = inference.compare(data, procedure=procedure)
        assert f.c_low < f.c < f.c_high and f.c_high - f.c_low < 0.2, procedure  # a band of about +-0.04
        gap = (f.c_low + f.c) / 2 * f.half_widths[0, 1] / f.c - noise.mean()
        moved = dict(data, a=dict(enumerate(base + noise + gap)))
        marks = inference.compare(moved, procedure=procedure)[0].set_index("variant")
        assert marks.loc["b", "mark"] == inference.NOT_RESOLVED and marks.loc["b", "fragile"], procedure
        assert not inference.compare(_crn(), procedure=procedure)[0]["fragile"].any()
    row = {"mark": inference.NOT_RESOLVED, "fragile": True, "model_seeds": 10}
    assert verdicts._mark_text(row).endswith(verdicts.FRAGILE)


def _analysis(data: dict, meta: dict):
    grid = np.linspace(0, 1024, 5)
    per_cell, long, cells = [], [], []
    for variant, by_seed in data.items():
        for seed, final in by_seed.items():
            curve = np.concatenate([[0.27], np.linspace(0.5, final, 4)])
            per_cell.append({"task": "t", "variant": variant, "seed": seed, "budget": 1024.0, "accuracy_before": 0.27,
                             "final_accuracy": final, "auc": stats.normalised_auc(grid, curve, 1024),
                             "collapsed": False, "completions_to_threshold": 300.0})
            long += [{"task": "t", "variant": variant, "seed": seed, "completions": c, "accuracy": y}
                     for c, y in zip(grid, curve)]
            cells.append({"task": "t", "variant": variant, "seed": seed, "status": "complete", "wall_clock_s": 1.0,
                          "peak_memory_bytes": 2.0 ** 20})
    curves = {"cells": pd.DataFrame(per_cell), "completions": pd.DataFrame(long), "thresholds": {"t": 0.5}}
    return verdicts.analyse(pd.DataFrame(cells), curves, reps=50, scaling=False, meta=meta)


def test_the_verdicts_show_the_registered_marks_first_and_what_the_current_procedure_changes():
    registered = _analysis(_wide(), {"analysis": {"stated_at": "2026-11-26T00:00:00+00:00"}})
    assert registered["procedure"] == "pooled-v1"  # stated before pairs-v2 existed
    text = verdicts.render(registered, scaling=False)
    assert "Procedure `pooled-v1` (the one this matrix registered" in text
    table = text.index("| rank |")
    changed = text.index("The current procedure `pairs-v2` marks 2 variant(s) differently")
    assert table < changed  # the registered table first
    assert "`a` could be best: not resolved -> **best** (by >= " in text
    assert "`b` could be best: not resolved -> worse (by >= " in text
    current = _analysis(_wide(), {"analysis": {"stated_at": "2026-12-01T00:00:00+00:00"}})
    assert current["procedure"] == "pairs-v2" and current["current"] is None
    assert "differently" not in verdicts.render(current, scaling=False)
    offered = _analysis(_crn(), {"analysis": {"stated_at": "2026-12-07T00:00:00+00:00", "procedure": "paired-v3"}})
    assert offered["procedure"] == "paired-v3" and "The current procedure `pairs-v2` marks" in verdicts.render(
        offered, scaling=False)  # paired-v3 resolves the close pair by its per-seed differences; pairs-v2 does not
    unregistered = verdicts.render(_analysis(_wide(), {}), scaling=False)
    assert "Procedure `pairs-v2` (the current one: this matrix registered none" in unregistered


def _committed_design(store: str, task: str) -> tuple[int, int, np.ndarray]:
    """(variants, seeds, each variant's sd split from its pairs' per-seed differences) of a committed store."""
    from benchmarks.report.procedures import task_scores

    _, by_task = task_scores(RESULTS / store)
    _, f = inference.compare(by_task[task], procedure="paired-v3")
    return (0, 0, np.array([])) if f is None else (len(f.variants), int(np.median(f.n)), f.sds)


@pytest.mark.parametrize("store, task", [("verdicts-toy-like-real", "addition")])
def test_family_wise_error_at_a_committed_design(store, task):
    """verdicts-toy-like-real's 8 x 8 with its own spreads (one variant 6x the others): under the global null and
    with the top 2 tied, P(any false claim), false equivalence included, stays within simulation error of 5%."""
    k, n, sds = _committed_design(store, task)
    sims = 300
    for means in (None, inference.partial_null(k, 2, 0.02)):
        rates = inference.family_error(inference.Design(k, n, sds=sds, means=means, margin=0.02), sims=sims,
                                       reps=300, procedure="paired-v3")
        assert rates["false_claim"] <= _limit(sims) and rates["noncoverage"] <= _limit(sims), (means, rates)


def _stores_and_tasks() -> list[tuple[str, str]]:
    from benchmarks.report.procedures import stores, task_scores

    out = []
    for directory in stores(RESULTS):
        try:
            _, by_task = task_scores(directory)
        except Exception:  # a tuned matrix between its stages has nothing to judge
            continue
        out += [(str(directory.relative_to(RESULTS)), task) for task in by_task]
    return out


@pytest.mark.slow
def test_family_wise_error_at_every_committed_design():
    """Every committed store's every task, at its own variants, seeds and spreads: the global null, the top 2 and
    3 tied with the rest a pooled sd apart, false equivalence at the margin included."""
    sims = 1000
    for store, task in _stores_and_tasks():
        k, n, sds = _committed_design(store, task)
        if k < 2:  # one variant, or fewer than two with enough seeds (an A/A store, a demo task): nothing to judge
            continue
        sd = float(np.sqrt(np.mean(sds ** 2)))
        for means in [None] + [inference.partial_null(k, m, sd) for m in (2, 3) if m < k]:
            rates = inference.family_error(inference.Design(k, n, sds=sds, means=means, margin=sd), sims=sims,
                                           reps=500, procedure="paired-v3")
            assert rates["false_claim"] <= _limit(sims), (store, task, means, rates)


@pytest.mark.slow
@pytest.mark.parametrize("store", ["calibration/aa", "calibration/aa-number-sequence"])
def test_family_wise_error_on_the_real_aa_cells(store):
    """The A/A stores' cells (one variant, many seeds) cut at random into null matrices of the verdict shapes:
    paired-v3 one-way (the cells share no seeds) marks nothing falsely in more than 5% of them."""
    from benchmarks.report.procedures import task_scores

    _, by_task = task_scores(RESULTS / store)
    values = np.array([x for by_variant in by_task.values() for s in by_variant.values() for x in s.values()])
    rng = np.random.default_rng(0)
    draws = 500
    for k, n in ((4, 5), (6, 3), (8, 3)):
        if k * n > len(values):
            continue
        y = values[np.argsort(rng.random((draws, len(values))), axis=1)[:, : k * n]].reshape(draws, k, n)
        low, high, in_set = inference.mcb_procedure(y, blocked=False, reps=500, seed=3)
        rates = inference.error_rates(low, high, np.zeros(k), 0.02, in_set)
        assert rates["false_claim"] <= _limit(draws), (store, k, n, rates)


def test_the_procedures_page_compares_the_current_procedure_with_paired_v3(tmp_path, capsys):
    """python -m benchmarks.report.procedures: per design both procedures' c and MDDs, and paired-v3's median pair
    MDD over pairs-v2's last (the rename from mcb-v3 left that column reading a key no row has); --help is usage."""
    from benchmarks.report import procedures

    row = procedures.row_of("m", "t", _wide(), "pairs-v2", None)
    frame = pd.DataFrame([{"store": "results/m", **row}])
    frame = frame.rename(columns=lambda c: c.replace("-", "_").replace(" ", "_"))
    text = procedures.render(frame)
    assert "| pair MDD paired-v3 / pairs-v2 |" in text
    assert text.rstrip().endswith(f"| {row['paired-v3 pair MDD'] / row['pairs-v2 pair MDD']:.2f} |")
    assert procedures.main(["--help"]) == 0 and "--out FILE" in capsys.readouterr().out
    assert procedures.main(["--bogus"]) == 2 and "unknown option --bogus" in capsys.readouterr().err


def test_each_procedures_half_widths_are_its_own():
    """Fit.half_widths (the A/A check's and the crossed line's widths) under pooled-v1 is the pooled sd's, not
    pairs-v2's shares: with a wide variant the close pair's width is several times pairs-v2's."""
    data = _wide()
    for name in ("pooled-v1", "pairs-v2", "paired-v3"):
        marks, f = inference.compare(data, procedure=name)
        low, high, _ = inference.PROCEDURES[name].bounds(f, f.c)
        assert np.allclose(inference.intervals(f.means, f.half_widths), (low, high)), name
        assert inference.scaled_marks(f, np.ones((3, 3))) == list(marks.set_index("variant").loc[f.variants, "mark"])
    _, pooled = inference.compare(data, procedure="pooled-v1")
    assert np.allclose(pooled.half_widths, inference.pooled_half_widths(pooled.n, pooled.sd, pooled.c))
    _, v2 = inference.compare(data, procedure="pairs-v2")
    assert inference.scaled_marks(v2, np.full((3, 3), 100.0)) == [inference.NOT_RESOLVED] * 3  # far wider: nothing


def test_the_procedures_page_gives_crossed_v4_where_the_cells_keep_per_question_records():
    """With per-question scores a design's row gains crossed-v4's columns and the page its table: the MDD with the
    questions sampled, with more seeds falling towards the floor the questions leave; without them, neither."""
    from benchmarks.report import procedures

    rng = np.random.default_rng(4)
    effect = 0.1 * rng.standard_normal((3, 1, 60))  # each variant's own question effect: a question part
    y = np.array([0.6, 0.55, 0.3])[:, None, None] + 0.01 * rng.standard_normal((3, 8, 1)) + effect \
        + 0.2 * rng.standard_normal((3, 8, 60))
    scores = {v: {s: float(y[i, s].mean()) for s in range(8)} for i, v in enumerate("abc")}
    questions = {v: {s: y[i, s] for s in range(8)} for i, v in enumerate("abc")}
    row = procedures.row_of("m", "t", scores, "pairs-v2", None, questions)
    assert row["crossed-v4 MDD"] > row["crossed-v4 MDD x2 seeds"] > row["crossed-v4 MDD x4 seeds"] \
        > row["crossed-v4 MDD floor"] > 0 and row["crossed-v4 questions"] == 60
    assert row["crossed-v4 pair MDD"] > row["pairs-v2 pair MDD"]  # the question part the seeds leave out
    frame = pd.DataFrame([{"store": "results/m", **row},
                          {"store": "results/n", **procedures.row_of("n", "t", scores, None, None)}])
    text = procedures.render(frame.rename(columns=lambda c: c.replace("-", "_").replace(" ", "_")))
    table = text[text.index("## `crossed-v4`"):]
    assert "| results/m | t | 3 x 8 x 60 |" in table and "results/n" not in table
    assert "results/n" in text[:text.index("## `crossed-v4`")]
