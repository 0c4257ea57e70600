"""Verdicts: per task, which variants could be the best, which are worse and by how much, which are equivalent to
the best within a stated margin, with the family-wise error controlled; what each costs; and only the guidance
sentences those marks support.

The procedure (benchmarks/report/inference.py): one primary metric per matrix, stated in its ``[analysis]`` before
its cells run (final accuracy when a matrix stated none: the report says so); simultaneous 95% intervals for each
variant's gap to the best of the others (Hsu's multiple comparisons with the best), blocked on the seed that
cells of different variants share (common random numbers), each pair's interval with its own spread and a critical
value calibrated by simulation for unequal spreads. A matrix is marked by the procedure it registered (its
analysis's ``procedure``, else the one in use when its analysis was stated: ``inference.registered``; none
registered: the current one); where the current procedure (``inference.PROCEDURE``) marks a variant differently,
the task's section lists those marks below the registered ones. A mark that changes when the critical value moves
within its Monte Carlo error is printed *fragile*. The marks:

  * *best*: better than every other variant (its interval above 0);
  * *worse*: below the best by at least the amount shown (its interval below 0);
  * *equivalent to best*: its interval within +-margin (the matrix's stated margin; none stated, none claimed);
  * *not resolved*: the variant could be the best and the seeds cannot say more (the MDD says what would);
  * the *could-be-best set* (every variant not "worse") is a 95% confidence set for the best; beside it, each
    variant's posterior probability of being best and how often a rerun of the design gives back the same set.

A task *ranks nothing* when every variant's mean primary metric is >= 0.95 or every one is <= 0.05. Curve metrics
(AUC, completions to a threshold) are printed only where every curve has at least 3 evaluations after the start: a
before-and-after curve's AUC is (before + after) / 2 and its "completions to threshold" a rescaled final accuracy.
A run *collapsed* when it fell >= 0.3 below its peak and stayed there; a run that *never learned* (never above its
start) is counted apart. Where the cells recorded their task's *constant baseline* (what one answer given to every
question scores: a policy that learns the answers' distribution and not the skill climbs to it) and how alike each
policy answers, a task's section states both, and the verdict sentence says when variants of the could-be-best set
are not above that baseline.
"""

from __future__ import annotations

import math
import tomllib
from typing import Optional

import numpy as np
import pandas as pd

from benchmarks.curve import PRIMARY_DEFAULT, evaluations_needed
from benchmarks.markdown import lower_bound, markdown_table, with_interval
from benchmarks.report import fits, inference, stats
from benchmarks.report.curves import THRESHOLD_SHARE

SATURATED_HIGH, SATURATED_LOW = 0.95, 0.05
PROFILE_TAUS = np.linspace(0.0, 1.0, 41)
CURVE_EVALUATIONS = 3  # evaluations after the start a curve metric needs (see the module docstring)
# The final evaluation's shortcut measures a cell may record (reasoning_gym's evaluation): means over seeds.
SHORTCUT_COLUMNS = ("constant_baseline_after", "answer_top_share_after")
SHORTCUT_TOLERANCE = 1e-9  # a primary metric equal to the baseline (a policy answering it to all) is not above it
PRIMARY_NAMES = {"final": "final accuracy", "auc": "AUC (accuracy against completions, over the budget)"}


def analysis_spec(meta: dict | None) -> dict:
    """The matrix's stated analysis: primary metric, margin, target MDD, and whether (and when) it was stated
    before its cells ran (matrix.json's ``analysis``, written by the matrix at its first session)."""
    stated = (meta or {}).get("analysis")
    spec = {"primary": PRIMARY_DEFAULT, "margin": None, "target_mdd": None, "claims": [], "stated_at": None}
    if stated:
        return {**spec, **stated, "stated": stated.get("stated_at") is not None}
    try:  # a matrix file with [analysis] whose first session predates its record: stated, not pre-registered
        table = tomllib.loads((meta or {}).get("toml") or "").get("analysis") or {}
    except tomllib.TOMLDecodeError:
        table = {}
    return {**spec, **{k: v for k, v in table.items() if k in spec}, "stated": False}


def primary_name(primary: str) -> str:
    if primary.startswith("last_"):
        return f"mean accuracy of the last {primary[5:]} evaluations"
    return PRIMARY_NAMES.get(primary, primary)


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


def _aa_pairs(task: str, fit: inference.Fit | None, groups: list) -> list[dict]:
    """The declared-equivalent pairs of one task, each separated when the procedure's simultaneous interval of
    their difference excludes 0."""
    if fit is None or not np.isfinite(fit.c):
        return []
    index = {v: i for i, v in enumerate(fit.variants)}
    widths = fit.half_widths
    rows = []
    for group in groups:
        present = [v for v in group if v in index]
        for i, a in enumerate(present):
            for b in present[i + 1:]:
                ia, ib = index[a], index[b]
                diff = float(fit.means[ia] - fit.means[ib])
                half = float(widths[ia, ib])
                rows.append({"task": task, "a": a, "b": b, "diff": diff, "half_width": half,
                             "separated": abs(diff) > half})
    return rows


