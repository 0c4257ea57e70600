"""Learning curves from the cells' evaluations: accuracy on the task's fixed held-out set against
generated completions and against training seconds, and each cell's curve summaries.

The matrix evaluates every cell at the same completion counts (multiples of the matrix's
``eval_every``, which plan.py turns into a step interval that divides it exactly). A cell whose
completions per step vary (DAPO's dynamic sampling counts discarded groups) is evaluated at other
counts; its curve is linearly interpolated onto the task's grid, and the report says so.
Against seconds, seeds never share instants: each seed's curve is interpolated onto a grid of 41
points from 0 to the task's longest training time, and a run that has finished is held at its final
accuracy (its policy no longer changes).

AUC, completions-to-threshold (linear between evaluations) and collapse are computed from each cell's
measured points, not the grid.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from benchmarks.curve import PRIMARY_DEFAULT, primary_value
from benchmarks.report.stats import collapsed, completions_to_threshold, never_learned, normalised_auc

# The columns that name a cell in the report's frames (cells, evaluations, steps), and those that name its curve (the
# algorithm follows from the variant).
CELL_KEYS = ["task", "variant", "algo", "seed"]
CURVE_KEYS = ["task", "variant", "seed"]
THRESHOLD_SHARE = 0.8  # completions to reach 80% of the best variant's mean final accuracy on the task
SECONDS_POINTS = 41


def _points(frame: pd.DataFrame, x: str, *, repeats: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """One cell's (x, accuracy) evaluation points, sorted, a repeated x kept once (its last value); with
    ``repeats`` every evaluation in the order it ran, as the tuning stage reads a cell
    (``benchmarks.curve.accuracy_curve``): DPO draws its samples up front, so all its evaluations sit at the
    budget, and a curve's one point there would leave "the last 3 evaluations" undefined."""
    pts = frame[[x, "accuracy"]].dropna().sort_values(x, kind="stable")
    if not repeats:
        pts = pts.drop_duplicates(x, keep="last")
    return pts[x].to_numpy(float), pts["accuracy"].to_numpy(float)


def completion_grids(cells: pd.DataFrame, evals: pd.DataFrame) -> dict[str, np.ndarray]:
    """Per task, the completion counts every curve is shown at: 0, each multiple of the task's eval
    interval (in completions) below the budget, and the budget."""
    grids = {}
    for task, group in cells.groupby("task", sort=False):
        done = evals[evals["task"] == task]
        budget = group["budget"].dropna().max() if "budget" in group else math.nan
        if pd.isna(budget):
            budget = done["samples"].max() if not done.empty else math.nan
        if pd.isna(budget) or budget <= 0:
            continue
        every = (group["eval_every"] * group["completions_per_step"]).dropna() if "eval_every" in group else pd.Series([], dtype=float)
        every = every[every > 0]
        interval = float(every.mode().iloc[0]) if not every.empty else float(budget)
        grid = np.arange(0.0, float(budget), interval)
        grids[task] = np.append(grid, float(budget))
    return grids


def build(cells: pd.DataFrame, evals: pd.DataFrame, primary: str = PRIMARY_DEFAULT) -> dict:
    """The curves and each complete cell's summaries.

    Returns {"completions": long frame (task, variant, seed, completions, accuracy, measured),
             "seconds": long frame (task, variant, seed, seconds, accuracy),
             "cells": per cell (task, variant, seed, budget, accuracy_before, final_accuracy, auc,
                      peak_accuracy, collapsed, never_learned, evaluations (after the start), primary (the
                      matrix's primary metric, ``benchmarks.curve.primary_value``), completions_to_threshold (interpolated),
                      completions_to_threshold_measured (the first evaluation at or above)), "thresholds": {task: accuracy threshold},
             "aligned": {task: True when every grid point of every cell was measured}}."""
    empty = {"completions": pd.DataFrame(), "seconds": pd.DataFrame(), "cells": pd.DataFrame(), "thresholds": {}, "aligned": {}}
    if evals.empty or "accuracy" not in evals:
        return empty
    grids = completion_grids(cells, evals)
    budgets = {t: g[-1] for t, g in grids.items()}
    longest = evals.groupby("task")["time/wall"].max().to_dict()
    by_completions, by_seconds, per_cell, aligned = [], [], [], {}
    for (task, variant, seed), frame in evals.groupby(CURVE_KEYS, sort=False):
        if task not in grids:
            continue
        x, y = _points(frame, "samples")
        if len(x) == 0 or x[0] != 0:
            continue
        grid = grids[task]
        measured = np.isin(grid, x) | (grid > x[-1])  # past its end a run is held, not interpolated
        aligned[task] = aligned.get(task, True) and bool(measured.all())
        by_completions.append(pd.DataFrame({"task": task, "variant": variant, "seed": seed, "completions": grid,
                                            "accuracy": np.interp(grid, x, y), "measured": measured}))
        ts, ys = _points(frame, "time/wall")
        seconds = np.linspace(0.0, max(longest.get(task, 0.0), 1e-9), SECONDS_POINTS)
        by_seconds.append(pd.DataFrame({"task": task, "variant": variant, "seed": seed, "seconds": seconds,
                                        "accuracy": np.interp(seconds, ts, ys)}))
        after = frame[frame["phase"] == "after"]["accuracy"] if "phase" in frame else frame["accuracy"].iloc[-1:]
        per_cell.append({"task": task, "variant": variant, "seed": seed, "budget": budgets[task],
                         "accuracy_before": y[0], "final_accuracy": float(after.iloc[-1]) if len(after) else y[-1],
                         "auc": normalised_auc(x, y, budgets[task]), "peak_accuracy": float(np.max(y)),
                         "primary": primary_value(primary, *_points(frame, "samples", repeats=True), budgets[task]),
                         "evaluations": len(y) - 1,
                         "collapsed": collapsed(y), "never_learned": never_learned(y), "x": x, "y": y})
    if not per_cell:
        return empty
    cell_frame = pd.DataFrame(per_cell)
    best = cell_frame.groupby(["task", "variant"], sort=False)["final_accuracy"].mean().groupby("task", sort=False).max()
    thresholds = {task: THRESHOLD_SHARE * value for task, value in best.items()}
    cell_frame["threshold"] = cell_frame["task"].map(thresholds)
    cell_frame["completions_to_threshold"] = [completions_to_threshold(r.x, r.y, r.threshold) for r in cell_frame.itertuples()]
    cell_frame["completions_to_threshold_measured"] = [completions_to_threshold(r.x, r.y, r.threshold, interpolate=False)
                                                       for r in cell_frame.itertuples()]
    return {"completions": pd.concat(by_completions, ignore_index=True),
            "seconds": pd.concat(by_seconds, ignore_index=True),
            "cells": cell_frame.drop(columns=["x", "y"]), "thresholds": thresholds, "aligned": aligned}
