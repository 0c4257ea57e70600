"""Verdicts: per task, the variants ranked with bootstrap intervals, the set tied with the best, what
each costs, and only the guidance sentences the numbers support.

The rules, stated once:
  * a task *ranks nothing* when every variant's mean final accuracy is >= 0.95 or every one is <= 0.05
    (saturated: the task cannot tell the variants apart, whatever the intervals say);
  * on a task that ranks, the variant with the highest mean final accuracy is "best"; another is
    "tied with best" when the 95% Welch t interval of its mean's difference to the best's contains 0,
    else "worse" (stats.mark_against_best; fewer than 3 seeds: no mark; why Welch and not the bootstrap:
    benchmarks.report.calibration);
  * "the statistics do not separate the variants on TASK" when every variant is best or tied;
  * "X is best or tied with best on all N tasks that rank" only when that holds for X on every such
    task; "of those, Y has the lowest mean training time" names the measured minimum, nothing more.

Beside the marks, per task: the power of that comparison (the minimum detectable difference at 80% power
for the task's seed count and pooled seed-to-seed spread), per variant the collapse rate with its Wilson
interval, the ScaleRL compute-scaling fit (benchmarks.report.fits), and, when the matrix declares groups of
equivalent variants (top-level ``equivalent``), the share of those A/A pairs the intervals separate.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from benchmarks.report import calibration, fits, stats
from benchmarks.report.curves import THRESHOLD_SHARE
from benchmarks.markdown import markdown_table, with_interval

SATURATED_HIGH, SATURATED_LOW = 0.95, 0.05
PROFILE_TAUS = np.linspace(0.0, 1.0, 41)


def _runs(frame: pd.DataFrame, column: str) -> dict[str, np.ndarray]:
    """{variant: its seeds' values}, variants in the frame's order."""
    return {v: g.sort_values("seed")[column].to_numpy(float) for v, g in frame.groupby("variant", sort=False)}


def _pooled(per_cell: pd.DataFrame, column: str, tasks: list[str]) -> dict[str, np.ndarray]:
    """{variant: (runs x tasks) normalised scores}: per task (value - start) / (1 - start), with start the
    task's mean accuracy before training (the starting policy), over the seeds a variant completed on
    every task."""
    out = {}
    starts = per_cell.groupby("task")["accuracy_before"].mean()
    tasks = [t for t in tasks if starts[t] < 1.0]
    for variant, group in per_cell.groupby("variant", sort=False):
        group = group[group["task"].isin(tasks)]
        table = group.pivot_table(index="seed", columns="task", values=column)
        if set(table.columns) != set(tasks):
            continue
        table = table[tasks].dropna()
        if table.empty:
            continue
        out[variant] = np.column_stack([stats.normalise(table[t], starts[t]) for t in tasks])
    return out


def _pooled_sd_and_seeds(frame: pd.DataFrame, column: str) -> tuple[float, int]:
    """The seed count (the median over variants) and the pooled seed-to-seed standard deviation (the root
    mean of the variants' variances, those with 2 or more seeds) of ``frame``'s cells."""
    groups = frame.groupby("variant", sort=False)[column]
    sizes, variances = groups.count(), groups.var(ddof=1)
    variances = variances[sizes >= 2].dropna()
    n = int(np.median(sizes)) if len(sizes) else 0
    return (float(np.sqrt(variances.mean())) if len(variances) else math.nan), n


def contenders(marks: pd.DataFrame) -> list[str]:
    """The variants a verdict is about, for one task's marks (ranked best first): the best and those tied
    with it, and when the best stands alone, its nearest rival too (the comparison that decided it)."""
    top = [r.variant for r in marks.itertuples() if r.mark in (stats.BEST, stats.TIED)]
    if len(top) < 2 and len(marks) >= 2:
        top = list(marks["variant"].iloc[:2])
    return top


def power(per_cell: pd.DataFrame, column: str = "final_accuracy", marks: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per task: the seed count, the pooled seed-to-seed standard deviation and the minimum detectable
    difference of two variants' means at 80% power, two-sided 5% (stats.minimum_detectable_difference), over
    every variant; with ``marks`` (analyse's table), the same over the task's ``contenders`` alone, whose
    spread is the one that decides the close calls (a collapsing variant's spread says nothing about them)."""
    rows = []
    for task, frame in per_cell.groupby("task", sort=False):
        sd, n = _pooled_sd_and_seeds(frame, column)
        row = {"task": task, "seeds": n, "pooled_sd": sd, "mdd": stats.minimum_detectable_difference(sd, n),
               "contenders": "", "contenders_seeds": 0, "contenders_sd": math.nan, "contenders_mdd": math.nan}
        if marks is not None and not marks.empty and task in set(marks["task"]):
            top = contenders(marks[marks["task"] == task])
            top_sd, top_n = _pooled_sd_and_seeds(frame[frame["variant"].isin(top)], column)
            row.update(contenders=", ".join(top), contenders_seeds=top_n, contenders_sd=top_sd,
                       contenders_mdd=stats.minimum_detectable_difference(top_sd, top_n))
        rows.append(row)
    return pd.DataFrame(rows, columns=["task", "seeds", "pooled_sd", "mdd", "contenders", "contenders_seeds",
                                       "contenders_sd", "contenders_mdd"])


def analyse(cells: pd.DataFrame, curves: dict, *, reps: int = stats.REPS, seed: int = stats.SEED,
            meta: dict | None = None, equivalent: list | None = None, scaling: bool = True) -> dict:
    """Everything the verdict section and its tables need.

    Returns {"tasks": per (task, variant) row with final accuracy and AUC estimates, completions to the
    threshold, the mark and the costs; "overall": normalised mean / IQM per variant over tasks;
    "poi": P(X > Y) per task and overall; "profiles": performance profiles of normalised final
    accuracy; "saturated": {task: bool}; "sentences": the guidance; "power": per task MDD; "scaling_fits":
    per (task, variant) ScaleRL fit; "aa": the A/A pairs of the ``equivalent`` groups (default: those
    ``meta``'s matrix file declares) and whether each is separated}."""
    per_cell = curves.get("cells", pd.DataFrame())
    if per_cell.empty:
        return {"tasks": pd.DataFrame(), "overall": pd.DataFrame(), "poi": pd.DataFrame(), "profiles": pd.DataFrame(),
                "saturated": {}, "sentences": [], "thresholds": {}, "power": pd.DataFrame(),
                "scaling_fits": pd.DataFrame(columns=fits.COLUMNS), "aa": pd.DataFrame(), "tuning": tuning_table(meta)}
    done = cells[cells["status"] == "complete"]
    cost = done.groupby(["task", "variant"], sort=False)[["wall_clock_s", "peak_memory_bytes"]].mean()
    rows, saturated, poi = [], {}, []
    tasks = list(dict.fromkeys(per_cell["task"]))
    for task in tasks:
        frame = per_cell[per_cell["task"] == task]
        final, auc = _runs(frame, "final_accuracy"), _runs(frame, "auc")
        means = {v: float(np.mean(x)) for v, x in final.items()}
        saturated[task] = all(m >= SATURATED_HIGH for m in means.values()) or all(m <= SATURATED_LOW for m in means.values())
        marks = stats.mark_against_best(final, reps=reps, seed=seed).set_index("variant")
        final_est = stats.mean_and_iqm(final, reps=reps, seed=seed).set_index("name")
        auc_est = stats.mean_and_iqm(auc, reps=reps, seed=seed).set_index("name")
        for variant in marks.index:
            mine = frame[frame["variant"] == variant]
            ctt = mine["completions_to_threshold"].to_numpy(float)
            n_collapsed = int(mine["collapsed"].sum()) if "collapsed" in mine else 0
            collapse_low, collapse_high = stats.wilson_interval(n_collapsed, len(mine))
            row = {"task": task, "variant": variant, "seeds": len(final[variant]),
                   **{f"final_{k}": v for k, v in final_est.loc[variant].items()},
                   **{f"auc_{k}": v for k, v in auc_est.loc[variant].items()},
                   "threshold": curves["thresholds"][task],
                   "completions_to_threshold": float(np.median(ctt)) if len(ctt) else math.nan,
                   "threshold_reached": int(np.isfinite(ctt).sum()),
                   "collapsed": n_collapsed, "collapse_rate": n_collapsed / len(mine) if len(mine) else math.nan,
                   "collapse_low": collapse_low, "collapse_high": collapse_high,
                   **marks.loc[variant, ["diff", "diff_low", "diff_high", "mark"]].to_dict(),
                   "saturated": saturated[task]}
            if (task, variant) in cost.index:
                row["wall_clock_s"], row["peak_memory_bytes"] = cost.loc[(task, variant)]
            rows.append(row)
        task_poi = stats.probability_of_improvement(final)
        task_poi.insert(0, "task", task)
        poi.append(task_poi)
    table = pd.DataFrame(rows)

    final_pooled, auc_pooled = _pooled(per_cell, "final_accuracy", tasks), _pooled(per_cell, "auc", tasks)
    overall = pd.DataFrame()
    profiles = pd.DataFrame()
    if final_pooled:
        overall = stats.mean_and_iqm(final_pooled, reps=reps, seed=seed).add_prefix("final_").rename(columns={"final_name": "variant"})
        auc_overall = stats.mean_and_iqm(auc_pooled, reps=reps, seed=seed).add_prefix("auc_").rename(columns={"auc_name": "variant"})
        overall = overall.merge(auc_overall, on="variant")
        overall["seeds"] = [len(final_pooled[v]) for v in overall["variant"]]
        overall = overall.sort_values("final_iqm", ascending=False, kind="stable").reset_index(drop=True)
        all_poi = stats.probability_of_improvement(final_pooled)
        all_poi.insert(0, "task", "all tasks")
        poi.append(all_poi)
        profiles = stats.performance_profiles(final_pooled, PROFILE_TAUS, reps=reps, seed=seed)
    result = {"tasks": table, "overall": overall, "poi": pd.concat(poi, ignore_index=True), "profiles": profiles,
              "saturated": saturated, "thresholds": curves["thresholds"], "aligned": curves.get("aligned", {}),
              "pooled_tasks": [t for t in tasks if per_cell[per_cell["task"] == t]["accuracy_before"].mean() < 1.0]}
    result["sentences"] = guidance(table)
    result["power"] = power(per_cell, marks=table)
    result["scaling_fits"] = fits.scaling_fits(curves.get("completions"), seed=seed) if scaling else pd.DataFrame(columns=fits.COLUMNS)
    result["tuning"] = tuning_table(meta)
    groups = calibration.equivalent_groups(meta) if equivalent is None else equivalent
    result["equivalent"] = groups
    result["aa"] = calibration.false_separation(per_cell, groups, reps=reps, seed=seed)
    return result


def undecided(scores: dict[str, list[float]], target: float) -> list[str]:
    """Racing's rule for one task: the variants whose mark more seeds could still change.

    A variant worse than the best is decided; one tied with it is decided when the whole interval of the
    difference lies within +-``target`` (equivalent for a practitioner's purposes), else undecided; the best
    is undecided while any rival is (its seeds narrow every comparison). A saturated task decides nothing
    more (it ranks nothing) and neither does one with too few seeds for a mark (all undecided)."""
    means = [float(np.mean(v)) for v in scores.values() if len(v)]
    if means and (all(m >= SATURATED_HIGH for m in means) or all(m <= SATURATED_LOW for m in means)):
        return []
    marks = stats.mark_against_best(scores)
    if marks["mark"].str.startswith("too few").any():
        return list(scores)
    open_ = [r.variant for r in marks.itertuples()
             if r.mark == stats.TIED and max(abs(r.diff_low), abs(r.diff_high)) > target]
    best = [r.variant for r in marks.itertuples() if r.mark == stats.BEST]
    return [v for v in scores if v in open_ or (open_ and v in best)]


def tuning_table(meta: dict | None) -> pd.DataFrame:
    """Per (task, variant) and grid point of the matrix's ``[tuning]``: the mean AUC and final accuracy on the
    tuning seeds, which point was chosen, and the variant's sensitivity (the spread of final accuracy across
    its grid: how forgiving it is of the setting). Empty without tuning."""
    table = ((meta or {}).get("tuning") or {}).get("table") or []
    rows = []
    for group in table:
        finals = [p["final_accuracy"] for p in group["points"] if p["seeds"]]
        spread = (max(finals) - min(finals)) if finals else math.nan
        for i, point in enumerate(group["points"]):
            rows.append({"task": group["task"], "variant": group["variant"], "point": point["point"],
                         "chosen": i == group["chosen"], "auc": point["auc"], "final_accuracy": point["final_accuracy"],
                         "tuning_seeds": point["seeds"], "failed": point["failed"], "sensitivity": spread})
    return pd.DataFrame(rows)


def _tuning_lines(analysis: dict, task: str) -> list[str]:
    tuned = analysis.get("tuning", pd.DataFrame())
    if tuned is None or tuned.empty or task not in set(tuned["task"]):
        return []
    mine = tuned[tuned["task"] == task]
    points = list(dict.fromkeys(mine["point"]))
    rows = []
    for variant, group in mine.groupby("variant", sort=False):
        by_point = group.set_index("point")
        cells = []
        for point in points:
            if point not in by_point.index:
                cells.append("")
                continue
            r = by_point.loc[point]
            text = "failed" if r["failed"] else f"{r['auc']:.3f} / {r['final_accuracy']:.3f}"
            cells.append(f"**{text}**" if r["chosen"] else text)
        rows.append([variant, *cells, f"{group['sensitivity'].iloc[0]:.3f}"])
    n = int(mine["tuning_seeds"].max())
    return ["", f"Tuning ({n} tuning seed(s), disjoint from the seeds above): AUC / final accuracy at each grid point, "
                "mean over the tuning seeds; **bold** is the point each variant ran with (highest AUC). *Sensitivity*: "
                "the spread of final accuracy across the grid (small: forgiving of the setting).", "",
            markdown_table(["variant", *points, "sensitivity"], rows)]


def _names(variants: list[str]) -> str:
    quoted = [f"`{v}`" for v in variants]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]


def guidance(table: pd.DataFrame) -> list[str]:
    """The sentences the marks support, by the rules in the module docstring."""
    if table.empty:
        return []
    sentences, ranking = [], []
    for task, frame in table.groupby("task", sort=False):
        if frame["saturated"].iloc[0]:
            level = "at or above 0.95" if frame["final_mean"].min() >= SATURATED_HIGH else "at or below 0.05"
            sentences.append(f"`{task}` ranks nothing: every variant's mean final accuracy is {level}.")
            continue
        judged = frame[frame["mark"].isin([stats.BEST, stats.TIED, stats.WORSE])]
        if len(judged) < 2:
            sentences.append(f"`{task}`: fewer than {stats.MIN_SEEDS_FOR_VERDICT} seeds per variant, so no verdict.")
            continue
        short = [v for v in frame["variant"] if v not in set(judged["variant"])]
        not_judged = f"{_names(short)} not judged: fewer than {stats.MIN_SEEDS_FOR_VERDICT} seeds" if short else ""
        ranking.append(task)
        top = judged[judged["mark"].isin([stats.BEST, stats.TIED])]
        if len(top) == len(judged):
            sentences.append(f"The statistics do not separate the variants on `{task}`"
                             + (f" ({not_judged})." if short else "."))
            continue
        sentence = (f"On `{task}`, best or tied with best: {_names(list(top['variant']))} ({len(top)} of {len(judged)}"
                    + (f"; {not_judged})" if short else ")"))
        if len(top) > 1 and "wall_clock_s" in top and top["wall_clock_s"].notna().all():
            fastest = top.loc[top["wall_clock_s"].idxmin()]
            sentence += f"; of those, `{fastest['variant']}` has the lowest mean training time ({fastest['wall_clock_s']:.1f} s)"
        sentences.append(sentence + ".")
    if len(ranking) >= 2:
        frame = table[table["task"].isin(ranking)]
        good = frame[frame["mark"].isin([stats.BEST, stats.TIED])].groupby("variant", sort=False)["task"].nunique()
        everywhere = [v for v, n in good.items() if n == len(ranking)]
        if everywhere:
            sentence = (f"{_names(everywhere)} {'is' if len(everywhere) == 1 else 'are'} best or tied with best on all "
                        f"{len(ranking)} tasks that rank ({', '.join(f'`{t}`' for t in ranking)})")
            seconds = frame[frame["variant"].isin(everywhere)].groupby("variant", sort=False)["wall_clock_s"].sum()
            if len(everywhere) > 1 and seconds.notna().all():
                sentence += (f"; of those, `{seconds.idxmin()}` has the lowest mean training time "
                             f"({seconds.min():.1f} s summed over those tasks)")
            sentences.append(sentence + ".")
        else:
            sentences.append(f"No variant is best or tied with best on all {len(ranking)} tasks that rank.")
    elif not ranking:
        sentences.append("No task in this matrix ranks the variants.")
    return sentences


def _threshold_text(r) -> str:
    reached = f"{r['threshold_reached']}/{r['seeds']}"
    return f"not reached ({reached})" if math.isinf(r["completions_to_threshold"]) else f"{r['completions_to_threshold']:.0f} ({reached})"


def _collapse_text(r) -> str:
    if pd.isna(r.get("collapse_rate")):
        return "-"
    return f"{r['collapsed']}/{r['seeds']} [{r['collapse_low']:.2f}, {r['collapse_high']:.2f}]"


def _scaling_lines(analysis: dict, task: str, frame: pd.DataFrame) -> list[str]:
    """The ScaleRL fits of a task that ranks (saturated tasks' fits are in tables/scaling_fits.csv only)."""
    fitted = analysis.get("scaling_fits", pd.DataFrame())
    if fitted is None or fitted.empty or frame["saturated"].iloc[0]:
        return []
    fitted = fitted[fitted["task"] == task].set_index("variant")
    rows = [[v, f"{f['R0']:.3f}", with_interval(f["A"], f["A_low"], f["A_high"]),
             with_interval(f["C_mid"], f["C_mid_low"], f["C_mid_high"], "{:.0f}"), f"{f['B']:.2f}",
             f"{f['half_mae']:.3f}", f"{f['half_final_error']:+.3f}"]
            for v, f in fitted.reindex(list(frame["variant"])).dropna(subset=["R0"]).iterrows() if np.isfinite(f["B"])]
    if not rows:  # e.g. evaluated before and after only: two points cannot fix four parameters
        return ["", "Compute scaling: no ScaleRL fit, the curves have too few evaluations for its four parameters."]
    return ["", "Compute scaling (ScaleRL's R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) on the mean curve; intervals: "
                "seeds resampled; *half-budget error*: fitted on the first half of the budget, its mean absolute error "
                "on the second half's evaluations and its error at the budget):", "",
            markdown_table(["variant", "R0", "asymptote A [95% CI]", "C_mid [95% CI]", "B", "half-budget MAE",
                            "error at budget"], rows)]


def render(analysis: dict, *, scaling: bool = True) -> str:
    """The verdict section as markdown; ``scaling``: with a compute-scaling table per ranking task (without,
    one line pointing to tables/scaling_fits.csv: what a README section shows)."""
    table = analysis["tasks"]
    if table.empty:
        return "### Verdicts\n\nNo complete cells with evaluations yet: nothing to rank.\n"
    lines = ["### Verdicts", "",
             "Final accuracy on each task's held-out evaluation set, over seeds: mean and interquartile mean (IQM) "
             f"with stratified-bootstrap 95% intervals ({stats.REPS} resamples, seed {stats.SEED}; rliable, Agarwal et al. "
             "2021). A variant is *tied with best* when the 95% Welch t interval of its mean's difference to the best's "
             "contains 0 (with 3-5 seeds a bootstrap interval covers only 81-88% of the time; the Welch interval 95%: "
             "benchmarks/report/calibration.py). *MDD*: the smallest difference of two means that 80% of matrices like this "
             "one would detect (two-sided 5%, t with 2n - 2 degrees of freedom, the task's pooled seed-to-seed sd). "
             "AUC is the area under accuracy against generated completions, divided by the budget (1 = perfect from the "
             "start). *To threshold*: the median over seeds of the completions at which the curve (linear between "
             f"evaluations) first reached {THRESHOLD_SHARE:.0%} of the best variant's mean final accuracy (seeds that reached "
             f"it in brackets). *Collapsed*: seeds ending >= {stats.COLLAPSE_DROP} below their peak or below the start, "
             "with a Wilson 95% interval. Costs are means over seeds: training seconds and peak memory.", ""]
    lines += [f"- {s}" for s in analysis["sentences"]]
    aa = analysis.get("aa", pd.DataFrame())
    if aa is not None and not aa.empty:
        lines.append(f"- A/A check: of the {len(aa)} pairs of variants declared equivalent (same update), over tasks, "
                     f"{int(aa['separated'].sum())} ({aa['separated'].mean():.0%}) are separated by the 95% intervals "
                     "(expected: about 5% or fewer).")
    power_by_task = analysis.get("power", pd.DataFrame())
    power_by_task = power_by_task.set_index("task") if not power_by_task.empty else power_by_task
    for task, frame in table.groupby("task", sort=False):
        note = " (ranks nothing: saturated)" if frame["saturated"].iloc[0] else ""
        aligned = analysis.get("aligned", {}).get(task, True)
        power_text = ""
        if task in power_by_task.index:
            p = power_by_task.loc[task]
            power_text = (f" MDD {p['mdd']:.3f} ({int(p['seeds'])} seeds, pooled seed-to-seed sd {p['pooled_sd']:.3f})")
            if p.get("contenders") and np.isfinite(p.get("contenders_mdd", math.nan)):
                power_text += (f"; among the contenders ({', '.join(f'`{v}`' for v in p['contenders'].split(', '))}) "
                               f"MDD {p['contenders_mdd']:.3f} ({int(p['contenders_seeds'])} seeds, "
                               f"sd {p['contenders_sd']:.3f})")
            power_text += "."
        lines += ["", f"#### `{task}`{note}", "",
                  f"Threshold: accuracy {analysis['thresholds'][task]:.3f}." + power_text
                  + ("" if aligned else " Some curves were evaluated at other completion counts than the task's grid "
                                        "(variable completions per step); their points were interpolated for the plots."),
                  ""]
        rows = []
        for rank, r in enumerate(frame.itertuples(index=False), 1):
            r = r._asdict()
            rows.append([rank, r["variant"], r["seeds"], with_interval(r["final_mean"], r["final_mean_low"], r["final_mean_high"]),
                         with_interval(r["final_iqm"], r["final_iqm_low"], r["final_iqm_high"]),
                         with_interval(r["diff"], r["diff_low"], r["diff_high"], "{:+.3f}"), r["mark"],
                         with_interval(r["auc_mean"], r["auc_mean_low"], r["auc_mean_high"]), _threshold_text(r),
                         _collapse_text(r),
                         "-" if pd.isna(r.get("wall_clock_s")) else f"{r['wall_clock_s']:.1f}",
                         "-" if pd.isna(r.get("peak_memory_bytes")) else f"{r['peak_memory_bytes'] / 2**20:.0f}"])
        lines.append(markdown_table(["rank", "variant", "seeds", "final accuracy mean [95% CI]", "IQM [95% CI]",
                                     "difference to best [95% CI]", "verdict", "AUC mean [95% CI]", "completions to threshold",
                                     "collapsed [95% CI]", "training s", "peak MiB"], rows))
        lines += _tuning_lines(analysis, task)
        if scaling:
            lines += _scaling_lines(analysis, task, frame)
    fitted = analysis.get("scaling_fits")
    if not scaling and fitted is not None and not fitted.empty:
        lines += ["", "Compute-scaling fits (ScaleRL's sigmoid of accuracy against completions: asymptote, midpoint, "
                      "half-budget extrapolation error) per task and variant: the matrix report and tables/scaling_fits.csv."]
    overall = analysis["overall"]
    if not overall.empty and len(analysis["pooled_tasks"]) > 1:
        lines += ["", f"#### All tasks ({', '.join(f'`{t}`' for t in analysis['pooled_tasks'])})", "",
                  "Scores normalised per task: 0 is the starting policy's mean accuracy, 1 is accuracy 1.0; runs are the seeds a "
                  "variant completed on every task. Saturated tasks are included (they squeeze everyone towards the same score).",
                  "", markdown_table(
                      ["variant", "seeds", "normalised final IQM [95% CI]", "normalised final mean [95% CI]",
                       "normalised AUC IQM [95% CI]", "normalised AUC mean [95% CI]"],
                      [[r.variant, r.seeds, with_interval(r.final_iqm, r.final_iqm_low, r.final_iqm_high),
                        with_interval(r.final_mean, r.final_mean_low, r.final_mean_high),
                        with_interval(r.auc_iqm, r.auc_iqm_low, r.auc_iqm_high),
                        with_interval(r.auc_mean, r.auc_mean_low, r.auc_mean_high)] for r in overall.itertuples()])]
        poi = analysis["poi"]
        top = overall["variant"].iloc[0]
        pairs = poi[(poi["task"] == "all tasks") & (poi["x"] == top)]
        if not pairs.empty:
            lines += ["", f"Probability of improvement of `{top}` (highest normalised IQM) over each other variant, averaged over "
                          "tasks (Mann-Whitney; every pair in tables/probability_of_improvement.csv): "
                      + ", ".join(f"`{r.y}` {r.probability:.2f}" for r in pairs.itertuples()) + "."]
    return "\n".join(lines) + "\n"

