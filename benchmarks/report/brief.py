"""``grpo-bench brief SKILL [SKILL ...]``: the front page's answer to "which algorithm on a real LM", from verdict
matrices of one task (a skill) each, written by the tool so that no number in it is typed.

Per skill: its verdict sentence (benchmarks/report/verdicts.py's ``guidance``: the could-be-best set with P(best),
the worse and by how much, equivalence to the best where the margin allows), its primary metric, margin and when
they were stated, the MDD its seeds reach and the seeds the matrix's target MDD would need; per variant, the mean
primary metric, its mark and P(best), the setting its tuning chose (flagged at a grid edge) and its cost (training
wall-clock seconds, its steps' CPU seconds where the cells recorded them, the optimizer steps where fewer than
planned, and peak memory; means over seeds: cells of
one matrix that ran in different sessions or beside other work are not side by side, so costs here describe, the
side-by-side cost tables measure). Across the skills: Kendall's tau-b of each pair of skills' rankings of
the variants both ran, with its exact p-value and its bootstrap interval over both matrices' seeds, and the variants
that could be best on both. Against a toy matrix (``--toy`` with ``--pair TOY_VARIANT REAL_VARIANT``): the same for
the toy's ranking against each skill's, and how many pairings ran like for like. Both comparisons are
benchmarks/report/transfer.py's ``compare`` (Kendall's tau-b with its exact p-value).

``front`` is the front page's answer from the same result: per skill one line and a table (one row per algorithm:
its mark, the primary metric's mean with its 95% Student-t interval over seeds, P(best), training seconds per cell,
peak memory, the tuned setting), then ``figure``'s PNG (per skill a panel of the gap-to-best intervals).

It reads the result stores and matrix.json files only; each matrix is analysed once.
"""

from __future__ import annotations

import math
import os
import textwrap
from itertools import combinations
from pathlib import Path
from typing import Mapping, Optional, Sequence

import pandas as pd

from benchmarks.errors import UsageError
from benchmarks.markdown import lower_bound, markdown_table
from benchmarks.report import inference
from benchmarks.report.matrix import analyse, collect, glossary_path
from benchmarks.report.plots import skills_figure
from benchmarks.report.stats import REPS, SEED, t_interval
from benchmarks.report.transfer import compare, ran_with
from benchmarks.report.verdicts import peak_text, primary_name, seeds_needed

MIN_RANKED = 3  # algorithms a ranking comparison needs (transfer's own floor)
WIDTH = 120  # the front page's prose lines


def read_matrix(directory: Path, reps: int = REPS) -> dict:
    """A matrix directory as its report reads it (transfer's ``read_matrix``), its descriptive bootstrap intervals
    on ``reps`` resamples (the marks, P(best) and the front page's table do not depend on them)."""
    return analyse(collect(directory), reps=reps)


