"""One matrix's ranking against another's (``compare``, what grpo-bench brief reads): Kendall's tau-b with its exact
p-value, its bootstrap interval over both matrices' seeds and the smallest tau its number of algorithms can call, and
the algorithm settings in which each pairing differs. The committed tuned verdict matrix is read once (its analysis
takes seconds); the other tests hand ``compare`` a made-up matrix, its cells' primary metric seed by seed."""

import numpy as np
import pandas as pd
import pytest

from pathlib import Path

from benchmarks.commands import algorithm_settings
from benchmarks.errors import UsageError
from benchmarks.report.transfer import compare, read_matrix, resampled_means, smallest_significant_tau

TUNED = "results/verdicts-tuned"
SIX = ["reinforce", "reinforce_pp_baseline", "rloo", "dapo", "remax", "dpo"]  # by their committed means, high to low


@pytest.fixture(scope="module")
def settings():
    return algorithm_settings()


@pytest.fixture(scope="module")
def tuned_data():
    return read_matrix(Path(TUNED))


def test_smallest_significant_tau_matches_the_exact_tables():
    # Two-sided 5% critical values of Kendall's tau for n untied items (exact null distribution).
    assert smallest_significant_tau(4) is None
    assert smallest_significant_tau(5) == pytest.approx(1.0)
    assert smallest_significant_tau(6) == pytest.approx(13 / 15)
    assert smallest_significant_tau(10) == pytest.approx(23 / 45)


def test_a_matrix_against_itself_carries_over_and_reversed_it_does_not(tuned_data, settings):
    same = compare(tuned_data, tuned_data, Path(TUNED), Path(TUNED), [(v, v) for v in SIX], settings)
    assert same["tau"] == pytest.approx(1.0) and same["p_value"] < 0.01 and same["n"] == 6
    assert list(same["table"]["toy_rank"]) == list(same["table"]["real_rank"]) == [1, 2, 3, 4, 5, 6]
    assert same["tau_low"] <= same["tau"] <= same["tau_high"]
    assert same["like_for_like"] == 6 and not same["table"]["differs"].str.len().any()
    reversed_ = compare(tuned_data, tuned_data, Path(TUNED), Path(TUNED), list(zip(SIX, reversed(SIX))), settings)
    assert reversed_["tau"] == pytest.approx(-1.0)
    assert reversed_["tau_low"] <= -1 + 1e-9 <= reversed_["tau_high"] < 1


def _matrix(task, runs, *, marks=None, algos=None, settings=None, precision=None, tuning=()):
    """A made-up matrix as ``read_matrix`` gives it. ``runs``: {variant: its cells' primary metric, seed by seed,
    a list (seeds 0, 1, ...) or {seed: value}}; each variant's algorithm (``algos``, default grpo), resolved settings
    (``settings``, default learning_rate 1e-4 and group_size 8), recorded precision (default fp32) and mark (``marks``,
    default "not resolved"); ``tuning``: the [tuning] cells' (variant, algo_options)."""
    runs = {v: dict(enumerate(r)) if isinstance(r, (list, np.ndarray)) else r for v, r in runs.items()}
    marks, algos, settings, precision = marks or {}, algos or {}, settings or {}, precision or {}
    per_cell = pd.DataFrame([{"task": task, "variant": v, "seed": s, "primary": x} for v, r in runs.items()
                             for s, x in r.items()])
    verdicts = pd.DataFrame([{"task": task, "variant": v, "mark": marks.get(v, "not resolved"),
                              "in_best_set": marks.get(v, "not resolved") != "worse"} for v in runs])
    cells = per_cell.assign(status="complete", precision=[precision.get(v, "fp32") for v in per_cell["variant"]])
    planned = [{"variant": v, "seed": s, "algo": algos.get(v, "grpo"),
                "settings": settings.get(v, {"learning_rate": 1e-4, "group_size": 8})} for v, r in runs.items() for s in r]
    return {"meta": {"cells": planned, "tuning": {"cells": [{"variant": v, "algo_options": o} for v, o in tuning]}},
            "cells": cells, "curves": {"cells": per_cell}, "analysis": {"tasks": verdicts, "spec": {"primary": "final"}}}