def analyse(cells: pd.DataFrame, curves: dict, *, reps: int = stats.REPS, seed: int = stats.SEED,
            meta: dict | None = None, equivalent: list | None = None, scaling: bool = True) -> dict:
    """Everything the verdict section and its tables need.

    Returns {"spec": the stated analysis; "tasks": per (task, variant) row with the primary metric, the marks, final
    accuracy and (where the curves carry them) AUC estimates and completions to the threshold, and the costs;
    "power": per task the model, MDD and what more seeds buy; "overall": normalised mean / IQM per variant over
    tasks; "poi": P(X > Y) per task and overall; "profiles"; "saturated": {task: bool}; "sentences"; "scaling_fits";
    "aa": the declared-equivalent pairs (default: those ``meta``'s matrix file declares) and whether each is
    separated}."""
    spec = analysis_spec(meta)
    per_cell = curves.get("cells", pd.DataFrame())
    empty = {"spec": spec, "tasks": pd.DataFrame(), "overall": pd.DataFrame(), "poi": pd.DataFrame(),
             "profiles": pd.DataFrame(), "saturated": {}, "sentences": [], "thresholds": {}, "power": pd.DataFrame(),
             "scaling_fits": pd.DataFrame(columns=fits.COLUMNS), "aa": pd.DataFrame(), "tuning": tuning_table(meta),
             "curve_metrics": {}}
    if per_cell.empty:
        return empty
    if "primary" not in per_cell:
        per_cell = per_cell.assign(primary=per_cell["final_accuracy"])
    groups = _equivalent_groups(meta) if equivalent is None else equivalent
    registered = inference.registered((meta or {}).get("analysis"))
    procedure = registered or inference.PROCEDURE
    done = cells[cells["status"] == "complete"]
    cost_columns = ["wall_clock_s", "peak_memory_bytes"] + [c for c in ("training_cpu_s", "steps", "steps_planned")
                                                            if c in done]  # where the cells recorded them
    cost_columns += [c for c in SHORTCUT_COLUMNS if c in done]  # the final evaluation's, where recorded
    cost = done.groupby(["task", "variant"], sort=False)[cost_columns].mean()
    # peak memory is a mean over the cells that ran first in their process (report.matrix.fresh_process_peaks)
    cost["peak_memory_n"] = done.groupby(["task", "variant"], sort=False)["peak_memory_bytes"].count()
    tasks = list(dict.fromkeys(per_cell["task"]))
    judged = [_judge_task(task, per_cell[per_cell["task"] == task], curves["thresholds"][task], cost, spec, groups,
                          reps=reps, seed=seed, procedure=procedure) for task in tasks]
    table = pd.DataFrame([row for j in judged for row in j["rows"]])
    overall, profiles, all_poi = _over_tasks(per_cell, tasks, reps=reps, seed=seed)
    power_table = pd.DataFrame([j["power"] for j in judged])
    curve_ok = {task: j["curve_ok"] for task, j in zip(tasks, judged)}
    result = {**empty, "tasks": table, "overall": overall,
              "poi": pd.concat([j["poi"] for j in judged] + all_poi, ignore_index=True), "profiles": profiles,
              "saturated": {task: j["saturated"] for task, j in zip(tasks, judged)}, "thresholds": curves["thresholds"],
              "aligned": curves.get("aligned", {}),
              "pooled_tasks": [t for t in tasks if per_cell[per_cell["task"] == t]["accuracy_before"].mean() < 1.0],
              "power": power_table, "curve_metrics": curve_ok, "equivalent": groups,
              "aa": pd.DataFrame([pair for j in judged for pair in j["aa"]],
                                 columns=["task", "a", "b", "diff", "half_width", "separated"]),
              "procedure": procedure, "registered": registered, "fits": {t: j["fit"] for t, j in zip(tasks, judged)},
              "current": _current_marks(per_cell, tasks, spec, seed) if procedure != inference.PROCEDURE else None}
    result["sentences"] = guidance(table, power_table, spec)
    result["scaling_fits"] = (fits.scaling_fits(curves.get("completions"), seed=seed) if scaling and any(curve_ok.values())
                              else pd.DataFrame(columns=fits.COLUMNS))
    return result


def _scores(frame: pd.DataFrame) -> dict[str, dict[int, float]]:
    """{variant: {seed: primary metric}} of one task's cells."""
    return {v: dict(zip(g["seed"].astype(int), g["primary"].astype(float)))
            for v, g in frame.groupby("variant", sort=False)}


def _current_marks(per_cell: pd.DataFrame, tasks: list[str], spec: dict, seed: int) -> pd.DataFrame:
    """Per (task, variant), the marks of the current procedure (inference.PROCEDURE), for a matrix that registered
    another: what the verdict section shows beside the registered marks."""
    frames = []
    for task in tasks:
        marks, _ = inference.compare(_scores(per_cell[per_cell["task"] == task]), margin=spec["margin"], seed=seed)
        frames.append(marks.assign(task=task, model_seeds=marks["seeds"], gap_low=marks["low"], gap_high=marks["high"]))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _judge_task(task: str, frame: pd.DataFrame, threshold: float, cost: pd.DataFrame, spec: dict, groups: list, *,
                reps: int, seed: int, procedure: str = inference.PROCEDURE) -> dict:
    """One task's verdict: a row per variant (``rows``), the procedure's power summary, its declared pairs, the
    pairwise P(X > Y) of final accuracy, and whether the task is saturated and its curves carry curve metrics."""
    final, auc = _runs(frame, "final_accuracy"), _runs(frame, "auc")
    scores = _scores(frame)
    means = {v: float(np.nanmean(list(s.values()))) for v, s in scores.items()}
    saturated = all(m >= SATURATED_HIGH for m in means.values()) or all(m <= SATURATED_LOW for m in means.values())
    curve_ok = bool((frame["evaluations"] >= CURVE_EVALUATIONS).all()) if "evaluations" in frame else True
    marks, fit = inference.compare(scores, margin=spec["margin"], seed=seed, procedure=procedure)
    marks = marks.set_index("variant")
    power = {"task": task, **inference.summary(fit, margin=spec["margin"], target=spec["target_mdd"], seed=seed,
                                                 contenders=list(marks.index[marks["in_best_set"].astype(bool)]))}
    aa = _aa_pairs(task, fit, groups)
    final_est = stats.mean_and_iqm(final, reps=reps, seed=seed).set_index("name")
    auc_est = stats.mean_and_iqm(auc, reps=reps, seed=seed).set_index("name")
    rows = []
    for variant in marks.index:
        m = marks.loc[variant]
        row = {"task": task, "variant": variant, "seeds": len(final[variant]), "model_seeds": int(m["seeds"]),
               "primary_mean": float(m["mean"]), "primary_sd": float(m["sd"]),
               **{f"final_{k}": v for k, v in final_est.loc[variant].items()},
               **{f"auc_{k}": v for k, v in auc_est.loc[variant].items()},
               **_threshold_and_collapse(frame[frame["variant"] == variant], threshold),
               "gap_low": float(m["low"]), "gap_high": float(m["high"]), "mark": m["mark"],
               "worse_by": float(m["worse_by"]), "in_best_set": bool(m["in_best_set"]), "p_best": float(m["p_best"]),
               "fragile": bool(m["fragile"]),
               "saturated": saturated, "curve_metrics": curve_ok,
               "curve_evaluations": int(frame.loc[frame["variant"] == variant, "evaluations"].min())
               if "evaluations" in frame else CURVE_EVALUATIONS}
        if (task, variant) in cost.index:
            row.update(cost.loc[(task, variant)].to_dict())  # cost_columns, those the cells recorded
        rows.append(row)
    poi = stats.probability_of_improvement(final)
    poi.insert(0, "task", task)
    return {"rows": rows, "power": power, "aa": aa, "poi": poi, "saturated": saturated, "curve_ok": curve_ok,
            "fit": fit}


