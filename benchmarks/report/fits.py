"""Compute-scaling fits of the learning curves, as in ScaleRL (Khatri et al. 2025, "The Art of Scaling
Reinforcement Learning Compute for LLMs"): per task and variant, the mean accuracy over seeds against
generated completions C is fitted with the sigmoid

    R(C) = R0 + (A - R0) / (1 + (C_mid / C) ** B)

R0 the accuracy before training (the variant's mean at C = 0, held fixed), A the asymptote (accuracy the
variant tends to with unlimited completions), C_mid the completions at which it is half way from R0 to A, B
the steepness (scipy.optimize.curve_fit, A in [0, 1], C_mid in [budget / 1000, 100 budget], B in [0.1, 10]).
A and C_mid get 95% percentile intervals from refitting on seeds resampled with replacement (FIT_REPS,
seeded). The fit's extrapolation is checked: fitted on the evaluations in the first half of the budget, its
prediction of the second half's mean accuracy is off by ``half_mae`` on average (mean absolute error) and
by ``half_final_error`` at the budget (predicted minus measured); ``half_points`` says how many evaluations
after the start that half holds (fewer than the 3 free parameters: no half-budget fit, the errors are nan).
``unfixed`` names the parameters the curve does not fix: the full fit's value, or an end of its bootstrap
interval, on the parameter's bound (A's 1.0, say, where the curve is still climbing at the budget).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd

from benchmarks.report import stats

FIT_REPS = 100  # bootstrap refits per variant (each starts from the full fit: about 1 s per task)
COLUMNS = ["task", "variant", "seeds", "R0", "A", "A_low", "A_high", "C_mid", "C_mid_low", "C_mid_high", "B",
           "unfixed", "fit_mae", "points", "half_mae", "half_final_error", "half_points", "budget"]
FREE_PARAMETERS = 3  # A, C_mid and B (R0 is the measured start)


def bounds(budget: float) -> tuple[list[float], list[float]]:
    """The fit's (lower, upper) bounds of (A, C_mid, B)."""
    return [0.0, budget * 1e-3, 0.1], [1.0, budget * 100.0, 10.0]


def unfixed(values: dict, budget: float) -> str:
    """The names among A, C_mid and B whose value (or interval end: ``values`` maps a name to its numbers) lies on
    the fit's bound, comma-joined ('' where none does): the bound, not the curve, set them."""
    lower, upper = bounds(budget)
    out = []
    for name, low, high in zip(("A", "C_mid", "B"), lower, upper):
        if any(np.isfinite(v) and (math.isclose(v, low, rel_tol=1e-6, abs_tol=1e-9) or
                                   math.isclose(v, high, rel_tol=1e-6, abs_tol=1e-9)) for v in values.get(name, ())):
            out.append(name)
    return ", ".join(out)


def sigmoid(c, r0: float, a: float, c_mid: float, b: float):
    c = np.asarray(c, dtype=float)
    with np.errstate(divide="ignore", over="ignore"):
        return r0 + (a - r0) / (1.0 + (c_mid / c) ** b)


def fit(c, r, r0: float, budget: float, p0=None) -> tuple[float, float, float]:
    """(A, C_mid, B) of R(C) fitted to the points (c, r) with c > 0; nans when fewer than FREE_PARAMETERS such
    points or the fit fails."""
    from scipy.optimize import curve_fit

    c, r = np.asarray(c, dtype=float), np.asarray(r, dtype=float)
    keep = (c > 0) & np.isfinite(r)
    c, r = c[keep], r[keep]
    if len(c) < FREE_PARAMETERS:
        return math.nan, math.nan, math.nan
    lower, upper = bounds(budget)
    if p0 is None or not np.all(np.isfinite(p0)):
        p0 = [float(np.clip(r[-1], 0.0, 1.0)), float(np.clip(np.median(c), lower[1], upper[1])), 1.5]
    p0 = np.clip(np.asarray(p0, dtype=float), lower, upper)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            params, _ = curve_fit(lambda x, a, m, b: sigmoid(x, r0, a, m, b), c, r, p0=p0, bounds=(lower, upper),
                                  maxfev=5000)
    except (RuntimeError, ValueError):
        return math.nan, math.nan, math.nan
    return float(params[0]), float(params[1]), float(params[2])


def _fit_variant(grid: np.ndarray, curves: np.ndarray, budget: float, reps: int, rng: np.random.Generator) -> dict:
    """``curves``: (seeds x grid points) accuracy; grid[0] = 0."""
    mean = curves.mean(axis=0)
    r0 = float(mean[0])
    a, c_mid, b = fit(grid, mean, r0, budget)
    fitted = sigmoid(grid[1:], r0, a, c_mid, b)
    row = {"seeds": len(curves), "R0": r0, "A": a, "C_mid": c_mid, "B": b, "points": int((grid > 0).sum()),
           "fit_mae": float(np.mean(np.abs(fitted - mean[1:]))) if np.isfinite(a) else math.nan}
    boots = []
    for _ in range(reps if len(curves) >= 2 else 0):
        sample = curves[rng.integers(0, len(curves), len(curves))].mean(axis=0)
        boots.append(fit(grid, sample, float(sample[0]), budget, p0=(a, c_mid, b))[:2])
    boots = np.array([p for p in boots if np.isfinite(p[0])]).reshape(-1, 2)
    for i, name in enumerate(("A", "C_mid")):
        low, high = np.quantile(boots[:, i], [0.025, 0.975]) if len(boots) else (math.nan, math.nan)
        row[f"{name}_low"], row[f"{name}_high"] = float(low), float(high)
    row["unfixed"] = unfixed({"A": (a, row["A_low"], row["A_high"]), "C_mid": (c_mid, row["C_mid_low"], row["C_mid_high"]),
                              "B": (b,)}, budget) if np.isfinite(a) else ""
    first, second = grid <= budget / 2, grid > budget / 2
    row["half_points"] = int((grid[first] > 0).sum())
    ha, hm, hb = fit(grid[first], mean[first], r0, budget)
    if np.isfinite(ha) and second.any():
        predicted = sigmoid(grid[second], r0, ha, hm, hb)
        row["half_mae"] = float(np.mean(np.abs(predicted - mean[second])))
        row["half_final_error"] = float(predicted[-1] - mean[second][-1])
    else:
        row["half_mae"] = row["half_final_error"] = math.nan
    return row


def scaling_fits(completions: pd.DataFrame, *, reps: int = FIT_REPS, seed: int = stats.SEED) -> pd.DataFrame:
    """One row per (task, variant) of the long curve frame (task, variant, seed, completions, accuracy on the
    task's grid, as curves.build gives it): R0, A and C_mid with bootstrap intervals, B, the fit's mean
    absolute error, and the half-budget extrapolation errors."""
    rows = []
    if completions is None or completions.empty:
        return pd.DataFrame(columns=COLUMNS)
    for (task, variant), frame in completions.groupby(["task", "variant"], sort=False):
        table = frame.pivot_table(index="seed", columns="completions", values="accuracy").dropna()
        if table.empty or table.columns[0] != 0:
            continue
        grid = table.columns.to_numpy(float)
        budget = float(grid[-1])
        rng = np.random.default_rng([seed, len(rows)])
        rows.append({"task": task, "variant": variant, "budget": budget,
                     **_fit_variant(grid, table.to_numpy(float), budget, reps, rng)})
    return pd.DataFrame(rows, columns=COLUMNS)
