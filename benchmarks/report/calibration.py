"""Is the verdict's interval calibrated? A coverage simulation of the candidate interval methods, and the
A/A false-separation rate: how often the procedure separates variants declared to compute the same thing.

Coverage (``coverage``): seeds drawn with known means (a true difference of 0.05) and a realistic seed-to-seed
spread (sd 0.05, the addition task's typical spread), with the seed counts the matrices use (3 and 5), in
three scenarios: equal spreads, unequal spreads (0.02 against 0.08) and seeds correlated across variants
(rho 0.5, the seed fixing the starting policy's evaluation samples). Each method's 95% interval is computed
on every simulated pair and the share that contains the true difference is its coverage. Candidates:

    percentile   the stratified percentile bootstrap the verdicts used (each variant's seeds resampled
                 independently, 2.5% and 97.5% quantiles of the resampled differences)
    bca          the same bootstrap, bias-corrected and accelerated (two-sample jackknife acceleration)
    paired       Student t on the per-seed differences, n - 1 degrees of freedom
    welch        Welch t on the two means, Welch-Satterthwaite degrees of freedom

The bootstraps are vectorised here (numpy, the same resampling as rliable's StratifiedIndependentBootstrap
for one task), so the simulation takes seconds. Coverage with 4000 simulations per case and 2000 resamples
(``python -m benchmarks.report.calibration``), 3 / 5 seeds, equal spreads (worst scenario in brackets):
percentile 0.81 / 0.88 (0.76 / 0.86), BCa 0.82 / 0.88 (0.76 / 0.86), paired t 0.95 / 0.95 (0.95 / 0.95),
Welch 0.96 / 0.95 (0.94 / 0.95).

These are intervals for one pair of variants. The verdicts no longer rest on them: "which is best" is a multiple
comparison, answered with simultaneous intervals (benchmarks/report/inference.py). An earlier version of this
docstring said the seeds are not correlated across variants; they are: cells of different variants with the same
seed share the evaluation's sampling seed (and the torch seed and prompt order), and on verdicts-tuned the mean
correlation of two variants' cells over a seed is +0.13 to +0.19 (the starting policy's accuracy under that
evaluation seed). The verdicts therefore block on the seed.

A/A (``false_separation``): a matrix file may declare groups of variants that compute the same update,
top-level ``equivalent = [["grpo(level=token,mu=1)", "grpo(level=sequence,mu=1)", "grpo_sapo"]]``; every
pair within a group on every task is an A/A pair, and the rate is the share of those pairs whose 95%
difference interval excludes 0.
"""

from __future__ import annotations

import itertools
import math
import tomllib
from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats as st

from benchmarks.report import stats

CANDIDATES = ("percentile", "bca", "paired", "welch")
SCENARIOS = {  # name: (sd of A, sd of B, correlation of A and B within a seed)
    "equal spread": (0.05, 0.05, 0.0),
    "unequal spread": (0.02, 0.08, 0.0),
    "correlated seeds": (0.05, 0.05, 0.5),
}
TRUE_DIFF = 0.05


# ------------------------------------------------------------------------------------------------
# Interval methods, vectorised over simulations: a, b are (sims x n)
# ------------------------------------------------------------------------------------------------


def _bootstrap_diffs(a: np.ndarray, b: np.ndarray, reps: int, rng: np.random.Generator) -> np.ndarray:
    sims, n = a.shape
    m = b.shape[1]
    ia = rng.integers(0, n, size=(sims, reps, n))
    ib = rng.integers(0, m, size=(sims, reps, m))
    rows = np.arange(sims)[:, None, None]
    return a[rows, ia].mean(axis=2) - b[rows, ib].mean(axis=2)  # (sims x reps)


def percentile_intervals(a, b, *, reps: int = 2000, rng=None, confidence: float = stats.CONFIDENCE):
    rng = rng if rng is not None else np.random.default_rng(0)
    boot = _bootstrap_diffs(a, b, reps, rng)
    q = (1 - confidence) / 2
    return np.quantile(boot, q, axis=1), np.quantile(boot, 1 - q, axis=1)