def skill(data: dict, directory: Path) -> dict:
    """One verdict matrix's answer: its task, spec, verdict sentence, power and per-variant rows."""
    analysis = data["analysis"]
    verdicts = analysis["tasks"]
    tasks = sorted(set(verdicts["task"])) if not verdicts.empty else []
    if len(tasks) != 1:
        raise UsageError(f"{directory}: a skill is a matrix of one task with complete cells, found "
                         f"{', '.join(tasks) or 'no complete cells'}")
    task = tasks[0]
    power = analysis["power"].set_index("task").loc[task] if not analysis["power"].empty else pd.Series(dtype=object)
    tuning = analysis.get("tuning")
    chosen = (tuning[tuning["chosen"] & (tuning["task"] == task)].set_index("variant")
              if tuning is not None and not tuning.empty else pd.DataFrame())
    per_cell = data["curves"]["cells"]
    primary = "primary" if "primary" in per_cell else "final_accuracy"
    rows = []
    for r in verdicts.sort_values("primary_mean", ascending=False, kind="stable").itertuples(index=False):
        _, half = t_interval(per_cell.loc[(per_cell["task"] == task) & (per_cell["variant"] == r.variant), primary])
        if r.variant in chosen.index:
            point = chosen.loc[r.variant]
            tuned = _point(str(point["point"])) + (" (grid edge)" if point["at_edge"] else "")
        else:
            rate = ran_with(data, r.variant)["settings"].get("learning_rate")
            tuned = f"lr {rate:g}, untuned" if isinstance(rate, (int, float)) else "untuned"
        rows.append({"variant": r.variant, "seeds": int(r.seeds), "mean": float(r.primary_mean), "mark": r.mark,
                     "worse_by": float(r.worse_by), "gap_low": float(r.gap_low), "gap_high": float(r.gap_high),
                     "p_best": float(r.p_best), "in_best_set": bool(r.in_best_set), "fragile": bool(r.fragile),
                     "saturated": bool(r.saturated), "half": half, "tuned": tuned,
                     "train_s": float(getattr(r, "wall_clock_s", math.nan)),
                     "train_cpu_s": float(getattr(r, "training_cpu_s", math.nan)),
                     "steps": float(getattr(r, "steps", math.nan)), "steps_planned": float(getattr(r, "steps_planned", math.nan)),
                     "peak_mib": float(getattr(r, "peak_memory_bytes", math.nan)) / 2**20,
                     "peak_n": getattr(r, "peak_memory_n", None)})
    sentence = next((s for s in analysis["sentences"] if f"`{task}`" in s), f"`{task}`: no verdict.")
    return {"dir": str(directory), "task": task, "spec": analysis["spec"], "sentence": sentence,
            "power": power.to_dict(), "rows": pd.DataFrame(rows)}


def _point(point: str) -> str:
    """A tuning grid point ("learning_rate=1e-05,beta=0.1") as the table shows it ("lr 1e-05, beta 0.1")."""
    return ", ".join(part.replace("learning_rate=", "lr ").replace("=", " ") for part in point.split(","))


def _ranking(comparison: dict) -> dict:
    """What the brief keeps of a ``compare``: tau, its p-value and interval, the algorithms, like-for-like pairings."""
    return {key: comparison[key] for key in ("tau", "p_value", "tau_low", "tau_high", "n", "tau_needed",
                                             "like_for_like", "toy_task", "real_task", "toy", "real")}


def brief(directories: Sequence[Path | str], algorithm_settings: Mapping[str, Sequence[str]], *,
          toy: Optional[Path | str] = None, pairs: Sequence[tuple[str, str]] = (), reps: int = REPS,
          seed: int = SEED) -> dict:
    """The skills (``skill``), each pair of skills' ranking agreement and, with ``toy``, the toy's against each
    skill's (the ``pairs`` whose variants both matrices hold); a comparison with fewer than 3 algorithms in common
    is listed as ``None`` with what it lacked."""
    directories = [Path(d) for d in directories]
    data = {d: read_matrix(d, reps) for d in directories}
    skills = [skill(data[d], d) for d in directories]
    if len({s["task"] for s in skills}) < len(skills):
        raise UsageError("each skill's matrix must rank a different task; two of these rank the same one")
    across = []
    for a, b in combinations(range(len(skills)), 2):
        first, second = skills[a], skills[b]
        common = [v for v in first["rows"]["variant"] if v in set(second["rows"]["variant"])]
        both = [v for v in common if v in _best_set(first) & _best_set(second)]
        entry = {"first": first["task"], "second": second["task"], "n": len(common), "best_on_both": both,
                 "ranking": None}
        if len(common) >= MIN_RANKED:
            entry["ranking"] = _ranking(compare(data[directories[a]], data[directories[b]], directories[a],
                                                directories[b], [(v, v) for v in common], algorithm_settings,
                                                reps=reps, seed=seed))
        across.append(entry)
    toys = []
    if toy is not None:
        toy = Path(toy)
        toy_data = read_matrix(toy, reps)
        toy_variants = set(toy_data["analysis"]["tasks"]["variant"]) if not toy_data["analysis"]["tasks"].empty else set()
        unknown = [t for t, _ in pairs if t not in toy_variants]
        if unknown:
            raise UsageError(f"--pair: {toy} has no finished cells of {unknown[0]}")
        for d, s in zip(directories, skills):
            mine = [(t, r) for t, r in pairs if r in set(s["rows"]["variant"])]
            entry = {"skill": s["task"], "n": len(mine), "ranking": None}
            if len(mine) >= MIN_RANKED:
                entry["ranking"] = _ranking(compare(toy_data, data[d], toy, d, mine, algorithm_settings,
                                                    reps=reps, seed=seed))
            toys.append(entry)
    return {"skills": skills, "across": across, "toy": str(toy) if toy is not None else None, "toys": toys}