def _threshold_and_collapse(mine: pd.DataFrame, threshold: float) -> dict:
    """A variant's cells on a task: completions to the threshold (median over its seeds, and how many reached it),
    how many collapsed (with a Wilson interval of the rate) and how many never learned."""
    ctt = mine["completions_to_threshold"].to_numpy(float)
    n_collapsed = int(mine["collapsed"].sum()) if "collapsed" in mine else 0
    n_flat = int(mine["never_learned"].sum()) if "never_learned" in mine else 0
    collapse_low, collapse_high = stats.wilson_interval(n_collapsed, len(mine))
    return {"threshold": threshold,
            "completions_to_threshold": float(np.median(ctt)) if len(ctt) else math.nan,
            "threshold_reached": int(np.isfinite(ctt).sum()),
            "collapsed": n_collapsed, "collapse_rate": n_collapsed / len(mine) if len(mine) else math.nan,
            "collapse_low": collapse_low, "collapse_high": collapse_high, "never_learned": n_flat}


def _over_tasks(per_cell: pd.DataFrame, tasks: list[str], *, reps: int, seed: int) -> tuple[pd.DataFrame, pd.DataFrame, list]:
    """Described over all tasks, on normalised scores: mean and IQM per variant (final accuracy and AUC), the
    performance profiles, and P(X > Y) (a one-frame list; all three empty where no variant completed every task)."""
    final_pooled, auc_pooled = _pooled(per_cell, "final_accuracy", tasks), _pooled(per_cell, "auc", tasks)
    if not final_pooled:
        return pd.DataFrame(), pd.DataFrame(), []
    overall = stats.mean_and_iqm(final_pooled, reps=reps, seed=seed).add_prefix("final_").rename(columns={"final_name": "variant"})
    auc_overall = stats.mean_and_iqm(auc_pooled, reps=reps, seed=seed).add_prefix("auc_").rename(columns={"auc_name": "variant"})
    overall = overall.merge(auc_overall, on="variant")
    overall["seeds"] = [len(final_pooled[v]) for v in overall["variant"]]
    overall = overall.sort_values("final_iqm", ascending=False, kind="stable").reset_index(drop=True)
    all_poi = stats.probability_of_improvement(final_pooled)
    all_poi.insert(0, "task", "all tasks")
    profiles = stats.performance_profiles(final_pooled, PROFILE_TAUS, reps=reps, seed=seed)
    return overall, profiles, [all_poi]


def _equivalent_groups(meta: dict | None) -> list[list[str]]:
    """The matrix file's top-level ``equivalent`` groups (A/A controls), read from the toml kept in matrix.json."""
    try:
        data = tomllib.loads((meta or {}).get("toml") or "")
    except tomllib.TOMLDecodeError:
        return []
    return [list(g) for g in data.get("equivalent", []) if isinstance(g, list)]


def tuning_table(meta: dict | None) -> pd.DataFrame:
    """Per (task, variant) and grid point of the matrix's ``[tuning]``: the mean score it was chosen by (the primary
    metric on validation problems; AUC in matrices run before there was one), its final accuracy on the tuning
    seeds, which point was chosen, and the variant's sensitivity (the spread of final accuracy across its grid: how
    forgiving it is of the setting). Empty without tuning."""
    table = ((meta or {}).get("tuning") or {}).get("table") or []
    rows = []
    for group in table:
        finals = [p["final_accuracy"] for p in group["points"] if p["seeds"]]
        spread = (max(finals) - min(finals)) if finals else math.nan
        rates = [p.get("settings", {}).get("learning_rate") for p in group["points"]]
        rates = [r for r in rates if r is not None]
        chosen_rate = group["points"][group["chosen"]].get("settings", {}).get("learning_rate")
        at_edge = len(set(rates)) > 1 and chosen_rate in (min(rates), max(rates))
        for i, point in enumerate(group["points"]):
            rows.append({"task": group["task"], "variant": group["variant"], "point": point["point"],
                         "chosen": i == group["chosen"], "at_edge": at_edge, "chosen_by": point.get("primary_metric"),
                         "score": point.get("primary", point["auc"]), "auc": point["auc"],
                         "final_accuracy": point["final_accuracy"], "tuning_seeds": point["seeds"],
                         "failed": point["failed"], "sensitivity": spread})
    return pd.DataFrame(rows)


