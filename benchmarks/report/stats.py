"""The report's statistics: learning-curve summaries, Student-t intervals and rliable's robust estimates.

Learning curves (accuracy against generated completions) are summarised by
    normalised_auc             the trapezoid area over [0, budget] divided by the budget, in [0, 1]
    completions_to_threshold   the completion count where the curve, linear between evaluations, first
                               reaches a threshold (inf: never)

Across seeds and tasks, following Agarwal et al. 2021, "Deep RL at the Edge of the Statistical Precipice"
(rliable): the mean and the interquartile mean (IQM, the 25% trimmed mean over runs and tasks) with
stratified-bootstrap 95% percentile intervals, the probability of improvement P(X > Y) of every pair,
and performance profiles (the share of runs whose score exceeds tau). Scores pooled over tasks are
normalised per task between the starting policy's accuracy (0) and 1.0 (1).

A difference of two variants' means gets a Welch t interval (``welch_interval``), not the bootstrap: with 3 or 5
seeds a percentile-bootstrap interval is too narrow (it covered the true difference 81% / 88% of the time at nominal
95% in a simulation, results/calibration/interval-coverage.md; Welch 96% / 95%); the verdicts' marks are
benchmarks/report/inference.py's. ``wilson_interval`` is the interval of a proportion (the collapse rate).

Every bootstrap is seeded: rliable draws its resamples from numpy's *global* generator, so each
estimate seeds it (``seeded``) and restores the caller's state afterwards; a variant's interval depends
only on its own scores, the seed and the number of resamples, never on which other variants are there.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from benchmarks.curve import normalised_auc  # noqa: F401 -- one home, below the report and the matrix

REPS = 2000  # bootstrap resamples per estimate
SEED = 0  # the bootstrap's seed: the same numbers give the same report
CONFIDENCE = 0.95


# ------------------------------------------------------------------------------------------------
# Learning curves
# ------------------------------------------------------------------------------------------------


def completions_to_threshold(x: Sequence[float], y: Sequence[float], threshold: float, *,
                             interpolate: bool = True) -> float:
    """Where the curve (x, y) first reaches ``threshold``; ``math.inf`` when no evaluation reached it.

    ``interpolate`` (the report's choice): the curve is linear between evaluations, so the answer is the
    x where the segment into the first evaluation at or above the threshold crosses it; an evaluation
    spacing no longer quantises the result. Without it, the first evaluated x at or above the threshold."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"x and y must have the same shape, got {x.shape} and {y.shape}")
    reached = np.flatnonzero(y >= threshold)
    if not len(reached):
        return math.inf
    i = int(reached[0])
    if not interpolate or i == 0:
        return float(x[i])
    x0, x1, y0, y1 = x[i - 1], x[i], y[i - 1], y[i]  # y0 < threshold <= y1
    return float(x0 + (threshold - y0) / (y1 - y0) * (x1 - x0))


COLLAPSE_DROP = 0.3


def collapsed(y: Sequence[float], drop: float = COLLAPSE_DROP) -> bool:
    """Whether a run's learning curve (accuracy at each evaluation, the first before training) collapsed: it fell at
    least ``drop`` below its peak and is still there at its final evaluation. A run that never rose above its start
    is counted by ``never_learned``, not here (unless it fell that far below its start)."""
    y = np.asarray(y, dtype=float)
    y = y[np.isfinite(y)]
    return bool(len(y) >= 2 and y[-1] <= y.max() - drop)


def never_learned(y: Sequence[float]) -> bool:
    """Whether a run's curve never rose above its start (the first evaluation, before training)."""
    y = np.asarray(y, dtype=float)
    y = y[np.isfinite(y)]
    return bool(len(y) >= 2 and np.all(y[1:] <= y[0]))


def normalise(scores, start: float) -> np.ndarray:
    """Scores mapped so that the starting policy's accuracy is 0 and 1.0 stays 1 (nan when start is 1)."""
    scores = np.asarray(scores, dtype=float)
    return (scores - start) / (1.0 - start) if start < 1.0 else np.full_like(scores, np.nan)


# ------------------------------------------------------------------------------------------------
# Student t (the summary table's ± and the curves' bands)
# ------------------------------------------------------------------------------------------------


def t_interval(values) -> tuple[float, float]:
    """Mean and the half-width of its 95% Student-t confidence interval (nan half-width for n < 2)."""
    from scipy import stats

    x = pd.Series(values, dtype=float).dropna()
    n = len(x)
    if n == 0:
        return math.nan, math.nan
    if n == 1:
        return float(x.iloc[0]), math.nan
    return float(x.mean()), float(stats.t.ppf(0.975, n - 1) * x.std(ddof=1) / math.sqrt(n))


def welch_interval(x, y, confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """mean(x) - mean(y) and its Welch t interval (unequal variances, Welch-Satterthwaite degrees of
    freedom). Two runs of zero spread give the point itself as the interval; fewer than 2 runs in
    either: nan bounds."""
    from scipy import stats as st

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    diff = float(np.mean(x) - np.mean(y)) if len(x) and len(y) else math.nan
    if min(len(x), len(y)) < 2:
        return diff, math.nan, math.nan
    vx, vy = np.var(x, ddof=1) / len(x), np.var(y, ddof=1) / len(y)
    se2 = vx + vy
    if se2 <= 0.0:
        return diff, diff, diff
    df = se2**2 / (vx**2 / (len(x) - 1) + vy**2 / (len(y) - 1))
    half = float(st.t.ppf(0.5 + confidence / 2, df) * math.sqrt(se2))
    return diff, diff - half, diff + half


def ratio_interval(treatment: Mapping[int, float], control: Mapping[int, float], confidence: float = CONFIDENCE
                   ) -> tuple[float, float, float]:
    """Geometric mean of the per-seed ratios treatment / control (the seeds both have, each value > 0) with its
    Student-t interval on the log ratios, n - 1 degrees of freedom; nan below 2 seeds."""
    from scipy import stats as st

    seeds = sorted(s for s in set(treatment) & set(control) if treatment[s] > 0 and control[s] > 0)
    if len(seeds) < 2:
        return (math.nan,) * 3
    logs = np.log([treatment[s] / control[s] for s in seeds])
    half = float(st.t.ppf(0.5 + confidence / 2, len(logs) - 1) * logs.std(ddof=1) / math.sqrt(len(logs)))
    return float(np.exp(logs.mean())), float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half))