def _best_set(s: dict) -> set[str]:
    """A skill's could-be-best variants (those with too few seeds for a mark left out)."""
    rows = s["rows"]
    return set(rows.loc[rows["in_best_set"] & (rows["mark"] != inference.TOO_FEW), "variant"])


def _tau_text(r: dict) -> str:
    agrees = r["p_value"] < 0.05 and r["tau"] > 0
    need = (f"with {r['n']} algorithms only tau >= {r['tau_needed']:.2f} reaches p < 0.05" if r["tau_needed"] is not None
            else f"with {r['n']} algorithms no ranking reaches p < 0.05")
    low, high = (("n/a" if v != v else f"{v:+.2f}") for v in (r["tau_low"], r["tau_high"]))
    return (f"{'agree' if agrees else 'are not shown to agree'}: Kendall's tau-b {r['tau']:+.2f} [{low}, {high} over the "
            f"seeds] (p {r['p_value']:.2f}; {need})")


def _power_text(s: dict) -> str:
    p, spec = s["power"], s["spec"]
    if not isinstance(p.get("mdd"), float) or not math.isfinite(p["mdd"]):
        return "No MDD: fewer than two variants with 3 or more seeds"
    text = f"MDD {p['mdd']:.3f} at {p['seeds']:.0f} seeds a variant"
    need = p.get("seeds_for_target")
    if spec.get("target_mdd") and p["mdd"] > spec["target_mdd"]:
        text += (f"; the stated target {spec['target_mdd']:g} needs "
                 + seeds_needed(need) + " seeds")
    elif spec.get("target_mdd"):
        text += f", within the stated target {spec['target_mdd']:g}"
    if isinstance(p.get("mdd_set"), float) and math.isfinite(p["mdd_set"]):
        need = p.get("seeds_for_target_set")
        text += (f"; among the {int(p['set_variants'])} that could be best, on their own spreads, {p['mdd_set']:.3f}"
                 + (f" ({spec['target_mdd']:g} needs "
                    + seeds_needed(need) + " seeds)"
                    if spec.get("target_mdd") and p["mdd_set"] > spec["target_mdd"] else ""))
    return text


def _mark(r) -> str:
    if r.mark == inference.WORSE:
        return f"worse by >= {lower_bound(r.worse_by)}"
    if r.mark == inference.BEST:
        return f"**best** by >= {lower_bound(r.gap_low)}"
    if r.mark == inference.TOO_FEW:
        return "too few seeds"
    return str(r.mark)


def _link(path: str, link_from: Path) -> str:
    page = Path(path) / "README.md"
    return f"[{path}]({os.path.relpath(page, link_from)})"


