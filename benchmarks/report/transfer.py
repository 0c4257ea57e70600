"""``grpo-bench transfer TOY REAL``: does a toy matrix's ranking of the algorithms carry over to a real one?

Two matrices rank algorithms on different tasks (the toy addition task, a real LM on Reasoning Gym). For the
algorithms both ran (``pairs``: the toy's variant name and the real one's, which may differ, e.g. a tuned
variant on the toy), the report puts side by side each matrix's own verdict (mean with its 95% interval and
its mark against that matrix's best) and the two rankings of the common algorithms, and measures their
agreement with Kendall's tau-b (scipy), whose p-value tests "no association". With a handful of algorithms
that test has little power (with 6 only a near-perfect agreement reaches p < 0.05): the report says so and
gives the smallest tau that would.

It reads the two result stores and matrix.json files only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import pandas as pd

from benchmarks.errors import UsageError
from benchmarks.markdown import markdown_table, with_interval
from benchmarks.report.matrix import matrix_verdicts
from benchmarks.report.inference import TOO_FEW


def _ranking_task(verdicts: pd.DataFrame, directory: Path) -> pd.DataFrame:
    tasks = sorted(set(verdicts["task"]))
    if len(tasks) != 1:
        raise UsageError(f"{directory}: transfer compares one task per matrix, found {', '.join(tasks) or 'none'}")
    return verdicts.set_index("variant")


def smallest_significant_tau(n: int, alpha: float = 0.05) -> Optional[float]:
    """The smallest tau > 0 that Kendall's exact test (two-sided) calls at ``alpha`` with ``n`` untied items
    (None: none can): tau = 1 - 2 d / C(n, 2) for d discordant pairs, tried from the most d down."""
    from scipy.stats import kendalltau

    pairs = n * (n - 1) // 2
    for discordant in range(pairs // 2, -1, -1):
        left, code = discordant, []
        for i in range(n):  # a Lehmer code with ``discordant`` inversions, greedily
            code.append(min(left, n - 1 - i))
            left -= code[-1]
        remaining = list(range(n))
        order = [remaining.pop(c) for c in code]
        result = kendalltau(range(n), order, method="exact")
        if result.statistic > 0 and result.pvalue < alpha:
            return float(result.statistic)
    return None


def transfer(toy: Path | str, real: Path | str, pairs: Sequence[tuple[str, str]]) -> dict:
    """Per common algorithm: both matrices' verdicts and ranks; Kendall's tau-b of the two rankings."""
    from scipy.stats import kendalltau

    toy, real = Path(toy), Path(real)
    toy_verdicts, real_verdicts = (_ranking_task(matrix_verdicts(d), d) for d in (toy, real))
    missing = [f"{toy}: {a}" for a, _ in pairs if a not in toy_verdicts.index]
    missing += [f"{real}: {b}" for _, b in pairs if b not in real_verdicts.index]
    if missing:
        raise UsageError(f"no finished cells for {missing[0]}")
    rows = []
    for toy_name, real_name in pairs:
        a, b = toy_verdicts.loc[toy_name], real_verdicts.loc[real_name]
        rows.append({"algorithm": real_name, "toy_variant": toy_name, "toy_seeds": int(a["seeds"]),
                     "toy_mean": a["final_mean"], "toy_low": a["final_mean_low"], "toy_high": a["final_mean_high"],
                     "toy_mark": a["mark"], "toy_in_set": bool(a["in_best_set"]), "real_seeds": int(b["seeds"]),
                     "real_mean": b["final_mean"], "real_low": b["final_mean_low"], "real_high": b["final_mean_high"],
                     "real_mark": b["mark"], "real_in_set": bool(b["in_best_set"])})
    table = pd.DataFrame(rows)
    table["toy_rank"] = table["toy_mean"].rank(ascending=False, method="min").astype(int)
    table["real_rank"] = table["real_mean"].rank(ascending=False, method="min").astype(int)
    tau = kendalltau(table["toy_mean"], table["real_mean"])
    return {"toy": str(toy), "real": str(real), "toy_task": str(toy_verdicts["task"].iloc[0]),
            "real_task": str(real_verdicts["task"].iloc[0]), "table": table.sort_values("real_rank"),
            "tau": float(tau.statistic), "p_value": float(tau.pvalue), "n": len(table),
            "tau_needed": smallest_significant_tau(len(table))}


def headline(result: dict) -> str:
    table = result["table"]
    toy_first = table.sort_values("toy_rank").iloc[0]
    real_first = table.sort_values("real_rank").iloc[0]
    real_best = set(table.loc[table["real_in_set"], "algorithm"])
    needed = result["tau_needed"]
    power = (f"with {result['n']} algorithms only tau >= {needed:.2f} reaches p < 0.05" if needed is not None
             else f"with {result['n']} algorithms no ranking reaches p < 0.05")
    carried = "carries over" if result["p_value"] < 0.05 and result["tau"] > 0 else "is not shown to carry over"
    if not (table["real_mark"] == TOO_FEW).any():
        first = (f"the toy's first of these, {toy_first['toy_variant']}, is "
                 f"{'also' if toy_first['algorithm'] in real_best else 'not'} in {result['real_task']}'s could-be-best set")
    else:
        first = f"{result['real_task']} has too few seeds for marks yet"
    return (f"**The toy ranking {carried}: Kendall's tau-b {result['tau']:+.2f} (p {result['p_value']:.2f}; {power}); "
            f"{first}; first on {result['real_task']}: {real_first['algorithm']}.**")


def render(result: dict, command: str) -> str:
    rows = [[r.algorithm, r.toy_variant,
             with_interval(r.toy_mean, r.toy_low, r.toy_high), r.toy_mark, r.toy_rank,
             with_interval(r.real_mean, r.real_low, r.real_high), r.real_mark, r.real_rank]
            for r in result["table"].itertuples()]
    lines = [headline(result), "",
             f"The algorithms both matrices ran: on the toy task ({result['toy_task']}, `{result['toy']}`) and on "
             f"the real one ({result['real_task']}, `{result['real']}`), each matrix's own verdict (final mean with its "
             "95% interval, its mark from that matrix's simultaneous comparison with the best: "
             "benchmarks/report/inference.py) and the rank among these algorithms.", "",
             markdown_table(["algorithm", "toy variant", f"{result['toy_task']}: mean [95% CI]", "toy mark", "toy rank",
                             f"{result['real_task']}: mean [95% CI]", "real mark", "real rank"], rows),
             "", f"Regenerate: `{command}`"]
    return "\n".join(lines) + "\n"

