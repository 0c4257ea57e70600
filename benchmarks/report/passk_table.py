"""pass@k in a matrix's report, where its cells evaluated it (a run's ``pass_at_k``, benchmarks/passk.py): each
cell's pass@k before and after training as columns of the cells table (``cell_columns``), and per task a table of
each variant's mean pass@k over its seeds before and after training with 95% t-intervals, and after - before paired
by seed (each cell's own difference) with its 95% t-interval (``summarize``, ``markdown``).

A description beside the verdicts, which stay on the primary metric: the claims that are about pass@k are judged in
``grpo-bench claims`` (claims.py). Variants whose cells recorded no pass@k are named under their task's table; a
matrix none of whose cells recorded it shows nothing.
"""

from __future__ import annotations

import math
import re

import pandas as pd

from benchmarks.markdown import markdown_table, plus_minus, with_interval
from benchmarks.report.stats import t_interval

WHEN = ("before", "after")
_COLUMN = re.compile(r"pass_at_([1-9]\d*)_(before|after)")
# summarize's frame: one row per (task, variant, k); n_*: the seeds each mean is over (paired: with both)
COLUMNS = ["task", "variant", "k", "seeds", "before_mean", "before_ci95", "n_before", "after_mean", "after_ci95",
           "n_after", "difference_mean", "difference_low", "difference_high", "n_paired"]
KEY = ("Mean over seeds ± the half-width of its 95% t-interval, over the complete cells that recorded pass@k (the "
       "seeds column; a value over fewer seeds says how many); after - before is paired by seed: the mean of each "
       "cell's own difference, with its 95% t-interval. A description beside the verdicts, which stay on the primary "
       "metric.")


def column(k: int, when: str) -> str:
    """The cells table's column of pass@k ``when`` ("before" or "after") training."""
    return f"pass_at_{k}_{when}"


def cell_columns(summary: dict) -> dict:
    """A cell summary's pass@k as cells-table columns, {column(k, when): value}, k ascending, before then after;
    {} for a cell that did not evaluate pass@k."""
    out = {}
    for when in WHEN:
        found = summary.get(f"pass_at_k_{when}") or {}
        for k in sorted(found, key=int):
            out[column(int(k), when)] = float(found[k])
    return out


def ks(cells: pd.DataFrame) -> list[int]:
    """The ks some cell of ``cells`` recorded, ascending."""
    return sorted({int(m[1]) for name in cells.columns if (m := _COLUMN.fullmatch(str(name)))})


def summarize(cells: pd.DataFrame) -> pd.DataFrame:
    """One row per (task, variant, k) over the complete cells that recorded pass@k: before and after training, each
    the mean and its 95% t half-width over the seeds that have it, and after - before paired by seed with its 95%
    t-interval (``COLUMNS``); empty where no cell recorded pass@k."""
    found = ks(cells)
    if not found or "status" not in cells:
        return pd.DataFrame(columns=COLUMNS)
    done = cells[cells["status"] == "complete"]
    rows = []
    for (task, variant), group in done.groupby(["task", "variant"], sort=False):
        values = {when: {k: pd.to_numeric(group.get(column(k, when), pd.Series(math.nan, index=group.index)),
                                          errors="coerce") for k in found} for when in WHEN}
        recorded = pd.concat([v for per_k in values.values() for v in per_k.values()], axis=1).notna().any(axis=1)
        for k in found:
            before, after = values["before"][k], values["after"][k]
            if before.isna().all() and after.isna().all():
                continue
            difference = (after - before).dropna()
            d_mean, d_half = t_interval(difference)
            rows.append({"task": task, "variant": variant, "k": k, "seeds": int(recorded.sum()),
                         **dict(zip(["before_mean", "before_ci95"], t_interval(before))), "n_before": before.count(),
                         **dict(zip(["after_mean", "after_ci95"], t_interval(after))), "n_after": after.count(),
                         "difference_mean": d_mean, "difference_low": d_mean - d_half,
                         "difference_high": d_mean + d_half, "n_paired": len(difference)})
    return pd.DataFrame(rows, columns=COLUMNS)


def _value(mean: float, half: float, n: int, seeds: int) -> str:
    text = plus_minus(mean, half, seeds=n)
    return text if n == seeds or text == "-" else f"{text} ({n} seeds)"


def _difference(r: dict) -> str:
    n = int(r["n_paired"])
    text = with_interval(r["difference_mean"], r["difference_low"], r["difference_high"], "{:+.3f}", seeds=n)
    return text if n == r["seeds"] or text == "-" else f"{text} ({n} seeds)"


def markdown(cells: pd.DataFrame) -> str:
    """Per task, a table of ``summarize``'s rows: a row a variant, for each k its pass@k before, after and after -
    before; under it the task's variants left out (no complete cell recorded pass@k). "" where no cell did."""
    table = summarize(cells)
    if table.empty:
        return ""
    found = sorted(table["k"].unique())
    parts = [KEY]
    for task in dict.fromkeys(cells["task"]):
        mine = table[table["task"] == task]
        variants = list(dict.fromkeys(cells.loc[cells["task"] == task, "variant"]))
        if mine.empty:
            parts.append(f"`{task}`: no variant recorded pass@k.")
            continue
        headers = ["variant", "seeds"] + [f"pass@{k} {what}" for k in found for what in ("before", "after",
                                                                                         "after - before")]
        rows = []
        for variant in [v for v in variants if v in set(mine["variant"])]:
            per_k = {r["k"]: r for r in mine[mine["variant"] == variant].to_dict("records")}
            seeds = int(next(iter(per_k.values()))["seeds"])
            row = [variant, seeds]
            for k in found:
                r = per_k.get(k)
                row += (["-"] * 3 if r is None else
                        [_value(r["before_mean"], r["before_ci95"], int(r["n_before"]), seeds),
                         _value(r["after_mean"], r["after_ci95"], int(r["n_after"]), seeds), _difference(r)])
            rows.append(row)
        parts.append(f"`{task}`:\n\n" + markdown_table(headers, rows))
        left_out = [v for v in variants if v not in set(mine["variant"])]
        if left_out:
            parts.append(f"Left out on `{task}` (no complete cell recorded pass@k): "
                         + ", ".join(f"`{v}`" for v in left_out) + ".")
    return "\n\n".join(parts)
