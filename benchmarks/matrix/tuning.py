"""Tuned baselines: every variant gets the same tuning budget before it is compared.

A matrix with a ``[tuning]`` table runs in two stages. First each variant runs every point of its grid
(for example four learning rates; DPO's table may add its beta) on the tuning seeds, evaluated on the task's
validation problems (``eval_set = "validation"``, disjoint from the test problems, where the task has them).
Then each variant's evaluation seeds run at the point whose mean primary metric over the tuning seeds is
highest: the metric the matrix's ``[analysis]`` states (final accuracy when it states none), the one its
verdicts judge by. The verdicts use the evaluation seeds and the test problems only, so neither the seeds nor
the problems that chose a setting judge it.
A point where any tuning seed failed (diverged, timed out) is never chosen; a tie goes to the grid's
first point in the file's order.

``choose`` is a pure function of the store, so a resumed matrix chooses the same points again and skips
the evaluation cells it already has. The table it returns (every point's mean AUC and final accuracy)
is kept in matrix.json; the report turns it into each variant's chosen setting and its sensitivity:
how much final accuracy moves across the grid.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from benchmarks.curve import PRIMARY_DEFAULT, cell_scores
from benchmarks.matrix.plan import Plan, TuningGroup
from benchmarks.store import ResultStore


def _score(store: ResultStore, cell, primary: str) -> Optional[tuple[float, float, float]]:
    """(primary metric, AUC, final accuracy) of a finished tuning cell; None when it failed or is missing."""
    summary = store.summary(cell.relpath)
    if not summary or summary.get("status") != "complete":
        return None
    return cell_scores(summary, store.metrics(cell.relpath), primary, cell.budget)


def choose(plan: Plan, store: ResultStore) -> tuple[list[int], list[dict]]:
    """Per tuning group, the index of the chosen grid point, and the table behind the choice."""
    primary = plan.analysis.primary if plan.analysis else PRIMARY_DEFAULT
    chosen, table = [], []
    for group in plan.tuning:
        rows = [_point_row(group, i, store, primary) for i in range(len(group.points))]
        usable = [r for r in rows if r["failed"] == 0 and r["seeds"] > 0]
        best = max(usable, key=lambda r: r["primary"]) if usable else rows[0]  # max keeps the first of equal scores
        chosen.append(rows.index(best))
        table.append({"task": group.task_label, "variant": group.variant, "chosen": rows.index(best), "points": rows})
    return chosen, table


def _point_row(group: TuningGroup, i: int, store: ResultStore, primary: str) -> dict:
    scores = [_score(store, cell, primary) for cell in group.tuning_cells[i]]
    done = [s for s in scores if s is not None]
    return {"point": TuningGroup.label(group.points[i]), "settings": group.points[i],
            "seeds": len(done), "failed": len(scores) - len(done), "primary_metric": primary,
            "primary": float(np.mean([p for p, _, _ in done])) if done else math.nan,
            "auc": float(np.mean([a for _, a, _ in done])) if done else math.nan,
            "final_accuracy": float(np.mean([f for _, _, f in done])) if done else math.nan,
            "cells": [cell.relpath for cell in group.tuning_cells[i]]}