# The key to a task's tuning table (in the glossary where the report links one, else below the table's lead).
TUNING_KEY = ("*Grid*: each point's score / final accuracy, means over the tuning seeds. *Sensitivity*: the spread of "
              "final accuracy across the grid (small: forgiving of the setting). *Grid edge*: the chosen learning rate "
              "is the grid's smallest or largest, so a better one may lie beyond it, untried.")


def _tuning_lines(analysis: dict, task: str, glossary: Optional[str] = None) -> list[str]:
    """One row per variant: the chosen point and its score, then every grid point's score / final accuracy;
    ``glossary``: a link to the glossary page, which holds the table's key."""
    tuned = analysis.get("tuning", pd.DataFrame())
    if tuned is None or tuned.empty or task not in set(tuned["task"]):
        return []
    mine = tuned[tuned["task"] == task]
    rows = []
    for variant, group in mine.groupby("variant", sort=False):
        chosen = group[group["chosen"]].iloc[0]
        grid = "; ".join(f"{r.point}: " + ("failed" if r.failed else f"{r.score:.3f} / {r.final_accuracy:.3f}")
                         for r in group.itertuples())
        rows.append([variant, chosen["point"] + (" (grid edge)" if chosen.get("at_edge", False) else ""),
                     f"{chosen['score']:.3f}", grid, f"{group['sensitivity'].iloc[0]:.3f}"])
    n, by = int(mine["tuning_seeds"].max()), mine["chosen_by"].iloc[0]
    how = ("AUC on the evaluation problems (this matrix ran before tuning selected on the primary metric and on "
           "validation problems)" if by is None or pd.isna(by) else
           f"primary metric ({primary_name(by)}) on the task's validation problems")
    key = f" (its columns: [glossary]({glossary}#tuning))." if glossary else f". {TUNING_KEY}"
    return ["", f"Tuning ({n} tuning seed(s), disjoint from the seeds above): each variant ran with the grid point of "
                f"highest mean {how}{key}", "",
            markdown_table(["variant", "chosen", "its score", "grid (score / final accuracy)", "sensitivity"], rows)]


def _is(count: int) -> str:
    return "is" if count == 1 else "are"


def _names(variants: list[str]) -> str:
    quoted = [f"`{v}`" for v in variants]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]


def _bounds_text() -> str:
    """fits.bounds in words, per budget: 'A in [0, 1], C_mid in [budget/1000, 100 budget], B in [0.1, 10]'."""
    lower, upper = fits.bounds(1.0)
    return (f"A in [{lower[0]:g}, {upper[0]:g}], C_mid in [budget/{1 / lower[1]:g}, {upper[1]:g} budget], "
            f"B in [{lower[2]:g}, {upper[2]:g}]")


def _scaling_lines(analysis: dict, task: str, frame: pd.DataFrame) -> list[str]:
    """The ScaleRL fits of a task that ranks (saturated tasks' fits are in tables/scaling_fits.csv only)."""
    fitted = analysis.get("scaling_fits", pd.DataFrame())
    if fitted is None or fitted.empty or frame["saturated"].iloc[0]:
        return []
    fitted = fitted[fitted["task"] == task].set_index("variant")
    fitted = fitted.reindex(list(frame["variant"])).dropna(subset=["R0"])
    fitted = fitted[np.isfinite(fitted["B"].astype(float))]
    if fitted.empty:  # e.g. evaluated before and after only: two points cannot fix four parameters
        return ["", "Compute scaling: no ScaleRL fit, the curves have too few evaluations for its four parameters."]
    number = lambda value, form: form.format(value) if np.isfinite(value) else "-"
    bound = lambda names: names if isinstance(names, str) and names else "-"
    rows = [[v, f"{f['R0']:.3f}", with_interval(f["A"], f["A_low"], f["A_high"]),
             with_interval(f["C_mid"], f["C_mid_low"], f["C_mid_high"], "{:.0f}"), f"{f['B']:.2f}",
             bound(f.get("unfixed")), number(f["half_mae"], "{:.3f}"), number(f["half_final_error"], "{:+.3f}")]
            for v, f in fitted.iterrows()]
    counts = lambda column: sorted({int(n) for n in fitted[column].dropna()}) if column in fitted else []
    points, half = counts("points"), counts("half_points")
    said = []
    if points:
        said.append(f"fitted on {'/'.join(map(str, points))} evaluations after the start for {fits.FREE_PARAMETERS} "
                    "free parameters" + (" (as many points as parameters: the curve passes through them all and "
                                         "does not test the sigmoid's form)" if min(points) <= fits.FREE_PARAMETERS else ""))
    if not np.isfinite(fitted["half_mae"].astype(float)).all():
        short = [n for n in half if n < fits.FREE_PARAMETERS]
        said.append(f"'-' in the half-budget columns: the first half of the budget holds {'/'.join(map(str, short))} "
                    f"evaluation(s) after the start, fewer than the {fits.FREE_PARAMETERS} free parameters"
                    if short else "'-' in the half-budget columns: the half-budget fit failed")
    return ["", "Compute scaling (ScaleRL's R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) on the mean curve; intervals: "
                "seeds resampled; *set by a bound*: the parameters whose fit or interval end lies on the fit's bound "
                f"({_bounds_text()}): the curve does not fix them; "
                "*half-budget error*: fitted on the first half of the budget, its mean absolute error on the second "
                "half's evaluations and its error at the budget" + "".join(f"; {line}" for line in said) + "):", "",
            markdown_table(["variant", "R0", "asymptote A [95% CI]", "C_mid [95% CI]", "B", "set by a bound",
                            "half-budget MAE", "error at budget"], rows)]