def _compare(toy, real, pairs, settings):
    return compare(toy, real, Path("toy"), Path("real"), pairs, settings)


def _noisy(means, sd, seeds=5, seed=1):
    rng = np.random.default_rng(seed)
    return {v: m + sd * rng.standard_normal(seeds) for v, m in means.items()}


def test_a_toy_winner_outside_the_real_best_group_is_said(settings):
    toy = _matrix("addition", _noisy({"a": 0.9, "b": 0.8, "c": 0.7, "d": 0.6}, 0.001),
                  marks={"a": "best", "b": "worse", "c": "worse", "d": "worse"})
    real = _matrix("chain_sum", _noisy({"a": 0.3, "b": 0.5, "c": 0.45, "d": 0.2}, 0.001),
                   marks={"a": "worse", "d": "worse"})
    result = _compare(toy, real, [(v, v) for v in "abcd"], settings)
    # Concordant pairs: (b, c), (b, d), (c, d), (a, d); discordant: (a, b), (a, c). tau = (4 - 2) / 6.
    assert result["tau"] == pytest.approx(1 / 3)
    assert result["tau_needed"] is None and result["p_value"] > 0.05
    assert (result["tau_low"], result["tau_high"]) == pytest.approx((1 / 3, 1 / 3))
    table = result["table"].set_index("algorithm")
    assert table["toy_rank"].idxmin() == "a" and not table.loc["a", "real_in_set"] and table["real_rank"].idxmin() == "b"


SEPARATED = {"a": 0.9, "b": 0.8, "c": 0.7, "d": 0.6, "e": 0.5}


def test_tau_and_the_table_rank_by_the_primary_metric_and_its_interval_holds_it(settings):
    """Identical rankings, means 0.1 apart, seed noise 1e-4: every resample keeps both orders, so tau is 1 with
    the interval [1, 1]. The verdicts' final-accuracy means (here reversed) are not what is ranked."""
    toy, real = (_matrix(task, _noisy(SEPARATED, 1e-4, seed=i)) for i, task in enumerate(("addition", "chain_sum")))
    toy["analysis"]["tasks"]["final_mean"] = [0.1, 0.2, 0.3, 0.4, 0.5]
    result = _compare(toy, real, [(v, v) for v in SEPARATED], settings)
    assert result["tau"] == pytest.approx(1.0) and result["tau_low"] == pytest.approx(1.0) == result["tau_high"]
    table = result["table"].set_index("algorithm")
    assert list(table["toy_rank"]) == [1, 2, 3, 4, 5]
    for v, m in SEPARATED.items():  # the mean of the cells' primary metric, inside its own bootstrap interval
        assert table.loc[v, "toy_mean"] == pytest.approx(np.mean(toy["curves"]["cells"].query("variant == @v")["primary"]))
        assert table.loc[v, "toy_low"] <= table.loc[v, "toy_mean"] <= table.loc[v, "toy_high"]
        assert table.loc[v, "toy_high"] - table.loc[v, "toy_low"] < 1e-3
    assert result["p_value"] == pytest.approx(1 / 60)  # the exact two-sided p of a perfect ranking of 5


def test_large_seed_noise_widens_the_interval(settings):
    toy, real = (_matrix(task, _noisy(SEPARATED, 0.5, seed=i)) for i, task in enumerate(("addition", "chain_sum")))
    result = _compare(toy, real, [(v, v) for v in SEPARATED], settings)
    assert result["tau_low"] <= result["tau"] <= result["tau_high"]
    assert result["tau_low"] < 0 and result["tau_high"] - result["tau_low"] > 0.8