def render(result: dict, link_from: Path | str = ".", *, figure_path: Optional[Path | str] = None) -> str:
    """The brief as markdown: a line per skill, across the skills, against the toy, then the figure (``figure``'s,
    at ``figure_path``, where given) and one table of the variants over the skills; links made from ``link_from``
    (the page's folder)."""
    link_from = Path(link_from)
    lines = []
    for s in result["skills"]:
        spec = s["spec"]
        stated = (f"stated before its cells ran ({spec['stated_at'][:10]})" if spec.get("stated")
                  else "NOT stated before its cells ran")
        margin = f", margin +-{spec['margin']:g}" if spec.get("margin") else ""
        lines.append(f"- **`{s['task']}`** ({_link(s['dir'], link_from)}; {primary_name(spec['primary'])}{margin}, "
                     f"{stated}): {s['sentence']} {_power_text(s)}.")
    for entry in result["across"]:
        pair = f"`{entry['first']}` and `{entry['second']}`"
        if entry["ranking"] is None:
            lines.append(f"- **Across {pair}:** {entry['n']} algorithms in common, fewer than {MIN_RANKED}: no "
                         "ranking to compare.")
            continue
        both = ", ".join(f"`{v}`" for v in entry["best_on_both"]) or "none"
        lines.append(f"- **Across {pair}:** the rankings of the {entry['n']} algorithms both ran "
                     f"{_tau_text(entry['ranking'])}; could be best on both: {both}.")
    if result["toy"] is not None:
        parts = []
        for entry in result["toys"]:
            r = entry["ranking"]
            parts.append(f"against `{entry['skill']}`, " + (
                f"the rankings {_tau_text(r)}, {r['like_for_like']} of {r['n']} pairings like for like in their settings"
                if r is not None else f"{entry['n']} paired algorithms, fewer than {MIN_RANKED}: no ranking to compare"))
        toy_task = next((e["ranking"]["toy_task"] for e in result["toys"] if e["ranking"]), "the toy task")
        lines.append(f"- **The toy ranking** (`{toy_task}`, {_link(result['toy'], link_from)}): "
                     + "; ".join(parts) + ".")
    if figure_path is not None:
        lines += ["", f"![Per skill, each algorithm's gap to the best of the others: simultaneous 95% intervals]"
                      f"({_relative(figure_path, link_from)})"]
    lines += ["", _table(result)]
    return "\n".join(lines) + "\n"


def _table(result: dict) -> str:
    """One row per variant (in the first skill's order, then any the others add), per skill: the mean primary
    metric, the mark with P(best), the tuned setting, and the cost."""
    order = list(dict.fromkeys(v for s in result["skills"] for v in s["rows"]["variant"]))
    headers, rows = ["variant"], {v: [f"`{v}`"] for v in order}
    for s in result["skills"]:
        short = s["spec"]["primary"].replace("_", "-")
        headers += [f"`{s['task']}` {short}", "mark (P(best))", "tuned", "training s (CPU s), peak MiB"]
        by_variant = s["rows"].set_index("variant")
        for v in order:
            if v not in by_variant.index:
                rows[v] += ["-"] * 4
                continue
            r = by_variant.loc[v]
            p_best = "" if math.isnan(r["p_best"]) else f" ({r['p_best']:.2f})"
            rows[v] += [f"{r['mean']:.3f} ({r['seeds']} seeds)", _mark(r) + p_best, r["tuned"], _cost(r)]
    return markdown_table(headers, list(rows.values()))


def _cost(r) -> str:
    """A variant's cost cell: training seconds, (CPU seconds) where recorded, the steps where fewer than planned,
    then peak MiB."""
    parts = ["-" if math.isnan(r["train_s"]) else f"{r['train_s']:.0f} s"]
    if not math.isnan(r["train_cpu_s"]):
        parts.append(f" ({r['train_cpu_s']:.0f} CPU)")
    if not math.isnan(r["steps"]) and r["steps"] != r["steps_planned"]:
        parts.append(f" in {r['steps']:.3g} of {r['steps_planned']:.0f} steps")
    parts.append(", " + peak_text(r["peak_mib"] * 2**20, r.get("peak_n"), r["seeds"]))
    return "".join(parts)


# ------------------------------------------------------------------------------------------------
# The front page's answer
# ------------------------------------------------------------------------------------------------


def figure(result: dict, path: Path | str) -> Path:
    """The front page's figure at ``path``: per skill a panel of each algorithm's gap to the best of the others
    (simultaneous 95% intervals), the could-be-best set highlighted."""
    path = Path(path)
    skills_figure([{"task": s["task"], "rows": s["rows"].rename(columns={"mean": "primary_mean"}),
                    "margin": s["spec"].get("margin")} for s in result["skills"]], path)
    return path


def _relative(path: Path | str, link_from: Path) -> str:
    return Path(os.path.relpath(Path(path).resolve(), link_from.resolve())).as_posix()


def _metric_heading(primary: str) -> str:
    """A column's name for the primary metric: "last-3 accuracy", "final accuracy", "AUC"."""
    if primary.startswith("last_"):
        return f"last-{primary[5:]} accuracy"
    return {"final": "final accuracy", "auc": "AUC"}.get(primary, primary)