def _primary_line(spec: dict) -> str:
    margin = f"margin of equivalence +-{spec['margin']:g}" if spec.get("margin") else "no margin of equivalence (none is claimed)"
    when = (f"stated in the matrix file before its cells ran ({spec['stated_at']})" if spec.get("stated")
            else "NOT stated before the cells ran: the suite's default, chosen without looking at the marks" if spec["primary"] == PRIMARY_DEFAULT and not spec.get("margin")
            else "stated in the matrix file after some cells had run")
    return f"Primary metric: {primary_name(spec['primary'])}; {margin}; {when}."


NAMED_WORSE = 3  # up to this many variants marked worse are named in the verdict sentence; more are counted


def guidance(table: pd.DataFrame, power: pd.DataFrame, spec: dict) -> list[str]:
    """The sentences the marks support (module docstring)."""
    if table.empty:
        return []
    sentences, ranking = [_primary_line(spec)], []
    power = power.set_index("task") if not power.empty else power
    for task, frame in table.groupby("task", sort=False):
        if frame["saturated"].iloc[0]:
            level = "at or above 0.95" if frame["primary_mean"].min() >= SATURATED_HIGH else "at or below 0.05"
            sentences.append(f"`{task}` ranks nothing: every variant's mean is {level}.")
            continue
        judged = frame[frame["mark"] != inference.TOO_FEW]
        if len(judged) < 2:
            why = ("one variant, nothing to compare" if len(frame) == 1
                   else "fewer than two variants with 3 or more seeds")
            sentences.append(f"`{task}`: {why}, so no verdict.")
            continue
        ranking.append(task)
        top = judged[judged["in_best_set"]].sort_values("p_best", ascending=False)
        p = power.loc[task] if task in power.index else {}
        probabilities = ", ".join(f"`{r.variant}` {r.p_best:.2f}" for r in top.itertuples())
        if len(top) == 1:
            lead = top.iloc[0]
            sentence = (f"On `{task}`, `{lead['variant']}` is best: above every other variant by at least "
                        f"{lower_bound(lead['gap_low'])} (simultaneous 95%)")
        elif len(top) == len(judged):
            sentence = (f"On `{task}` the procedure separates none of the {len(judged)} variants: any could be the best "
                        f"(P(best): {probabilities})")
        else:
            sentence = (f"On `{task}`, could be best: {_names(list(top['variant']))} ({len(top)} of {len(judged)}; "
                        f"P(best): {probabilities})")
        worse = judged[judged["mark"] == inference.WORSE]
        if len(worse) and len(top) < len(judged):
            who = (f"{_names(list(worse['variant']))} {_is(len(worse))}" if len(worse) <= NAMED_WORSE
                   else f"the other {len(worse)} are")
            sentence += f"; {who} worse than the best by at least {lower_bound(worse['worse_by'].min())}"
        equivalent = judged[judged["mark"] == inference.EQUIVALENT]
        if len(equivalent):
            sentence += (f"; equivalent to the best within +-{spec['margin']:g}: {_names(list(equivalent['variant']))}")
        unresolved = judged[judged["mark"] == inference.NOT_RESOLVED]
        if len(unresolved) and len(top) > 1:
            sentence += (f"; not separated is not equivalent: {len(unresolved)} of the set "
                         f"{_is(len(unresolved))} not resolved at this "
                         f"design's MDD {p.get('mdd', math.nan):.3f}")
        if len(top) > 1 and "wall_clock_s" in top and top["wall_clock_s"].notna().all():
            fastest = top.loc[top["wall_clock_s"].idxmin()]
            sentence += f"; of the set, `{fastest['variant']}` has the lowest mean training time ({fastest['wall_clock_s']:.1f} s)"
        if np.isfinite(p.get("set_reproduced", math.nan)):
            sentence += f". A rerun of this design gives back the same set {p['set_reproduced']:.0%} of the time"
        sentences.append(sentence + "." + _shortcut_warning(top))
    if len(ranking) >= 2:
        frame = table[table["task"].isin(ranking)]
        good = frame[frame["in_best_set"]].groupby("variant", sort=False)["task"].nunique()
        everywhere = [v for v, n in good.items() if n == len(ranking)]
        sentences.append(f"{_names(everywhere)} could be best on all {len(ranking)} tasks that rank."
                         if everywhere else f"No variant could be best on all {len(ranking)} tasks that rank.")
    elif not ranking:
        sentences.append("No task in this matrix ranks the variants.")
    return sentences


def _shortcut(frame: pd.DataFrame) -> tuple[float, list[str]]:
    """A task's constant baseline (one answer to every question; NaN where its cells did not record one) and the
    variants whose primary metric is not above it."""
    if "constant_baseline_after" not in frame or frame["constant_baseline_after"].isna().all():
        return math.nan, []
    baseline = float(frame["constant_baseline_after"].max())
    return baseline, list(frame.loc[frame["primary_mean"] <= baseline + SHORTCUT_TOLERANCE, "variant"])


def _shortcut_warning(top: pd.DataFrame) -> str:
    """A sentence where the could-be-best variants score no more than one answer given to every question would."""
    baseline, below = _shortcut(top)
    if not below:
        return ""
    who = ("none of the set is above" if len(below) == len(top)
           else f"{_names(below)} of the set {_is(len(below))} not above")
    return (f" But {who} the constant baseline ({baseline:.3f}: one answer given to every question scores that): "
            "what ranks there is how close a policy comes to the answers' distribution, not the skill.")


