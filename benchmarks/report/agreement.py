"""``grpo-bench agreement A B``: does a rerun of a matrix (another machine, another thread count) reach the
same verdicts?

Seed for seed, a rerun elsewhere is a different run: another CPU (or another thread count on this one)
sums in another order, the rounding differs in the last bits at the first step, and sampling diverges
from there. What a rerun should agree on is what the statistics claim, within their stated error:

  * every mark (best, worse, equivalent, not resolved: benchmarks/report/inference.py) on every task that
    ranks: each run's marks of a task hold together with probability >= 95%, so a mark may move between
    "not resolved" and a decided one when a comparison sits near its interval's edge, but two runs should
    never disagree in direction (one "worse" where the other says "best");
  * the variant means: each of B's means inside A's 95% interval for that variant, again in all but
    about 5% of the variants.

The report lists both, variant by variant, and a headline with the counts. It reads the two result
stores and matrix.json files only.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from benchmarks.markdown import markdown_table, with_interval
from benchmarks.report.matrix import matrix_verdicts


def agreement(first: Path | str, second: Path | str) -> pd.DataFrame:
    """Per (task, variant) present in both: each run's mark and mean, whether the marks agree and whether
    the second's mean lies inside the first's 95% interval."""
    a, b = matrix_verdicts(first), matrix_verdicts(second)
    if a.empty or b.empty:
        return pd.DataFrame()
    both = a.merge(b, on=["task", "variant"], suffixes=("_a", "_b"))
    both["same_mark"] = both["mark_a"] == both["mark_b"]
    both["mean_b_in_a"] = (both["final_mean_low_a"] <= both["final_mean_b"]) & (both["final_mean_b"] <= both["final_mean_high_a"])
    return both


def render(table: pd.DataFrame, first: str, second: str) -> str:
    if table.empty:
        return f"# Agreement of `{second}` with `{first}`\n\nNo complete cells in common: nothing to compare.\n"
    ranking = table[~table["saturated_a"]]
    marks = f"{int(ranking['same_mark'].sum())} of {len(ranking)} marks agree on the tasks that rank"
    means = f"{int(table['mean_b_in_a'].sum())} of {len(table)} means of the rerun lie inside the first run's 95% interval"
    lines = [f"# Agreement of `{second}` with `{first}`", "",
             f"**{marks}; {means}.**", "",
             "A rerun elsewhere is a different run seed for seed (other rounding, then other samples); what it should "
             "share is the verdicts, within the procedure's stated error (each run's marks of a task hold together with "
             "probability >= 95%; about 5% of the means may fall outside the first run's 95% interval).", ""]
    rows = [[r.task, r.variant, f"{r.seeds_a} / {r.seeds_b}",
             with_interval(r.final_mean_a, r.final_mean_low_a, r.final_mean_high_a),
             with_interval(r.final_mean_b, r.final_mean_low_b, r.final_mean_high_b),
             r.mark_a, r.mark_b, "yes" if r.same_mark else "**no**", "yes" if r.mean_b_in_a else "**no**"]
            for r in table.itertuples()]
    lines.append(markdown_table(["task", "variant", "seeds", "first: mean [95% CI]", "rerun: mean [95% CI]",
                                 "first: mark", "rerun: mark", "same mark", "rerun mean in first's CI"], rows))
    return "\n".join(lines) + "\n"
