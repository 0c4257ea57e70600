"""``grpo-bench variance DIR...``: where a primary metric's seed-to-seed spread comes from, and the design that
reaches a target MDD with the fewest core-seconds (the real-LM verdict's variance pilot).

A cell's primary metric M (final accuracy, the mean of the last K evaluations, or the AUC) is a linear function of
its evaluations, so over any subset S of the held-out questions it is the mean of per-question contributions m_q
(each question's own curve put through the same metric). Across the seeds of one variant,

    Var(M over Q questions) = policy + evaluation(Q),

*policy* the spread of what training produced (what more questions cannot remove), *evaluation* the spread of which
questions this policy happens to get right (it falls as 1 / Q). Split the questions at random into halves A and B:
the halves share the policy and not the questions, so Cov(M_A, M_B) estimates the policy part and
(Var(M_A) + Var(M_B)) / 2 - Cov(M_A, M_B) the evaluation part at Q / 2 questions (averaged over many random splits).
The intervals are percentile bootstraps over the seeds. Both parts are projected to other question counts Q' and
turned into the seeds a matrix of ``variants`` variants needs for the target MDD (``inference.seeds_for_mdd``, at
Tukey's critical value: equal spreads), and into core-seconds with the cells' own measured training and evaluation
costs. Greedy evaluation has no sampling noise: its evaluation part is question sampling alone.

It reads the per-question records that the harness keeps of every evaluation (``io.encode_correct``); a cell run
before they were kept has none and is left out, with a line saying so.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from benchmarks.curve import evaluations_needed, parse_primary, primary_value
from benchmarks.errors import UsageError
from benchmarks.io import decode_correct
from benchmarks.markdown import markdown_table
from benchmarks.report.inference import seeds_for_mdd
from benchmarks.report.matrix import collect

SPLITS = 200  # random half splits averaged per estimate
BOOTSTRAP = 500  # resamples of the seeds for the intervals
SEED = 0
METRICS = ("final", "last_2", "last_3", "auc")


def question_contributions(cell_evals: pd.DataFrame, primary: str, budget: float) -> tuple[np.ndarray, np.ndarray]:
    """One cell's per-question contributions to ``primary`` (length Q: their mean is the cell's metric over all
    questions) and the x (completions) of its evaluations. Raises ValueError when an evaluation kept no record."""
    rows = cell_evals.sort_values("samples", kind="stable")
    if rows["questions"].isna().any():
        raise ValueError("an evaluation without a per-question record")
    curves = np.array([decode_correct(text, int(k)) for text, k in zip(rows["questions"], rows["question_samples"])])
    x = rows["samples"].to_numpy(float)
    return np.array([primary_value(primary, x, curves[:, q], budget) for q in range(curves.shape[1])]), x


def split_half(m: np.ndarray, splits: int = SPLITS, rng: Optional[np.random.Generator] = None) -> tuple[float, float]:
    """(policy variance, evaluation variance at all Q questions) from per-seed, per-question contributions ``m``
    (seeds x Q), averaged over ``splits`` random half splits of the questions."""
    rng = rng or np.random.default_rng(SEED)
    n, q = m.shape
    half = q // 2
    order = np.argsort(rng.random((splits, q)), axis=1)  # one random permutation of the questions per split
    a = m[:, order[:, :half]].mean(-1)  # (n, splits): each seed's metric on half A
    b = m[:, order[:, half:2 * half]].mean(-1)
    da, db = a - a.mean(0), b - b.mean(0)
    cov = (da * db).sum(0) / (n - 1)
    evaluation = ((da ** 2).sum(0) + (db ** 2).sum(0)) / (2 * (n - 1)) - cov
    # The evaluation part at Q / 2 questions, halved for all Q (it scales as 1 / Q).
    return float(cov.mean()), float(evaluation.mean()) * half / q


def components(m: np.ndarray, *, splits: int = SPLITS, bootstrap: int = BOOTSTRAP, seed: int = SEED) -> dict:
    """The variance components of one variant's metric with percentile-bootstrap 95% intervals over its seeds."""
    rng = np.random.default_rng(seed)
    n, q = m.shape
    policy, evaluation = split_half(m, splits, rng)
    total = float(m.mean(1).var(ddof=1))
    draws = []
    for _ in range(bootstrap):
        index = rng.integers(0, n, n)
        if len(set(index.tolist())) < 2:
            continue  # every draw the same seed: no spread to split
        draws.append(split_half(m[index], max(10, splits // 10), rng))
    draws = np.array(draws) if draws else np.full((1, 2), math.nan)
    low, high = np.nanpercentile(draws, [2.5, 97.5], axis=0)
    return {"seeds": n, "questions": q, "mean": float(m.mean()), "total_var": total, "policy_var": policy,
            "evaluation_var": evaluation, "policy_var_low": float(low[0]), "policy_var_high": float(high[0]),
            "evaluation_var_low": float(low[1]), "evaluation_var_high": float(high[1])}


def projected_sd(policy_var: float, evaluation_var: float, questions: int, at: int) -> float:
    """The seed-to-seed sd at ``at`` questions from the components measured at ``questions`` (a negative policy
    estimate, sampling error when the policy part is small, counts as 0)."""
    return math.sqrt(max(policy_var, 0.0) + max(evaluation_var, 0.0) * questions / at)


def evaluations_of(primary: str, evaluations_run: int) -> int:
    """Evaluations a cell runs for ``primary``: the one before training, and what the metric needs after it (AUC:
    every one the pilot ran)."""
    kind, _ = parse_primary(primary)
    return 1 + (evaluations_run if kind == "auc" else evaluations_needed(primary))


def analyse(directory: str, *, metrics: Sequence[str] = METRICS, questions: Sequence[int] = (200, 500, 1000),
            target: float = 0.05, variants: int = 8, splits: int = SPLITS, bootstrap: int = BOOTSTRAP) -> dict:
    """Per task and variant of one matrix: the components of each primary metric, and per (metric, question count)
    the projected sd, the seeds for ``target`` among ``variants`` variants and the core-seconds that costs."""
    data = collect(Path(directory))
    cells, evals = data["cells"], data["evals"]
    if evals.empty or "questions" not in evals:
        raise UsageError(f"{directory}: no evaluation kept per-question records (cells run before the harness "
                         "recorded them): nothing to split")
    done = cells[cells.get("status") == "complete"]
    parts, plans, notes = [], [], []
    for (task, variant), group in done.groupby(["task", "variant"], sort=False):
        cell_evals = evals[(evals["task"] == task) & (evals["variant"] == variant)]
        recorded = [s for s, e in cell_evals.groupby("seed") if e["questions"].notna().all()]
        if len(recorded) < len(group):
            notes.append(f"{task} / {variant}: {len(group) - len(recorded)} of {len(group)} cells kept no per-question "
                         "record and are left out")
        if len(recorded) < 3:
            notes.append(f"{task} / {variant}: {len(recorded)} seeds with records: fewer than 3, no components")
            continue
        rows = group.set_index("seed").loc[recorded]
        budget = float(rows["budget"].dropna().iloc[0]) if rows["budget"].notna().any() else float(rows["completions_generated"].max())
        threads = rows["threads"].fillna(1) if "threads" in rows else pd.Series(1.0, index=rows.index)
        train_core_s = float((rows["wall_clock_s"] * threads).mean())
        run = cell_evals[cell_evals["seed"].isin(recorded)]
        evaluations_run = int(run.groupby("seed").size().min()) - 1  # after the one before training
        q_run = len(decode_correct(run["questions"].iloc[0], int(run["question_samples"].iloc[0])))
        eval_core_s = (float((rows["eval_s"] * threads).mean()) / ((evaluations_run + 1) * q_run)
                       if "eval_s" in rows and rows["eval_s"].notna().all() else math.nan)
        for primary in metrics:
            if evaluations_needed(primary) > evaluations_run:
                continue
            m = np.array([question_contributions(run[run["seed"] == s], primary, budget)[0] for s in recorded])
            c = components(m, splits=splits, bootstrap=bootstrap)
            parts.append({"task": task, "variant": variant, "primary": primary, **c})
            for at in questions:
                sd = projected_sd(c["policy_var"], c["evaluation_var"], c["questions"], at)
                seeds = seeds_for_mdd(target, sd, variants)
                per_cell = train_core_s + evaluations_of(primary, evaluations_run) * eval_core_s * at
                plans.append({"task": task, "variant": variant, "primary": primary, "questions": at, "sd": sd,
                              "seeds": seeds, "core_s_per_cell": per_cell,
                              "core_s_total": seeds * variants * per_cell if seeds else math.nan})
    if not parts:
        raise UsageError(f"{directory}: no variant has 3 or more seeds with per-question records"
                         + (f" ({'; '.join(notes)})" if notes else ""))
    return {"directory": str(directory), "target": target, "variants": variants, "parts": pd.DataFrame(parts),
            "plans": pd.DataFrame(plans), "notes": notes}


def headline(result: dict) -> str:
    """Per task and variant, the cheapest design for the target MDD, in one sentence."""
    plans = result["plans"].dropna(subset=["core_s_total"])
    if plans.empty:
        return f"No design reaches an MDD of {result['target']:g} within 2000 seeds a variant."
    sentences = []
    for (task, variant), frame in plans.groupby(["task", "variant"], sort=False):
        best = frame.loc[frame["core_s_total"].idxmin()]
        sentences.append(f"{task} / {variant}: {best['primary']} on {int(best['questions'])} questions, "
                         f"{int(best['seeds'])} seeds a variant, {best['core_s_total']:,.0f} core-seconds")
    return (f"Cheapest design for an MDD of {result['target']:g} among {result['variants']} variants: "
            + "; ".join(sentences) + ".")


def render(result: dict, command: str) -> str:
    parts, plans = result["parts"], result["plans"]
    lines = [f"**{headline(result)}**", "", f"Written by `{command}` from `{result['directory']}`.", "",
             "Variance components of each primary metric across seeds (split-half over the held-out questions, "
             f"{SPLITS} random splits; 95% bootstrap over the seeds). *Policy*: the spread of what training produced, "
             "which more questions cannot remove; *evaluation*: the spread of which questions a policy happens to "
             "get right, at the questions run (it falls as 1 / questions). sds, not variances, in the table.", ""]
    rows = []
    for r in parts.itertuples():
        share = max(r.policy_var, 0.0) / (max(r.policy_var, 0.0) + max(r.evaluation_var, 0.0)) if r.total_var > 0 else math.nan
        rows.append([r.task, r.variant, r.primary, r.seeds, r.questions, f"{r.mean:.3f}", f"{math.sqrt(r.total_var):.4f}",
                     f"{_sd(r.policy_var)} [{_sd(r.policy_var_low)}, {_sd(r.policy_var_high)}]",
                     f"{_sd(r.evaluation_var)} [{_sd(r.evaluation_var_low)}, {_sd(r.evaluation_var_high)}]",
                     f"{share:.0%}" if np.isfinite(share) else "-"])
    lines.append(markdown_table(["task", "variant", "primary metric", "seeds", "questions", "mean", "sd (all)",
                                 "policy sd [95%]", "evaluation sd [95%]", "policy share"], rows))
    lines += ["", f"Designs for an MDD of {result['target']:g} among {result['variants']} variants (Tukey's critical "
              "value, equal spreads; the sd projected from the components above): seeds per variant and what the "
              "matrix costs, from these cells' measured training and evaluation core-seconds. The cheapest design "
              "per task in bold. An MDD on the AUC is on its own scale (the AUC sits below the final accuracy and "
              "spreads less), so compare within a metric before across.", ""]
    rows = []
    for (task, variant), frame in plans.groupby(["task", "variant"], sort=False):
        best = frame["core_s_total"].idxmin() if frame["core_s_total"].notna().any() else None
        for i, r in frame.iterrows():
            cells = [r["primary"], int(r["questions"]), f"{r['sd']:.4f}", r["seeds"] if r["seeds"] else "> 2000",
                     f"{r['core_s_per_cell']:,.0f}", f"{r['core_s_total']:,.0f}" if np.isfinite(r["core_s_total"]) else "-"]
            if i == best:
                cells = [f"**{c}**" for c in cells]
            rows.append([task, variant] + cells)
    lines.append(markdown_table(["task", "variant", "primary metric", "questions", "projected sd", "seeds per variant",
                                 "core-s per cell", "core-s in all"], rows))
    lines += [""] + [f"- {n}" for n in result["notes"]]
    return "\n".join(lines).rstrip() + "\n"


def _sd(var: float) -> str:
    """A variance estimate as an sd; a negative estimate (sampling error around a small part) reads 0."""
    return "-" if not np.isfinite(var) else f"{math.sqrt(max(var, 0.0)):.4f}"


def records(results: Sequence[dict]) -> list[dict]:
    """``analyse``'s results as the json beside the report keeps them."""
    return [{"directory": r["directory"], "target": r["target"], "variants": r["variants"], "notes": r["notes"],
             "parts": r["parts"].to_dict("records"), "plans": r["plans"].to_dict("records")} for r in results]