def _front_mark(r) -> str:
    text = {inference.WORSE: f"worse (by >= {lower_bound(r['worse_by'])})",
            inference.BEST: f"**best** (by >= {lower_bound(r['gap_low'])})",
            inference.NOT_RESOLVED: "could be best"}.get(r["mark"], str(r["mark"]))
    return text + (" (fragile)" if r["fragile"] else "")


def _front_lead(s: dict, link_from: Path) -> str:
    """A skill's line: which could be best, which are worse or equivalent, on how many seeds, and its report."""
    rows, spec = s["rows"], s["spec"]
    judged = rows[rows["mark"] != inference.TOO_FEW]
    best = judged[judged["in_best_set"]]
    names = lambda frame: ", ".join(f"`{v}`" for v in frame["variant"])
    if judged.empty:
        said = "no verdict: fewer than two algorithms with 3 or more seeds"
    elif len(best) == 1:
        said = f"{names(best)} is best"
    else:
        said = f"{len(best)} of {len(judged)} could be best"
    worse = judged[judged["mark"] == inference.WORSE]
    if len(worse):
        said += f"; worse: {names(worse)}"
    equivalent = judged[judged["mark"] == inference.EQUIVALENT]
    if len(equivalent):
        said += f"; equivalent to the best within +-{spec['margin']:g}: {names(equivalent)}"
    seeds = sorted(set(rows["seeds"]))
    mdd = s["power"].get("mdd")
    design = (f"{'/'.join(map(str, seeds))} seeds an algorithm, {primary_name(spec['primary'])}"
              + (f", MDD {mdd:.3f}" if isinstance(mdd, float) and math.isfinite(mdd) else ""))
    page = _relative(Path(s["dir"]) / "README.md", link_from)
    return f"**`{s['task']}`**: {said} ({design}; [report]({page}))."


def _front_table(s: dict) -> str:
    heading = _metric_heading(s["spec"]["primary"])
    rows = []
    for r in (row._asdict() for row in s["rows"].itertuples(index=False)):
        mean = f"{r['mean']:.3f}" + ("" if math.isnan(r["half"]) else f" ± {r['half']:.3f}")
        seconds = "-" if math.isnan(r["train_s"]) else f"{r['train_s']:.0f}"
        if not math.isnan(r["steps"]) and r["steps"] != r["steps_planned"]:
            seconds += f" ({r['steps']:.3g} of {r['steps_planned']:.0f} steps)"
        rows.append([f"`{r['variant']}`", _front_mark(r), mean, "-" if math.isnan(r["p_best"]) else f"{r['p_best']:.2f}",
                     seconds, peak_text(r["peak_mib"] * 2**20, r["peak_n"], r["seeds"]), r["tuned"]])
    return markdown_table(["algorithm", "mark", f"{heading} ± 95% CI", "P(best)", "training s per cell",
                           "peak MiB", "tuned"], rows)


def front(result: dict, link_from: Path | str, *, figure_path: Path | str, page: Path | str) -> str:
    """The front page's answer: per skill its line and table, the figure (``figure_path``), and where the rest is
    (``page``: the brief's own page; the glossary of the marks, where the skills' results folder has one); links
    made from ``link_from`` (the front page's folder)."""
    link_from = Path(link_from)
    lines = []
    for s in result["skills"]:
        lines += [*textwrap.wrap(_front_lead(s, link_from), WIDTH, break_on_hyphens=False), "", _front_table(s), ""]
    lines.append(f"![Per skill, each algorithm's gap to the best of the others: simultaneous 95% intervals]"
                 f"({_relative(figure_path, link_from)})")
    glossary = glossary_path(Path(result["skills"][0]["dir"])) if result["skills"] else None
    rest = (f"Written by `grpo-bench brief` from the result stores: its command, each skill's power and the rankings "
            f"across skills and against the toy: [{Path(page).name}]({_relative(page, link_from)})")
    if glossary is not None:
        rest += f"; the marks and intervals: [glossary]({_relative(glossary, link_from)}#how-to-read-the-marks)"
    rest += (". Training seconds and peak memory are means over seeds ('k of n fresh': over the k whose cell ran first "
             "in its process)")
    lines += ["", *textwrap.wrap(rest + ".", WIDTH, break_on_hyphens=False)]
    return "\n".join(lines) + "\n"