def test_every_variant_of_a_matrix_shares_each_resample_of_its_seeds():
    """Blocked: b is a's cells plus 0.1 seed by seed, so in every resample b's mean is a's plus 0.1 exactly; with
    seeds of their own each variant draws its own, and the gap moves."""
    a = {s: x for s, x in enumerate([0.1, 0.9, 0.3, 0.7, 0.5])}
    means, blocked = resampled_means({"a": a, "b": {s: x + 0.1 for s, x in a.items()}}, np.random.default_rng(0), 500)
    assert blocked and means.shape == (500, 2) and np.allclose(means[:, 1] - means[:, 0], 0.1)
    apart = {"a": a, "b": {s + 10: x + 0.1 for s, x in a.items()}}
    means, blocked = resampled_means(apart, np.random.default_rng(0), 500)
    assert not blocked and np.std(means[:, 1] - means[:, 0]) > 0.05


def test_blocking_by_seed_narrows_the_interval(settings):
    """A large seed effect every variant shares (the seeds' common random numbers) and gaps of 0.03 between the
    variants: resampled in blocks the ranking never moves ([1, 1]); the same cells with seeds of their own, resampled
    within each variant, swap neighbours often, and the result says how it resampled."""
    shift = np.array([0.0, 0.4, 0.8, 0.2, 0.6])
    offsets = {"a": 0.12, "b": 0.09, "c": 0.06, "d": 0.03, "e": 0.0}
    blocked = {v: shift + o for v, o in offsets.items()}
    apart = {v: {10 * i + s: x for s, x in enumerate(shift + o)} for i, (v, o) in enumerate(offsets.items())}
    pairs = [(v, v) for v in offsets]
    results = {}
    for name, runs in (("blocked", blocked), ("apart", apart)):
        results[name] = _compare(_matrix("addition", runs), _matrix("chain_sum", _noisy(SEPARATED, 1e-4)), pairs, settings)
    assert results["blocked"]["tau"] == results["apart"]["tau"] == pytest.approx(1.0)
    assert (results["blocked"]["tau_low"], results["blocked"]["tau_high"]) == pytest.approx((1.0, 1.0))
    assert results["apart"]["tau_low"] < 0.5
    assert results["blocked"]["bootstrap"]["toy_blocked"] and not results["apart"]["bootstrap"]["toy_blocked"]
    assert results["apart"]["bootstrap"]["real_blocked"]


def test_the_settings_that_differ_are_named_and_the_tuned_ones_left_out(settings):
    """group_size 2 against 8 is named, learning_rate (which every pairing differs in) is not, nor DPO's beta,
    which the toy's [tuning] grid varied; a precision that differs is named, and a setting one side lacks reads
    "not recorded"."""
    runs = _noisy({"a": 0.9, "b": 0.8, "c": 0.7, "dpo": 0.6}, 1e-3)
    dpo_toy = {"learning_rate": 3e-5, "beta": 0.3, "pairs": 256, "count_pair_samples": False}
    toy = _matrix("addition", runs, algos={"dpo": "dpo"}, settings={
        "b": {"learning_rate": 1e-4, "group_size": 2}, "c": {"learning_rate": 1e-4, "group_size": 8, "mu": 2},
        "dpo": dpo_toy}, tuning=[("dpo", {"learning_rate": lr, "beta": b}) for lr in (1e-4, 3e-5) for b in (0.1, 0.3)])
    real = _matrix("chain_sum", runs, algos={"dpo": "dpo"}, precision={"b": "bf16"}, settings={
        **{v: {"learning_rate": 1e-5, "group_size": 8} for v in "abc"},
        "dpo": {"learning_rate": 1e-5, "beta": 0.1, "pairs": 256}})
    result = _compare(toy, real, [(v, v) for v in runs], settings)
    differs = dict(zip(result["table"]["algorithm"], result["table"]["differs"]))
    assert differs == {"a": [], "b": ["group_size 2 vs 8", "precision fp32 vs bf16"], "c": ["mu 2 vs not recorded"],
                       "dpo": ["count_pair_samples False vs not recorded"]}
    assert result["like_for_like"] == 1 and result["tuned_keys"] == {"beta": ["dpo on addition"]}


def test_a_variant_without_finished_cells_is_one_line(tuned_data, settings):
    with pytest.raises(UsageError, match="no finished cells for results/verdicts-tuned: nope"):
        compare(tuned_data, tuned_data, Path(TUNED), Path(TUNED), [("rloo", "rloo"), ("nope", "dpo")], settings)