def _shortcut_text(frame: pd.DataFrame) -> Optional[str]:
    """The task section's line on shortcuts: the constant baseline, who is not above it, and how alike each variant
    answers at its final evaluation (None where the cells recorded neither)."""
    baseline, below = _shortcut(frame)
    if math.isnan(baseline):
        return None
    text = (f"Constant baseline (the best single answer given to every question): {baseline:.3f}; primary metric not "
            f"above it: {_names(below) if below else 'none'}.")
    if "answer_top_share_after" in frame and frame["answer_top_share_after"].notna().any():
        shares = frame.sort_values("answer_top_share_after", ascending=False, kind="stable")
        text += (" Share of the final evaluation's answers that are a variant's most common one (1.00: the same "
                 "answer to every question; mean over seeds): " + ", ".join(
                     f"`{r.variant}` {r.answer_top_share_after:.2f}" for r in shares.itertuples()
                     if not pd.isna(r.answer_top_share_after)) + ".")
    return text


def _threshold_text(r) -> str:
    reached = f"{r['threshold_reached']}/{r['seeds']}"
    return f"not reached ({reached})" if math.isinf(r["completions_to_threshold"]) else f"{r['completions_to_threshold']:.0f} ({reached})"


def _collapse_text(r) -> str:
    if pd.isna(r.get("collapse_rate")):
        return "-"
    return f"{r['collapsed']}/{r['seeds']} [{r['collapse_low']:.2f}, {r['collapse_high']:.2f}]"


FRAGILE = " (fragile: changes within c's Monte Carlo error)"


def _mark_text(r) -> str:
    return _bare_mark(r) + (FRAGILE if r.get("fragile") else "")


def _bare_mark(r) -> str:
    if r["mark"] == inference.WORSE:
        return f"worse (by >= {lower_bound(r['worse_by'])})"
    if r["mark"] == inference.BEST:
        return f"**best** (by >= {lower_bound(r['gap_low'])})"
    if r["mark"] == inference.TOO_FEW:  # left out of the model: its own seeds, or no second variant to compare
        return "too few seeds (< 3)" if r["model_seeds"] < 3 else "nothing to compare (no other variant with 3+ seeds)"
    return f"could be best: {r['mark']}"


def procedure_line(analysis: dict) -> str:
    """Which procedure made the marks, and why that one: the one the matrix registered, or the current one."""
    name, registered = analysis.get("procedure") or inference.PROCEDURE, analysis.get("registered")
    why = ("the one this matrix registered before its cells ran" if registered else
           "the current one: this matrix registered none (no analysis stated before its cells ran)")
    line = f"Procedure `{name}` ({why}): {inference.PROCEDURES[name].summary}."
    if analysis.get("current") is not None:
        line += (f" Where the current procedure `{inference.PROCEDURE}` marks a variant differently, the task says so "
                 "below its table.")
    return line


def changed_marks_line(analysis: dict, task: str, frame: pd.DataFrame) -> Optional[str]:
    """The marks the current procedure gives differently from the registered ones, on one task (None: no current
    procedure to compare); a mark printed with its bound, "registered -> current"."""
    current = analysis.get("current")
    if current is None or current.empty:
        return None
    now = current[current["task"] == task].set_index("variant")
    changed = [f"`{r['variant']}` {_bare_mark(r)} -> {_bare_mark(now.loc[r['variant']])}"
               for r in (row._asdict() for row in frame.itertuples(index=False))
               if r["variant"] in now.index and (now.loc[r["variant"], "mark"] != r["mark"]
                                                 or now.loc[r["variant"], "in_best_set"] != r["in_best_set"])]
    name = inference.PROCEDURE
    if not changed:
        return f"The current procedure `{name}` gives every variant the same mark."
    return (f"The current procedure `{name}` marks {len(changed)} variant(s) differently (registered -> current): "
            + "; ".join(changed) + f". Why: `{name}` takes {inference.PROCEDURES[name].summary}; the registered "
            f"`{analysis['procedure']}` takes {inference.PROCEDURES[analysis['procedure']].summary}.")


def seeds_needed(need) -> str:
    """Seeds a variant an MDD needs (``inference.seeds_for_mdd``), or its search's limit when none was found."""
    return f"{int(need)}" if need and np.isfinite(need) else "more than 2000"


def _band_text(p) -> str:
    """c's Monte Carlo band, where the summary carries one."""
    band = p.get("critical_band")
    if band is None or not all(np.isfinite(band)):
        return ""
    return f" (Monte Carlo band +-2 SE: [{band[0]:.2f}, {band[1]:.2f}])"


def _power_text(p: pd.Series, spec: dict) -> str:
    if p.get("model", "none") == "none":
        return "No model: fewer than two variants with 3 or more seeds."
    df = (f"each pair's sd on its {p['seeds'] - 1:.0f} per-seed differences" if p.get("procedure") == "paired-v3"
          and p["model"] == inference.BLOCKED else f"residual df {int(p['df'])}")
    parts = [f"Model: {p['model']} ({int(p['variants'])} variants x {p['seeds']:.0f} seeds, {df}"
             + (f"; {int(p['seeds_left_out'])} cells outside the complete seeds left out" if p.get("seeds_left_out") else "")
             + f"), pooled seed-to-seed sd {p['sd']:.4f}"
             + (f", mean correlation of two variants' cells over a shared seed {p['seed_correlation']:+.2f}"
                if np.isfinite(p.get("seed_correlation", math.nan)) else "") + ".",
             f"Critical value {p['critical_value']:.2f}" + _band_text(p) + ", each pair's interval with its own spread "
             f"(Tukey's, for equal spreads and a pooled sd: {p['tukey_value']:.2f}): a pair of the pooled sd's spread has "
             f"a simultaneous interval of +-{p['half_width']:.3f}.",
             f"MDD (the gap to the best called \"worse\" with 80% probability) {p['mdd']:.3f}; with 2x the seeds "
             f"{p['mdd_x2']:.3f}, with 4x {p['mdd_x4']:.3f}."]
    if spec.get("target_mdd"):
        need = p.get("seeds_for_target")
        parts.append(f"The stated target MDD {spec['target_mdd']:g} needs {seeds_needed(need)} seeds per variant.")
    if np.isfinite(p.get("mdd_set", math.nan)):
        need = p.get("seeds_for_target_set")
        parts.append(f"Among the {int(p['set_variants'])} that could be best, on their own spreads (pooled sd "
                     f"{p['sd_set']:.4f}; the critical value the family's): MDD {p['mdd_set']:.3f}"
                     + (f"; the target {spec['target_mdd']:g} needs "
                        f"{seeds_needed(need)} seeds per variant"
                        if spec.get("target_mdd") else "") + ".")
    if spec.get("margin"):
        need = p.get("seeds_for_margin")
        parts.append(f"An MDD at the margin {spec['margin']:g} needs {seeds_needed(need)} "
                     f"seeds per variant; two equal variants are marked equivalent only when +-{p['half_width']:.3f} "
                     f"fits inside +-{spec['margin']:g}.")
    if np.isfinite(p.get("set_reproduced", math.nan)):
        parts.append(f"The could-be-best set comes back in {p['set_reproduced']:.0%} of parametric reruns.")
    if p.get("note"):
        parts.append(str(p["note"]).capitalize() + ".")
    return " ".join(parts)