def bca_intervals(a, b, *, reps: int = 2000, rng=None, confidence: float = stats.CONFIDENCE):
    """Bias-corrected and accelerated bootstrap (Efron 1987) of mean(a) - mean(b); the acceleration from
    the jackknife over all n + m runs."""
    rng = rng if rng is not None else np.random.default_rng(0)
    boot = _bootstrap_diffs(a, b, reps, rng)
    theta = a.mean(axis=1) - b.mean(axis=1)
    prop = (boot < theta[:, None]).mean(axis=1) + 0.5 * (boot == theta[:, None]).mean(axis=1)
    z0 = st.norm.ppf(np.clip(prop, 1.0 / reps, 1 - 1.0 / reps))
    n, m = a.shape[1], b.shape[1]
    jack_a = (a.sum(axis=1, keepdims=True) - a) / (n - 1) - b.mean(axis=1, keepdims=True)
    jack_b = a.mean(axis=1, keepdims=True) - (b.sum(axis=1, keepdims=True) - b) / (m - 1)
    jack = np.concatenate([jack_a, jack_b], axis=1)
    u = jack.mean(axis=1, keepdims=True) - jack
    with np.errstate(invalid="ignore", divide="ignore"):
        acc = np.nan_to_num((u**3).sum(axis=1) / (6 * ((u**2).sum(axis=1)) ** 1.5))
    q = (1 - confidence) / 2
    bounds = []
    for z in (st.norm.ppf(q), st.norm.ppf(1 - q)):
        level = st.norm.cdf(z0 + (z0 + z) / (1 - acc * (z0 + z)))
        bounds.append(np.array([np.quantile(row, lv) for row, lv in zip(boot, level)]))
    return bounds[0], bounds[1]


def paired_intervals(a, b, *, confidence: float = stats.CONFIDENCE, **_):
    d = a - b
    n = d.shape[1]
    half = st.t.ppf(0.5 + confidence / 2, n - 1) * d.std(axis=1, ddof=1) / math.sqrt(n)
    return d.mean(axis=1) - half, d.mean(axis=1) + half


def welch_intervals(a, b, *, confidence: float = stats.CONFIDENCE, **_):
    n, m = a.shape[1], b.shape[1]
    va, vb = a.var(axis=1, ddof=1) / n, b.var(axis=1, ddof=1) / m
    se2 = va + vb
    with np.errstate(invalid="ignore", divide="ignore"):
        df = se2**2 / (va**2 / (n - 1) + vb**2 / (m - 1))
    half = st.t.ppf(0.5 + confidence / 2, np.nan_to_num(df, nan=1.0)) * np.sqrt(se2)
    diff = a.mean(axis=1) - b.mean(axis=1)
    return diff - half, diff + half


INTERVALS = {"percentile": percentile_intervals, "bca": bca_intervals, "paired": paired_intervals,
             "welch": welch_intervals}


# ------------------------------------------------------------------------------------------------
# Coverage
# ------------------------------------------------------------------------------------------------


def simulate_seeds(n: int, sims: int, sd_a: float, sd_b: float, rho: float, rng: np.random.Generator,
                   mean_a: float = 0.80, diff: float = TRUE_DIFF) -> tuple[np.ndarray, np.ndarray]:
    """(sims x n) final accuracies of two variants whose true means differ by ``diff``; within a seed the
    two are correlated by ``rho``."""
    z = rng.standard_normal((2, sims, n))
    za, zb = z[0], rho * z[0] + math.sqrt(1 - rho * rho) * z[1]
    return mean_a + sd_a * za, mean_a - diff + sd_b * zb