def wilson_interval(successes: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Wilson score interval of a proportion successes / n ((nan, nan) for n = 0)."""
    from scipy import stats as st

    if n <= 0:
        return math.nan, math.nan
    z = float(st.norm.ppf(0.5 + confidence / 2))
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


# ------------------------------------------------------------------------------------------------
# rliable
# ------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def seeded(seed: int):
    """Seed numpy's global generator (rliable's source of resamples) and restore it on the way out."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def _as_runs_by_tasks(scores) -> np.ndarray:
    scores = np.asarray(scores, dtype=float)
    return scores.reshape(-1, 1) if scores.ndim == 1 else scores


def interquartile_mean(scores: np.ndarray) -> float:
    """rliable.metrics.aggregate_iqm (scipy.stats.trim_mean(scores, 0.25, axis=None)) in plain numpy, the same
    numbers bit for bit (tested): scipy's argument checking costs more than the mean of a few runs, and a
    bootstrap calls it thousands of times."""
    flat = np.ravel(scores)
    cut = int(0.25 * flat.size)
    part = np.partition(flat, (cut, flat.size - cut - 1))
    return float(np.mean(part[cut:flat.size - cut]))


def mean_and_iqm(score_dict: Mapping[str, np.ndarray], *, reps: int = REPS, seed: int = SEED) -> pd.DataFrame:
    """Per name: mean and IQM of its (runs x tasks) scores with stratified-bootstrap 95% intervals.

    One row per name: name, mean, mean_low, mean_high, iqm, iqm_low, iqm_high."""
    from rliable import library, metrics

    def func(s):
        return np.array([metrics.aggregate_mean(s), interquartile_mean(s)])

    rows = []
    for name, scores in score_dict.items():
        with seeded(seed):
            points, intervals = library.get_interval_estimates({name: _as_runs_by_tasks(scores)}, func, reps=reps,
                                                               confidence_interval_size=CONFIDENCE)
        (mean, iqm), ci = points[name], intervals[name]
        rows.append({"name": name, "mean": mean, "mean_low": ci[0, 0], "mean_high": ci[1, 0],
                     "iqm": iqm, "iqm_low": ci[0, 1], "iqm_high": ci[1, 1]})
    return pd.DataFrame(rows, columns=["name", "mean", "mean_low", "mean_high", "iqm", "iqm_low", "iqm_high"])


def probability_of_improvement(score_dict: Mapping[str, np.ndarray]) -> pd.DataFrame:
    """P(X > Y) for every ordered pair of names (rliable's Mann-Whitney estimate, averaged over tasks);
    scores are (runs x tasks) with the same tasks in the same columns. Rows: x, y, probability."""
    from rliable import metrics

    names = list(score_dict)
    rows = [{"x": a, "y": b, "probability": float(metrics.probability_of_improvement(
        _as_runs_by_tasks(score_dict[a]), _as_runs_by_tasks(score_dict[b])))}
        for a in names for b in names if a != b]
    return pd.DataFrame(rows, columns=["x", "y", "probability"])


def _score_distribution(scores: np.ndarray, taus: np.ndarray) -> np.ndarray:
    """rliable's default profile (library.score_distributions: mean(scores > tau) over all runs and tasks),
    vectorised over tau instead of one Python call per tau."""
    return (scores.reshape(-1, 1) > taus.reshape(1, -1)).mean(axis=0)


def performance_profiles(score_dict: Mapping[str, np.ndarray], taus: Iterable[float], *, reps: int = REPS,
                         seed: int = SEED) -> pd.DataFrame:
    """Score distributions: per name and tau, the share of all its runs (over tasks) scoring above tau,
    with a 95% stratified-bootstrap band (rliable.library.create_performance_profile). Rows: name, tau,
    fraction, low, high."""
    from rliable import library

    taus = np.asarray(list(taus), dtype=float)
    rows = []
    for name, scores in score_dict.items():
        with seeded(seed):
            profiles, cis = library.create_performance_profile({name: _as_runs_by_tasks(scores)}, taus, reps=reps,
                                                               custom_profile_func=_score_distribution,
                                                               confidence_interval_size=CONFIDENCE)
        rows += [{"name": name, "tau": t, "fraction": f, "low": lo, "high": hi}
                 for t, f, lo, hi in zip(taus, profiles[name], cis[name][0], cis[name][1])]
    return pd.DataFrame(rows, columns=["name", "tau", "fraction", "low", "high"])