# The verdict section's key to its marks, intervals and counts (report.matrix's glossary page holds it once for the
# reports that link one; a report without one holds it as HOW_TO_READ).
MARKS_KEY = (
    "Every claim comes from one family of simultaneous 95% intervals for each variant's *gap to the best of the "
    "others* (benchmarks/report/inference.py: Hsu's multiple comparisons with the best, blocked on the seed that cells "
    "of different variants share, each pair's interval with its own spread, the critical value calibrated by "
    "simulation for unequal spreads; the procedure is named in the verdict section), so all the marks of a task hold "
    "together with probability >= 95%; a mark marked *fragile* changes when the critical value moves within its Monte "
    "Carlo error (+-2 SE). *Could be best*: the gap's interval reaches 0 (the set of these is a 95% confidence set "
    "for the best); *worse*: below the best by at least the amount shown; *equivalent*: the interval inside +-margin; "
    "*not resolved*: could be best, and the seeds cannot say more. *P(best)*: the posterior probability of having the "
    "highest mean. *MDD*: the gap to the best that this design calls worse with 80% probability. Final accuracy "
    f"mean and IQM are described with stratified-bootstrap 95% intervals ({stats.REPS} resamples; rliable). "
    f"*Collapsed*: fell >= {stats.COLLAPSE_DROP} below its peak and stayed there (Wilson 95% interval); *never "
    "learned*: never above its start. Costs are means over seeds; peak memory over the seeds whose cell ran first in "
    "its process (a warm worker's later cells read what its earlier cells left).")
HOW_TO_READ = "How to read the marks: " + MARKS_KEY[0].lower() + MARKS_KEY[1:]


def render(analysis: dict, *, scaling: bool = True, glossary: Optional[str] = None) -> str:
    """The verdict section as markdown; ``scaling``: with a compute-scaling table per ranking task (without,
    one line pointing to tables/scaling_fits.csv: what a README section shows). ``glossary``: a link to the glossary
    page (report.matrix's ``glossary_text``), which then holds the key to the marks and the tuning tables instead
    of the section."""
    table = analysis["tasks"]
    spec = analysis.get("spec") or analysis_spec(None)
    if table.empty:  # between the stages of a tuned matrix: what the tuning chose, still
        lines = ["### Verdicts", "", "No complete cells with evaluations yet: nothing to rank."]
        tuned = analysis.get("tuning")
        for task in ([] if tuned is None or tuned.empty else dict.fromkeys(tuned["task"])):
            lines += ["", f"#### `{task}`"] + _tuning_lines(analysis, task, glossary)
        return "\n".join(lines) + "\n"
    key = f"How to read the marks: [glossary]({glossary}#how-to-read-the-marks)." if glossary else HOW_TO_READ
    lines = ["### Verdicts", "", key, "", procedure_line(analysis), ""]
    lines += [f"- {s}" for s in analysis["sentences"]]
    lines += _aa_check_lines(analysis.get("aa", pd.DataFrame()))
    power_by_task = analysis.get("power", pd.DataFrame())
    power_by_task = power_by_task.set_index("task") if not power_by_task.empty else power_by_task
    for task, frame in table.groupby("task", sort=False):
        lines += _task_section(analysis, task, frame, spec, power_by_task, scaling=scaling, glossary=glossary)
    fitted = analysis.get("scaling_fits")
    if not scaling and fitted is not None and not fitted.empty:
        lines += ["", "Compute-scaling fits (ScaleRL's sigmoid of accuracy against completions: asymptote, midpoint, "
                      "half-budget extrapolation error) per task and variant: the matrix report and tables/scaling_fits.csv."]
    lines += _all_tasks_lines(analysis)
    return "\n".join(lines) + "\n"


def _aa_check_lines(aa: pd.DataFrame | None) -> list[str]:
    """How many of the pairs declared equivalent the procedure separates (none declared: no line)."""
    if aa is None or aa.empty:
        return []
    return [f"- A/A check: of the {len(aa)} pairs of variants declared equivalent, over tasks, "
            f"{int(aa['separated'].sum())} are separated by the procedure's simultaneous intervals "
            "(a pair separated is a false claim)."]