def coverage(methods: Sequence[str] = CANDIDATES, seeds: Iterable[int] = (3, 5), *, sims: int = 4000, reps: int = 2000,
             scenarios: Mapping[str, tuple] = SCENARIOS, seed: int = 0) -> pd.DataFrame:
    """The share of simulated 95% intervals containing the true difference. Rows: method, seeds, scenario,
    coverage, mean_width; plus per (method, seeds) a row with scenario "all" (the mean over scenarios)."""
    rows = []
    for n in seeds:
        for k, (scenario, (sd_a, sd_b, rho)) in enumerate(scenarios.items()):
            rng = np.random.default_rng([seed, n, k])
            a, b = simulate_seeds(n, sims, sd_a, sd_b, rho, rng)
            for method in methods:
                low, high = INTERVALS[method](a, b, reps=reps, rng=np.random.default_rng([seed, n, k, 1]))
                rows.append({"method": method, "seeds": n, "scenario": scenario,
                             "coverage": float(np.mean((low <= TRUE_DIFF) & (TRUE_DIFF <= high))),
                             "mean_width": float(np.mean(high - low))})
    frame = pd.DataFrame(rows)
    overall = frame.groupby(["method", "seeds"], sort=False)[["coverage", "mean_width"]].mean().reset_index()
    overall["scenario"] = "all"
    return pd.concat([frame, overall], ignore_index=True)


# ------------------------------------------------------------------------------------------------
# A/A pairs
# ------------------------------------------------------------------------------------------------


def equivalent_groups(meta: Mapping | None) -> list[list[str]]:
    """The matrix's declared-equivalent variant groups: top-level ``equivalent`` in the matrix file (read from
    matrix.json's ``toml`` text, or an ``equivalent`` entry of matrix.json itself). [] when none; a malformed
    value is a ValueError."""
    meta = meta or {}
    groups = meta.get("equivalent")
    if groups is None and meta.get("toml"):
        groups = tomllib.loads(meta["toml"]).get("equivalent")
    if groups is None:
        return []
    if not isinstance(groups, list) or not all(isinstance(g, list) and all(isinstance(v, str) for v in g) for g in groups):
        raise ValueError(f"equivalent must be a list of lists of variant names, got {groups!r}")
    return [list(dict.fromkeys(g)) for g in groups if len(set(g)) >= 2]


def false_separation(per_cell: pd.DataFrame, groups: Sequence[Sequence[str]], *, method: str = stats.METHOD,
                     column: str = "final_accuracy", reps: int = stats.REPS, seed: int = stats.SEED) -> pd.DataFrame:
    """Every A/A pair (two variants of one declared group) on every task: its difference interval by ``method``
    and whether it separates them (excludes 0). Pairs where either has fewer than MIN_SEEDS_FOR_VERDICT runs
    are left out. Rows: task, a, b, diff, low, high, separated."""
    rows = []
    for task, frame in per_cell.groupby("task", sort=False):
        runs = {v: g.sort_values("seed")[column].to_numpy(float) for v, g in frame.groupby("variant", sort=False)}
        for group in groups:
            for a, b in itertools.combinations([v for v in group if v in runs], 2):
                x, y = runs[a], runs[b]
                if min(len(x), len(y)) < stats.MIN_SEEDS_FOR_VERDICT:
                    continue
                use = "welch" if method == "paired" and len(x) != len(y) else method
                diff, low, high = stats.difference_interval(x, y, use, reps=reps, seed=seed)
                rows.append({"task": task, "a": a, "b": b, "diff": diff, "low": low, "high": high,
                             "separated": bool(not (low <= 0.0 <= high))})
    return pd.DataFrame(rows, columns=["task", "a", "b", "diff", "low", "high", "separated"])


def false_separation_rate(per_cell: pd.DataFrame, groups: Sequence[Sequence[str]], **kwargs) -> tuple[float, int]:
    """(share of A/A pairs separated, number of pairs); (nan, 0) without pairs."""
    pairs = false_separation(per_cell, groups, **kwargs)
    return (float(pairs["separated"].mean()) if len(pairs) else math.nan), len(pairs)


if __name__ == "__main__":  # the numbers in the docstring
    table = coverage()
    print(table.pivot_table(index=["method", "scenario"], columns="seeds", values="coverage").round(3).to_string())
