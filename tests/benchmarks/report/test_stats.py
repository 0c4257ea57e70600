"""benchmarks.report.stats: learning-curve summaries on hand-made curves, and the robust statistics
against rliable called directly (same seed, same numbers), reproducible, with tied/worse marks."""

import math

import numpy as np
import pytest

from benchmarks.report import stats
from benchmarks.report.stats import completions_to_threshold, normalised_auc

REPS = 300  # enough to compare with rliable exactly; the report uses stats.REPS


# ------------------------------------------------------------------------------------------------
# Curves
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("x, y, x_max, expected", [
    ([0, 100], [1.0, 1.0], 100, 1.0),  # perfect from the start
    ([0, 100], [0.0, 0.0], 100, 0.0),
    ([0, 100], [0.0, 1.0], 100, 0.5),  # a straight line: half the box
    ([0, 50, 100], [0.0, 1.0, 1.0], 100, 0.75),  # (25 + 50) / 100
    ([0, 25, 50, 75, 100], [0.2, 0.4, 0.6, 0.8, 1.0], 100, 0.6),
    ([0, 50], [0.0, 1.0], 100, 0.75),  # ended at 50: held at 1.0 to the budget
    ([0, 200], [0.0, 1.0], 100, 0.25),  # went past the budget: cut at 100, where it reads 0.5
    ([0, 0, 100], [0.3, 0.5, 0.5], 100, 0.5),  # a repeated x: the vertical step has no area
])
def test_normalised_auc_on_hand_made_curves(x, y, x_max, expected):
    assert normalised_auc(x, y, x_max) == pytest.approx(expected)


def test_normalised_auc_refuses_curves_it_cannot_integrate():
    with pytest.raises(ValueError, match="starts at 0"):
        normalised_auc([10, 100], [0.1, 0.2], 100)
    with pytest.raises(ValueError, match="non-decreasing"):
        normalised_auc([0, 100, 50], [0.1, 0.2, 0.3], 100)
    with pytest.raises(ValueError, match="x_max"):
        normalised_auc([0, 100], [0.1, 0.2], 0)


def test_completions_to_threshold_is_interpolated_between_evaluations_and_not_reached_is_inf():
    x, y = [0, 256, 512, 768, 1024], [0.2, 0.5, 0.79, 0.8, 0.7]
    assert completions_to_threshold(x, y, 0.8) == pytest.approx(768)  # at or above: reached exactly at an evaluation
    assert completions_to_threshold(x, y, 0.5) == 256
    assert completions_to_threshold(x, y, 0.35) == pytest.approx(128)  # linear between 0 (0.2) and 256 (0.5)
    assert completions_to_threshold(x, y, 0.795) == pytest.approx(512 + 256 * 0.5)
    assert completions_to_threshold(x, y, 0.795, interpolate=False) == 768  # the first measured point at or above
    assert completions_to_threshold(x, y, 0.1) == 0  # the starting policy already there
    assert completions_to_threshold(x, y, 0.81) == math.inf  # "not reached" is a value
    assert np.median([256, 512, math.inf]) == 512 and np.median([256, math.inf, math.inf]) == math.inf


def test_normalise_maps_start_to_0_and_1_to_1():
    assert stats.normalise([0.2, 0.6, 1.0], 0.2) == pytest.approx([0.0, 0.5, 1.0])
    assert np.isnan(stats.normalise([1.0], 1.0)).all()


def test_t_interval():
    mean, half = stats.t_interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(4.302653 * 1.0 / math.sqrt(3), rel=1e-6)
    assert stats.t_interval([5.0])[0] == 5.0 and math.isnan(stats.t_interval([5.0])[1])


# ------------------------------------------------------------------------------------------------
# Against rliable
# ------------------------------------------------------------------------------------------------

SCORES = {
    "a": np.random.RandomState(1).uniform(0.4, 0.9, size=(5, 3)),
    "b": np.random.RandomState(2).uniform(0.3, 0.8, size=(5, 3)),
}


