"""``grpo-bench agreement A B``: does a rerun of a matrix (another machine, another thread count) reach the
same verdicts?

Seed for seed, a rerun elsewhere is a different run: another CPU (or another thread count on this one)
sums in another order, the rounding differs in the last bits at the first step, and sampling diverges
from there. What a rerun should agree on is what the statistics claim, within their stated error:

  * every mark (best, worse, equivalent, not resolved: benchmarks/report/inference.py) on every task that
    ranks: each run's marks of a task hold together with probability >= 95%, so a mark may move between
    "not resolved" and a decided one when a comparison sits near its interval's edge, but two runs should
    never disagree in direction (one "worse" where the other says "best");
  * the variant means of the primary metric (the one the marks are computed on: final accuracy, or the
    matrix's stated ``[analysis] primary``): each of B's means inside A's 95% interval for that variant
    (stratified bootstrap over its seeds, as the report's), again in all but about 5% of the variants.

The report lists both, variant by variant, and a headline with the counts. It reads the two result
stores and matrix.json files only.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from benchmarks.markdown import markdown_table, with_interval
from benchmarks.report.matrix import matrix_verdicts


def agreement(first: Path | str, second: Path | str) -> pd.DataFrame:
    """Per (task, variant) present in both: each run's mark and primary mean with its 95% interval, whether the
    marks agree and whether the second's mean lies inside the first's interval."""
    a, b = matrix_verdicts(first), matrix_verdicts(second)
    if a.empty or b.empty:
        return pd.DataFrame()
    both = a.merge(b, on=["task", "variant"], suffixes=("_a", "_b"))
    both["same_mark"] = both["mark_a"] == both["mark_b"]
    both["mean_b_in_a"] = ((both["primary_all_low_a"] <= both["primary_all_mean_b"])
                           & (both["primary_all_mean_b"] <= both["primary_all_high_a"]))
    return both


def render(table: pd.DataFrame, first: str, second: str) -> str:
    if table.empty:
        return f"# Agreement of `{second}` with `{first}`\n\nNo complete cells in common: nothing to compare.\n"
    ranking = table[~table["saturated_a"]]
    metrics = dict.fromkeys(list(table["primary_metric_a"]) + list(table["primary_metric_b"]))
    marks = f"{int(ranking['same_mark'].sum())} of {len(ranking)} marks agree on the tasks that rank"
    means = f"{int(table['mean_b_in_a'].sum())} of {len(table)} means of the rerun lie inside the first run's 95% interval"
    lines = [f"# Agreement of `{second}` with `{first}`", "",
             f"**{marks}; {means}.**", "",
             "Primary metric (the marks' and the means'): " + " in the first run, ".join(
                 f"`{m}`" for m in metrics) + ("" if len(metrics) == 1 else " in the rerun: the runs measure different "
                                               "things, and their marks cannot be compared") + ".", "",
             "A rerun elsewhere is a different run seed for seed (other rounding, then other samples); what it should "
             "share is the verdicts, within the procedure's stated error (each run's marks of a task hold together with "
             "probability >= 95%; about 5% of the means may fall outside the first run's 95% interval).", ""]
    rows = [[r.task, r.variant, f"{r.seeds_a} / {r.seeds_b}",
             with_interval(r.primary_all_mean_a, r.primary_all_low_a, r.primary_all_high_a, seeds=r.seeds_a),
             with_interval(r.primary_all_mean_b, r.primary_all_low_b, r.primary_all_high_b, seeds=r.seeds_b),
             r.mark_a, r.mark_b, "yes" if r.same_mark else "**no**", "yes" if r.mean_b_in_a else "**no**"]
            for r in table.itertuples()]
    lines.append(markdown_table(["task", "variant", "seeds", "first: mean [95% CI]", "rerun: mean [95% CI]",
                                 "first: mark", "rerun: mark", "same mark", "rerun mean in first's CI"], rows))
    return "\n".join(lines) + "\n"