def _task_section(analysis: dict, task: str, frame: pd.DataFrame, spec: dict, power_by_task: pd.DataFrame, *,
                  scaling: bool, glossary: Optional[str] = None) -> list[str]:
    """One task's heading, what its numbers rest on, its table of variants, its tuning and its scaling fits."""
    note = " (ranks nothing: saturated)" if frame["saturated"].iloc[0] else ""
    curve_ok = bool(frame["curve_metrics"].iloc[0])
    head = [f"Primary metric: {primary_name(spec['primary'])}."]
    if task in power_by_task.index:
        head.append(_power_text(power_by_task.loc[task], spec))
    shortcut = _shortcut_text(frame)
    if shortcut:
        head.append(shortcut)
    if curve_ok:
        head.append(f"Threshold for *to threshold*: accuracy {analysis['thresholds'][task]:.3f}.")
    else:
        short = frame.loc[frame["curve_evaluations"] < CURVE_EVALUATIONS, "variant"] \
            if "curve_evaluations" in frame else frame["variant"]
        whose = ("the curves" if len(short) == len(frame)
                 else "the curve over completions of " + ", ".join(f"`{v}`" for v in short))
        head.append(f"AUC and completions to a threshold are not shown: {whose} "
                    f"{'have' if len(short) == len(frame) else 'has'} fewer than {CURVE_EVALUATIONS} distinct "
                    "completion counts after the start (a before-and-after curve's AUC is (before + after) / 2; "
                    "an algorithm that draws its samples before its first step has one).")
    population = (analysis.get("population") or {}).get(task)  # population.task_lines, where the caller gave it
    lines = (["", f"#### `{task}`{note}", "", " ".join(head)] + (["", population] if population else [])
             + ["", _variants_table(frame, curve_ok)])
    changed = changed_marks_line(analysis, task, frame)
    if changed:
        lines += ["", changed]
    lines += _tuning_lines(analysis, task, glossary)
    if scaling and curve_ok:
        lines += _scaling_lines(analysis, task, frame)
    return lines


def _variants_table(frame: pd.DataFrame, curve_ok: bool) -> str:
    """A task's variants ranked by the primary metric: the gap to the best, the mark, the estimates and the costs
    (AUC and completions to the threshold only where ``curve_ok``)."""
    rows = []
    for rank, r in enumerate(frame.sort_values("primary_mean", ascending=False, kind="stable").itertuples(index=False), 1):
        r = r._asdict()
        seeds = (f"{r['model_seeds']} (+{r['seeds'] - r['model_seeds']} left out)"
                 if r["mark"] != inference.TOO_FEW and r["seeds"] > r["model_seeds"] else r["seeds"])
        row = [rank, r["variant"], seeds, f"{r['primary_mean']:.3f}",
               "-" if pd.isna(r["gap_low"]) else f"[{r['gap_low']:+.3f}, {r['gap_high']:+.3f}]", _mark_text(r),
               "-" if pd.isna(r["p_best"]) else f"{r['p_best']:.2f}",
               with_interval(r["final_mean"], r["final_mean_low"], r["final_mean_high"], seeds=r["seeds"]),
               with_interval(r["final_iqm"], r["final_iqm_low"], r["final_iqm_high"], seeds=r["seeds"])]
        if curve_ok:
            row += [with_interval(r["auc_mean"], r["auc_mean_low"], r["auc_mean_high"], seeds=r["seeds"]),
                    _threshold_text(r)]
        row += [_collapse_text(r), f"{r['never_learned']}/{r['seeds']}",
                ("-" if pd.isna(r.get("wall_clock_s")) else f"{r['wall_clock_s']:.1f}")
                + ("" if pd.isna(r.get("training_cpu_s", math.nan)) else f" ({r['training_cpu_s']:.0f} CPU)"),
                peak_text(r.get("peak_memory_bytes"), r.get("peak_memory_n"), r["seeds"])]
        rows.append(row)
    headers = ["rank", "variant", "seeds", "primary metric", "gap to best of others [simultaneous 95%]", "mark",
               "P(best)", "final accuracy mean [95% CI]", "IQM [95% CI]"]
    if curve_ok:
        headers += ["AUC mean [95% CI]", "completions to threshold"]
    headers += ["collapsed [95% CI]", "never learned", "training s", "peak MiB"]
    return markdown_table(headers, rows)


def peak_text(peak_bytes, fresh, seeds: int) -> str:
    """A variant's mean peak MiB, with ``fresh_note``."""
    return "-" if peak_bytes is None or pd.isna(peak_bytes) else f"{peak_bytes / 2**20:.0f}" + fresh_note(fresh, seeds)


def fresh_note(fresh, seeds: int) -> str:
    """" (k of n fresh)" where only k of a variant's n seeds ran first in their process, so its peak memory is a mean
    over k (report.matrix.fresh_process_peaks); nothing where all did or the count is unknown."""
    return "" if fresh is None or pd.isna(fresh) or int(fresh) >= seeds else f" ({int(fresh)} of {seeds} fresh)"


def _all_tasks_lines(analysis: dict) -> list[str]:
    """Normalised scores over every task, described and not judged (only where more than one task pools)."""
    overall = analysis["overall"]
    if overall.empty or len(analysis["pooled_tasks"]) <= 1:
        return []
    return ["", f"#### All tasks ({', '.join(f'`{t}`' for t in analysis['pooled_tasks'])})", "",
            "Described, not judged: scores normalised per task (0 is the starting policy's mean accuracy, 1 is "
            "accuracy 1.0); runs are the seeds a variant completed on every task; saturated tasks included.",
            "", markdown_table(
                ["variant", "seeds", "normalised final IQM [95% CI]", "normalised final mean [95% CI]",
                 "normalised AUC IQM [95% CI]", "normalised AUC mean [95% CI]"],
                [[r.variant, r.seeds, with_interval(r.final_iqm, r.final_iqm_low, r.final_iqm_high, seeds=r.seeds),
                  with_interval(r.final_mean, r.final_mean_low, r.final_mean_high, seeds=r.seeds),
                  with_interval(r.auc_iqm, r.auc_iqm_low, r.auc_iqm_high, seeds=r.seeds),
                  with_interval(r.auc_mean, r.auc_mean_low, r.auc_mean_high, seeds=r.seeds)] for r in overall.itertuples()])]
