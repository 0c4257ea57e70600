"""One cell's learning curve: held-out accuracy against generated completions, and the area under it.

Below the matrix (which chooses a tuned setting by it) and the report (which ranks by it): both read the
same curve from the same stored summary and metrics rows, so a tuning choice and a verdict never disagree
on what a run's AUC was.
"""

from __future__ import annotations

import re
from typing import Optional, Sequence

import numpy as np


def accuracy_curve(summary: dict, metrics: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """A finished cell's held-out accuracy against generated completions: before training (0), at each
    evaluation during training, and after (all the completions generated)."""
    x, y, generated = [0.0], [summary["accuracy_before"]], 0.0
    for row in metrics:
        generated += row.get("completions", 0.0)
        if "eval/accuracy" in row:
            x.append(generated), y.append(row["eval/accuracy"])
    x.append(float(summary.get("completions_generated", generated))), y.append(summary["accuracy_after"])
    return np.asarray(x), np.asarray(y)


def normalised_auc(x: Sequence[float], y: Sequence[float], x_max: float) -> float:
    """Area under the curve (x, y) over [0, x_max] by the trapezoid rule, divided by ``x_max``.

    ``x`` (completions, non-decreasing) starts at 0, the evaluation before training; ``y`` is accuracy in
    [0, 1], so the result is in [0, 1]: a curve at 1 throughout gives 1. A curve ending before ``x_max``
    is held at its last value (the run is over; its policy stays as it is), one going past is cut at
    ``x_max`` (linear interpolation there)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.ndim != 1 or x.shape != y.shape or len(x) == 0:
        raise ValueError(f"x and y must be 1-d of the same non-zero length, got {x.shape} and {y.shape}")
    if x_max <= 0:
        raise ValueError(f"x_max must be > 0, got {x_max}")
    if x[0] != 0:
        raise ValueError(f"a learning curve starts at 0 completions (the evaluation before training), got {x[0]}")
    if np.any(np.diff(x) < 0):
        raise ValueError("x must be non-decreasing")
    inside = x < x_max
    xs = np.append(x[inside], x_max)
    ys = np.append(y[inside], np.interp(x_max, x, y))  # np.interp holds the last value past the end
    return float(np.sum(np.diff(xs) * (ys[1:] + ys[:-1]) / 2) / x_max)


# ------------------------------------------------------------------------------------------------
# The primary metric: what a matrix's verdicts and its tuning both judge a cell by
# ------------------------------------------------------------------------------------------------

PRIMARY_DEFAULT = "final"


def parse_primary(name: str) -> tuple[str, int]:
    """("final", 1), ("last", K) for "last_K" (K >= 2) or ("auc", 0); ValueError with the choices otherwise."""
    if name == "final":
        return "final", 1
    if name == "auc":
        return "auc", 0
    if name.startswith("last_") and name[5:].isdigit() and int(name[5:]) >= 2:
        return "last", int(name[5:])
    raise ValueError(f"primary metric {name!r}: one of final (the accuracy after training), last_K (the mean of the "
                     "last K evaluations, the final one included, K >= 2) or auc (the area under accuracy against "
                     "completions, divided by the budget)")


def evaluations_needed(name: str) -> int:
    """How many evaluations during and after training a primary metric needs to mean what it says: last_K its
    K, AUC a curve of at least 3 points after the start (before-and-after alone makes AUC (before + after) / 2)."""
    kind, k = parse_primary(name)
    return {"final": 1, "last": k, "auc": 3}[kind]


def primary_value(name: str, x: Sequence[float], y: Sequence[float], budget: float) -> float:
    """One cell's primary metric from its curve (x completions from 0, y accuracy; the last point the final
    evaluation); nan when the curve has fewer evaluations than the metric needs."""
    kind, k = parse_primary(name)
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(y) - 1 < evaluations_needed(name):
        return float("nan")
    if kind == "final":
        return float(y[-1])
    if kind == "last":
        return float(np.mean(y[-k:]))
    return normalised_auc(x, y, budget)


def cell_scores(summary: dict, metrics: list[dict], primary: str, budget: float) -> tuple[float, float, float]:
    """A finished cell's (primary metric, AUC, final accuracy), from its stored summary and metrics rows: what a
    tuning choice ranks grid points by, and what the report of a tuning stage shows."""
    x, y = accuracy_curve(summary, metrics)
    return primary_value(primary, x, y, budget), normalised_auc(x, y, budget), float(summary["accuracy_after"])


# ------------------------------------------------------------------------------------------------
# A claim's other metric: pass@K after training, against a variant or the policy before training
# ------------------------------------------------------------------------------------------------

# A claim's control that is no variant: the treatment's own policy before training, as its cells evaluated it.
START = "start"
_PASS_AT = re.compile(r"pass@([1-9]\d*)")


def pass_at(metric: Optional[str]) -> Optional[int]:
    """K of a claim's metric "pass@K"; None for anything else (the primary metric: None)."""
    match = _PASS_AT.fullmatch(metric or "")
    return int(match[1]) if match else None


def pass_at_k_value(summary: dict, k: int, when: str) -> Optional[float]:
    """A cell's pass@k ``when`` "before" or "after" training (its summary's pass_at_k_before/after, written with
    RunConfig.pass_at_k); None where the cell did not evaluate it."""
    value = (summary.get(f"pass_at_k_{when}") or {}).get(str(k))
    return None if value is None else float(value)
