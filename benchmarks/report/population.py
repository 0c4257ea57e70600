"""Which population a verdict's marks speak for, and what the question draw would do to them: one line per task.

The marks rest on the seed-to-seed spread of the primary metric. Where every cell of a task evaluates the same
questions (``crossed.population``), that spread leaves the question draw out: the marks speak for "these N
questions, new seeds". Where the store keeps per-question records of such a fixed set, the crossed seeds x
questions analysis (benchmarks/report/crossed.py) says what a new draw of questions would add: the line gives the
median over pairs of the question part over the seeds-only variance (``question_share``), and the marks that
would change were each pair's half-width scaled by sqrt(crossed / seeds-only variance) with the critical value c
unchanged. That is indicative only: c was calibrated for the seeds-only model, and the registered procedure's
marks stand.

This module sits above crossed.py (which reads the store through report/matrix.py and the verdicts' stated
analysis), so the matrix report takes it from its caller, the command line, rather than importing it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Union

import numpy as np

from benchmarks.errors import UsageError
from benchmarks.report import crossed, inference

NO_RECORDS = ("Population: new seeds on the task's evaluation questions; the store keeps no per-question records of "
              "them, so the question draw cannot be split from the seed draw here.")


def task_lines(directory: Union[str, Path], analysis: dict) -> dict[str, str]:
    """{task: the population line} for every task of ``analysis`` (``verdicts.analyse``'s, with its ``fits``)."""
    tasks = list(dict.fromkeys(analysis["tasks"]["task"])) if not analysis["tasks"].empty else []
    if not tasks:
        return {}
    try:
        frame = crossed.question_scores(directory, analysis["spec"]["primary"])
    except UsageError:  # cells run before the harness kept per-question records
        return {task: NO_RECORDS for task in tasks}
    held = set(frame["task"])
    margin = analysis["spec"].get("margin")
    return {task: (line(frame, task, (analysis.get("fits") or {}).get(task), analysis["tasks"], margin)
                   if task in held else NO_RECORDS) for task in tasks}


def line(frame, task: str, fit, marks, margin) -> str:
    """One task's line: the population, and where the question set is fixed the crossed analysis's effect."""
    phrase = crossed.population(frame, crossed=False, task=task)
    text = f"Population: {phrase}."
    if not phrase.startswith("these") or fit is None or not np.isfinite(fit.c):
        return text
    pairs = crossed.pair_variances(frame, task=task)
    if pairs.empty:
        return text
    share = float(np.nanmedian(pairs["question_share"])) if pairs["question_share"].notna().any() else math.nan
    crossed_var, _ = crossed.pair_matrices(pairs, list(fit.variants))
    seeds_var, _ = crossed.pair_matrices(pairs, list(fit.variants), crossed=False)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.sqrt(crossed_var / seeds_var)
    scale = np.where(np.isfinite(scale), scale, 1.0)  # the diagonal, and pairs without records: unchanged
    now = marks[marks["task"] == task].set_index("variant")["mark"]
    moved = [f"`{v}` {now[v]} -> {m}" for v, m in zip(fit.variants, inference.scaled_marks(fit, scale, margin))
             if v in now.index and now[v] != m]
    return (text + f" The crossed seeds x questions analysis (indicative, not the registered procedure): the "
            f"question part over the seeds-only variance is {_number(share)} (median over {len(pairs)} pairs); with "
            "each pair's half-width scaled by sqrt(crossed / seeds-only variance), c unchanged, "
            + ("; ".join(moved) if moved else "no mark changes") + ".")


def _number(x: float) -> str:
    return "not estimable" if not np.isfinite(x) else f"{x:.2f}"