@pytest.mark.parametrize("shape", [(1,), (3,), (5,), (7,), (5, 3), (4, 4), (9, 2)])
def test_interquartile_mean_is_rliables_aggregate_iqm(shape):
    from rliable import metrics

    x = np.random.RandomState(sum(shape)).normal(size=shape)
    assert stats.interquartile_mean(x) == metrics.aggregate_iqm(x)


def test_mean_and_iqm_agree_with_rliable_called_directly():
    from rliable import library, metrics

    ours = stats.mean_and_iqm(SCORES, reps=REPS, seed=7).set_index("name")
    for name, scores in SCORES.items():
        np.random.seed(7)
        points, intervals = library.get_interval_estimates(
            {name: scores}, lambda s: np.array([metrics.aggregate_mean(s), metrics.aggregate_iqm(s)]), reps=REPS)
        row = ours.loc[name]
        assert [row["mean"], row["iqm"]] == pytest.approx(points[name], abs=1e-12)
        assert [row["mean_low"], row["iqm_low"]] == pytest.approx(intervals[name][0], abs=1e-12)
        assert [row["mean_high"], row["iqm_high"]] == pytest.approx(intervals[name][1], abs=1e-12)
        assert row["mean_low"] <= row["mean"] <= row["mean_high"]


def test_bootstraps_are_reproducible_and_leave_numpys_global_state_alone():
    np.random.seed(123)
    expected_next = np.random.RandomState(123).random_sample()
    first = stats.mean_and_iqm(SCORES, reps=REPS)
    assert np.random.random_sample() == expected_next  # the caller's stream is where it was
    second = stats.mean_and_iqm(SCORES, reps=REPS)
    assert first.equals(second)
    # A variant's interval depends on its own scores only, not on which others are there.
    alone = stats.mean_and_iqm({"b": SCORES["b"]}, reps=REPS)
    assert alone.iloc[0].equals(first.iloc[1])


def test_probability_of_improvement_is_rliables_for_every_pair():
    from rliable import metrics

    poi = stats.probability_of_improvement(SCORES)
    assert len(poi) == 2
    ab = poi[(poi["x"] == "a") & (poi["y"] == "b")]["probability"].item()
    ba = poi[(poi["x"] == "b") & (poi["y"] == "a")]["probability"].item()
    assert ab == metrics.probability_of_improvement(SCORES["a"], SCORES["b"])
    assert ab + ba == pytest.approx(1.0)  # no ties in continuous scores


def test_performance_profiles_agree_with_rliables_default_profile():
    from rliable import library

    taus = np.linspace(0, 1, 11)
    ours = stats.performance_profiles({"a": SCORES["a"]}, taus, reps=REPS, seed=5)
    np.random.seed(5)
    profiles, cis = library.create_performance_profile({"a": SCORES["a"]}, taus, reps=REPS)
    assert ours["fraction"].to_numpy() == pytest.approx(profiles["a"])
    assert ours["low"].to_numpy() == pytest.approx(cis["a"][0]) and ours["high"].to_numpy() == pytest.approx(cis["a"][1])


def test_ratio_interval_is_the_geometric_mean_of_per_seed_ratios_with_a_t_interval_on_their_logs():
    from scipy import stats as st

    treatment, control = {0: 2.0, 1: 4.0, 2: 3.0, 7: 9.0}, {0: 1.0, 1: 2.0, 2: 1.0, 3: 5.0}  # seeds 0-2 shared
    logs = np.log([2.0, 2.0, 3.0])
    low, high = st.t.interval(0.95, 2, loc=logs.mean(), scale=logs.std(ddof=1) / np.sqrt(3))
    assert stats.ratio_interval(treatment, control) == pytest.approx((np.exp(logs.mean()), np.exp(low), np.exp(high)))
    assert stats.ratio_interval({0: 2.0, 1: 0.0, 2: float("nan")}, {0: 1.0, 1: 1.0, 2: 1.0}) == pytest.approx(
        (float("nan"),) * 3, nan_ok=True)  # one usable seed: no interval (a zero or missing value is not a ratio)
    narrow = stats.ratio_interval(treatment, control, confidence=0.5)
    assert np.exp(low) < narrow[1] < narrow[0] < narrow[2] < np.exp(high)
