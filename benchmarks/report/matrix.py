"""``grpo-bench report DIR``: a matrix directory's result store (``DIR/results.parquet``) as tidy tables, learning curves, robust
statistics, verdicts and plots. This module collects the cells and orchestrates; the parts live by concern:
``curves`` (learning curves from the evaluations), ``stats`` (AUC, thresholds, t and bootstrap intervals),
``verdicts`` (rankings and the guidance sentences), ``flags`` (the confounds the verdicts do not say), ``plots``;
markdown through ``benchmarks.markdown``. The report reads the store and matrix.json only (and the git history the
cells' commits are looked up in): never a cell's folder, the harness or the command line.

Writes under DIR:
    tables/cells.csv   one row per cell (complete, failed or missing), every measured number
    tables/evals.csv   accuracy and reward before, during and after training (long format)
    tables/summary.csv / summary.md   per task and variant: mean and 95% t-interval over seeds
    tables/curves.csv  accuracy on each task's grid of completion counts, per cell
    tables/curve_metrics.csv   per cell: final accuracy, AUC, completions to the threshold
    tables/verdicts.csv / overall.csv / probability_of_improvement.csv / performance_profiles.csv
    tables/pass_at_k.csv   where cells recorded pass@k: per task, variant and k, before and after (``passk_table``)
    plots/*.png        the verdict figure, learning curves, training reward, bars, per-task diagnostics, rliable plots
    index.html         one self-contained page: headline, verdicts, the verdict figure and the learning curves
                       (inline SVG), cost per variant, flags, and the whole report folded (``html``)
    README.md          the flags, verdicts, tables and plots, then where the numbers come from (device, sessions,
                       code versions); also a section of results/README.md when DIR is under results/
and, when DIR is under a results/ folder, results/glossary.md: the key to the marks and tables that each report there
links to instead of repeating it.

Over a partial directory it says which cells are missing and reports the rest; failed cells are
listed with their error and left out of the means and the statistics.
"""

from __future__ import annotations

import math
import os
import textwrap
import time
import tomllib
from pathlib import Path
from typing import Optional

import pandas as pd

from benchmarks.errors import UsageError
from benchmarks.io import PHASES, QUESTIONS_CORRECT, QUESTIONS_SAMPLES, atomic_write_text, read_json
from benchmarks.markdown import markdown_table, plus_minus, update_section
from benchmarks.report import curves as learning_curves
from benchmarks.report import flags, html, passk_table, stats, tuning_stage, verdicts
from benchmarks.report.curves import CELL_KEYS
from benchmarks.report.plots import plots
from benchmarks.report.stats import t_interval
from benchmarks.store import STORE_FILE, ResultStore

# (column, heading, format, scale) of the summary table, in order.
SUMMARY_COLUMNS = [
    ("accuracy_before", "accuracy before", "{:.3f}", 1.0),
    ("accuracy_after", "accuracy after", "{:.3f}", 1.0),
    ("reward_before", "reward before", "{:.3f}", 1.0),
    ("reward_after", "reward after", "{:.3f}", 1.0),
    ("peak_memory_bytes", "peak memory (MiB)", "{:.0f}", 2.0**-20),
    ("training_state_bytes", "params+grads+optim (MiB)", "{:.2f}", 2.0**-20),
    ("time_per_step_s", "time/step (ms)", "{:.1f}", 1e3),
    ("wall_clock_s", "training time (s)", "{:.1f}", 1.0),
    ("tokens_per_second", "generated tokens/s", "{:.0f}", 1.0),
]


# ------------------------------------------------------------------------------------------------
# Collecting the cells
# ------------------------------------------------------------------------------------------------


def _planned_cells(out: Path, store: ResultStore) -> tuple[dict, list[dict]]:
    meta = read_json(out / "matrix.json")
    if meta:
        return meta, meta.get("cells", [])
    # No plan beside the store (a store copied on its own): the cells it holds.
    return {}, [{"dir": relpath, **entry["spec"]} for relpath, entry in store.cells.items()]


def _complete(store: ResultStore, cells: list[dict]) -> int:
    """How many of the planned ``cells`` the store holds as complete."""
    return sum(1 for cell in cells
               if store.holds(cell) and (store.summary(cell["dir"]) or {}).get("status") == "complete")


def store_progress(out: Path | str) -> Optional[dict]:
    """How far DIR's matrix has run, from its matrix.json and result store alone (no metrics read): its planned
    evaluation cells (none yet in a tuning stage) and tuning cells, and how many of each are complete; None where
    DIR holds no store."""
    out = Path(out)
    store = ResultStore.read(out)
    if store is None:
        return None
    meta, planned = _planned_cells(out, store)
    tuning = ((meta or {}).get("tuning") or {}).get("cells") or []
    return {"cells": len(planned), "complete": _complete(store, planned),
            "tuning": len(tuning), "tuning_complete": _complete(store, tuning)}


def collect(out: Path) -> dict:
    """Read DIR's result store into three tidy frames (cells, evals, steps) plus the matrix's metadata."""
    out = Path(out)
    if not out.is_dir():
        raise UsageError(f"no such directory: {out}")
    store = ResultStore.read(out)
    if store is None:
        raise UsageError(f"nothing to report in {out}: no result store ({STORE_FILE}); run: grpo-bench matrix FILE "
                         f"--out {out} (with --resume it also keeps cells that finished before the store existed)")
    meta, planned = _planned_cells(out, store)
    if not planned:
        tuning = ((meta or {}).get("tuning") or {}).get("cells") or []
        if tuning:
            done = _complete(store, tuning)
            raise UsageError(f"nothing to report in {out} yet: its evaluation cells are planned when the tuning stage "
                             f"chooses, and {done} of its {len(tuning)} tuning cells have finished; resume the matrix "
                             "(grpo-bench matrix FILE --out DIR --resume)")
        raise UsageError(f"nothing to report in {out}: the result store holds no cells")
    cell_rows, eval_rows, step_rows = [], [], []
    for spec in planned:
        try:
            keys = {"task": spec["task_label"], "variant": spec["variant"], "algo": spec["algo"], "seed": spec["seed"]}
            stored = store.holds(spec)
            summary = store.summary(spec["dir"]) if stored else None
            metrics = store.metrics(spec["dir"]) if stored else []
            row = {**keys, "task_name": spec["task"], "steps_planned": spec.get("steps"), "budget": spec.get("budget"),
                   "completions_per_step": spec.get("completions_per_step"), "eval_every": spec.get("eval_every"),
                   "dir": spec["dir"]}
            if summary is None:
                row["status"] = "missing"
                cell_rows.append(row)
                continue
            row.update(_flatten_summary(summary))
            cell_rows.append(row)
            if summary.get("status") != "complete":
                continue
            cps = spec.get("completions_per_step") or (summary["completions_generated"] / max(summary["steps"], 1))
            samples, samples_at = 0.0, {0: 0.0}
            for r in metrics:  # "completions" is per step; "samples" counts them up (what the budget counts)
                if "kl" in r and "kl/k3" not in r:  # a store from before the KL column named its estimator: it was k3
                    r = {("kl/k3" if k == "kl" else k): v for k, v in r.items()}
                samples += r.get("completions", cps)
                samples_at[r["step"]] = samples
                step_rows.append({**keys, **r, "samples": samples})
            recorded = summary.get("eval_questions") or {}
            evals = [(0, 0.0, "before", _evaluation(summary, "before") | _questions(recorded.get("before")))]
            evals += [(r["step"], r["time/wall"], "during", {k[len("eval/"):]: v for k, v in r.items() if k.startswith("eval/")}
                       | _questions(r)) for r in metrics if any(k.startswith("eval/") for k in r)]
            evals.append((summary["steps"], summary["wall_clock_s"], "after",
                          _evaluation(summary, "after") | _questions(recorded.get("after"))))
            for step, wall, phase, values in evals:
                eval_rows.append({**keys, "step": step, "samples": samples_at.get(step, step * cps), "time/wall": wall, "phase": phase, **values})
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a store or plan another writer made
            what = f"no {exc}" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
            source = f"{out / 'matrix.json'} or the result store {store.path}" if meta else f"the result store {store.path}"
            raise UsageError(f"{source}: cell {spec.get('dir') if isinstance(spec, dict) else spec!r} cannot be "
                             f"reported, its spec, summary or metrics are malformed ({what})") from None
    cells = pd.DataFrame(cell_rows)
    # A summary written by a failed or foreign cell may lack fields: they are missing values, not errors.
    for column in [c for c, _, _, _ in SUMMARY_COLUMNS] + ["peak_memory_bytes", "peak_memory_kind", "accuracy_after"]:
        if column not in cells:
            cells[column] = math.nan
    return {"meta": meta, "cells": fresh_process_peaks(cells), "evals": pd.DataFrame(eval_rows),
            "steps": pd.DataFrame(step_rows), "store": store}


def fresh_process_peaks(cells: pd.DataFrame) -> pd.DataFrame:
    """``cells`` with ``peak_memory_bytes`` kept only where it is the cell's own. On CPU it is the process's peak
    RSS: a cell's own where the cell ran first in its process (a fresh process, or a local worker's first cell), not
    for a warm local worker's later cells, whose peak grows with the cells the worker ran before (glibc keeps the
    freed heap: the chain_sum verdict's RLOO read 4.8 GiB as a worker's first cell and up to 6.6 GiB later). Those
    move to ``peak_memory_warm_bytes`` and read as missing, so every table's peak memory is a mean over fresh cells.
    A GPU's peak (reset for each cell) is kept."""
    cells = cells.copy()
    later = pd.to_numeric(cells.get("worker_cell_index", pd.Series(math.nan, index=cells.index)), errors="coerce") > 0
    warm = later & cells["peak_memory_kind"].astype(str).str.startswith("process_peak_rss")
    cells["peak_memory_warm_bytes"] = cells["peak_memory_bytes"].where(warm)
    cells["peak_memory_bytes"] = cells["peak_memory_bytes"].where(~warm)
    return cells


def _evaluation(summary: dict, when: str) -> dict:
    """A summary's numbers of its evaluation ``when`` ("before" or "after"), named without the suffix; its pass@k (a
    value a k) is the cells table's columns instead (passk_table.cell_columns), not a dict in a CSV cell."""
    return {k[: -len(when) - 1]: v for k, v in summary.items() if k.endswith(f"_{when}") and not isinstance(v, dict)}


def _questions(record: Optional[dict]) -> dict:
    """An evaluation's per-question record (io.encode_correct) as the evals frame's ``questions`` (the counts) and
    ``question_samples``; nothing for an evaluation that kept none (before the harness recorded them)."""
    if not record or not isinstance(record.get(QUESTIONS_CORRECT), str):
        return {}
    return {"questions": record[QUESTIONS_CORRECT], "question_samples": record[QUESTIONS_SAMPLES]}


def _flatten_summary(s: dict) -> dict:
    row = {k: v for k, v in s.items() if not isinstance(v, (dict, list)) and k not in CELL_KEYS}
    row.update({f"time_{phase}_s": v for phase, v in (s.get("phase_seconds") or {}).items()})
    row.update({f"version_{lib}": v for lib, v in (s.get("versions") or {}).items()})
    if not s.get("tokens_generated"):
        row["tokens_per_second"] = None
    if "param_bytes" in s:
        row["training_state_bytes"] = s["param_bytes"] + s.get("grad_bytes", 0) + s.get("optimizer_bytes", 0)
    row.update(passk_table.cell_columns(s))
    return row


# ------------------------------------------------------------------------------------------------
# Tables
# ------------------------------------------------------------------------------------------------


def summarize(cells: pd.DataFrame) -> pd.DataFrame:
    """Per (task, variant): mean and 95% t-interval half-width over the complete seeds of each column."""
    rows = []
    for (task, variant), group in cells.groupby(["task", "variant"], sort=False):
        done = group[group["status"] == "complete"]
        row = {"task": task, "variant": variant, "algo": group["algo"].iloc[0], "seeds_complete": len(done),
               "seeds_planned": len(group), "failed": int((group["status"] == "failed").sum()),
               "budget": group["budget"].iloc[0],
               "completions_used": done["completions_generated"].mean() if "completions_generated" in done else math.nan,
               "steps": group["steps_planned"].iloc[0],
               # the optimizer steps the complete seeds took: fewer than planned where a variant generates more than
               # a step's worth to fill its batch (DAPO's dynamic sampling refills count against the budget)
               "steps_taken": done["steps"].mean() if "steps" in done and done["steps"].notna().any() else math.nan}
        for column, _, _, _ in SUMMARY_COLUMNS:
            mean, half = t_interval(done[column]) if column in done else (math.nan, math.nan)
            row[f"{column}_mean"], row[f"{column}_ci95"] = mean, half
        row["peak_memory_n"] = int(done["peak_memory_bytes"].notna().sum()) if "peak_memory_bytes" in done else 0
        rows.append(row)
    return pd.DataFrame(rows)


def phase_markdown(cells: pd.DataFrame, reference: Optional[str] = None) -> str:
    """What a cell costs, by phase: mean seconds over complete seeds of training's phases, training in all, every
    evaluation (before, during and after), and start-up and the rest (process start, imports, building the task and
    model, writing the store; also the work of killed attempts lost after their last checkpoint), over the cells
    where every attempt's time is known; then the cell in all (the sum of those three means), its threads, and its
    ratio to the task's ``reference`` variant (default: the task's first). Where a cell timed its critic inside the
    update (PPO's ``time/critic``), a column after the update shows that part of it ("-" for a variant without
    one). Where cells recorded their steps' CPU seconds (``training_cpu_s``), a column after training's wall clock
    shows them: the core-seconds training used, which a pause of the process or other processes' turns on the cores
    do not lengthen ("-" where not recorded)."""
    done = cells[cells["status"] == "complete"].copy()
    if done.empty:
        return ""
    for phase in PHASES:
        done[f"time_{phase}_s"] = done.get(f"time_{phase}_s", pd.Series(0.0, index=done.index)).fillna(0.0)
    process = done["process_wall_clock_s"] if "process_wall_clock_s" in done else pd.Series(math.nan, index=done.index)
    evaluation = done["eval_s"] if "eval_s" in done else pd.Series(math.nan, index=done.index)
    done["evaluation"] = evaluation
    done["other"] = process - done["wall_clock_s"] - evaluation.fillna(0.0)
    # A cell resumed after its driver was stopped carries its checkpoint's training time but not the earlier
    # processes' time: what they spent besides training is unknown, not negative.
    done.loc[done["other"] < 0, "other"] = math.nan
    done["threads"] = done["threads"] if "threads" in done else math.nan
    critic = "time_critic_s" in done and done["time_critic_s"].notna().any()
    cpu = "training_cpu_s" in done and done["training_cpu_s"].notna().any()
    parts = [f"time_{p}_s" for p in PHASES] + (["time_critic_s"] if critic else [])
    columns = parts + ["wall_clock_s"] + (["training_cpu_s"] if cpu else []) + ["evaluation", "other"]
    means = done.groupby(["task", "variant"], sort=False)[columns + ["threads"]].mean()
    means.insert(len(columns), "total", means["wall_clock_s"] + means["evaluation"].fillna(0.0) + means["other"])
    first = {task: means.loc[(task, reference)].iloc[-2] for task, variant in means.index if variant == reference}
    rows = []  # the unit of the last column: each task's reference variant, else its first
    for (task, variant), r in zip(means.index, means.values):
        first.setdefault(task, r[-2])
        ratio = r[-2] / first[task] if first[task] and not math.isnan(r[-2]) else math.nan
        rows.append([task, variant] + ["-" if math.isnan(v) else f"{v:.2f}" for v in r[:-1]]
                    + ["-" if math.isnan(r[-1]) else f"{r[-1]:g}", "-" if math.isnan(ratio) else f"{ratio:.2f}"])
    phase_headers = [*PHASES] + (["of the update, the critic"] if critic else [])
    return markdown_table(["task", "variant", *phase_headers, "training total", *(["training CPU s"] if cpu else []),
                           "evaluation", "start-up and other", "cell", "threads",
                           f"cell / `{reference}`'s" if reference else "cell / first variant's"], rows)


RATIO_COSTS = (("training", "wall_clock_s"), ("cell", "process_wall_clock_s"), ("peak memory", "peak_memory_bytes"))


def cost_ratio_markdown(cells: pd.DataFrame, reference: str) -> str:
    """Each variant's cost against ``reference`` on its task, seed by seed over the seeds both completed: the
    geometric mean of the per-seed ratios of training seconds, of the whole cell's seconds (its process, start-up and
    evaluations included) and of fresh-process peak memory, each with its 95% t-interval on the log ratios
    (``stats.ratio_interval``); "-" below 2 shared seeds. Cells that ran at the same time shared the machine: the
    interval carries that noise."""
    done = cells[cells["status"] == "complete"]
    rows = []
    for task, group in done.groupby("task", sort=False):
        base = group[group["variant"] == reference]
        if base.empty:
            continue
        for variant, mine in group.groupby("variant", sort=False):
            if variant == reference:
                continue
            row = [task, variant]
            for _, column in RATIO_COSTS:
                if column not in group:
                    row.append("-")
                    continue
                geo, low, high = stats.ratio_interval(dict(zip(mine["seed"], mine[column])),
                                                      dict(zip(base["seed"], base[column])))
                row.append("-" if math.isnan(geo) else f"{geo:.2f} [{low:.2f}, {high:.2f}]")
            row.append(len(set(mine["seed"]) & set(base["seed"])))
            rows.append(row)
    if not rows:
        return ""
    return markdown_table(["task", "variant"] + [f"{name} / `{reference}`'s" for name, _ in RATIO_COSTS]
                          + ["seeds both completed"], rows)


def _steps_used(planned, taken, used: str) -> str:
    """The table's "P = completions used" for P planned steps, or "T of P planned = completions used" where the
    complete seeds took T optimizer steps on average."""
    if taken is None or pd.isna(taken) or pd.isna(planned) or taken == planned:
        return f"{planned} = {used}"
    return f"{taken:.3g} of {planned} planned = {used}"


def summary_markdown(summary: pd.DataFrame) -> str:
    headers = ["task", "variant", "seeds", "steps x completions"] + [h for _, h, _, _ in SUMMARY_COLUMNS]
    rows = []
    for _, r in summary.iterrows():
        seeds = f"{r['seeds_complete']}/{r['seeds_planned']}" + (f" ({r['failed']} failed)" if r["failed"] else "")
        used = "-" if pd.isna(r["completions_used"]) else f"{r['completions_used']:.0f}"
        rows.append([r["task"], r["variant"], seeds, _steps_used(r["steps"], r.get("steps_taken"), used)]
                    + [_peak_text(r, fmt, scale) if c == "peak_memory_bytes" else
                       plus_minus(r[f"{c}_mean"], r[f"{c}_ci95"], fmt, scale, seeds=int(r["seeds_complete"]))
                       for c, _, fmt, scale in SUMMARY_COLUMNS])
    return markdown_table(headers, rows)


def named_metrics(meta: dict) -> list[str]:
    """The training metrics the matrix file's ``[report]`` names (``metrics = [...]``), read from the file's text
    that matrix.json keeps; none where it names none."""
    try:
        table = tomllib.loads((meta or {}).get("toml") or "").get("report") or {}
    except tomllib.TOMLDecodeError:
        return []
    return [name for name in table.get("metrics", []) if isinstance(name, str)]


def named_metric_means(steps: pd.DataFrame, names: list[str]) -> pd.DataFrame:
    """One row per complete cell (task, variant, seed): each named training metric's mean over the cell's steps
    (NaN where the cell logged it at no step)."""
    keys = ["task", "variant", "seed"]
    if steps.empty:
        return pd.DataFrame(columns=keys + names)
    means = steps.groupby(keys, sort=False)[[n for n in names if n in steps]].mean().reset_index()
    return means.reindex(columns=keys + names)


def named_metrics_markdown(per_cell: pd.DataFrame, names: list[str]) -> str:
    """Per (task, variant): the mean ± 95% t-interval over its cells of each cell's mean (``named_metric_means``)."""
    rows = []
    for (task, variant), group in per_cell.groupby(["task", "variant"], sort=False):
        row = [task, variant, len(group)]
        for name in names:
            mean, half = t_interval(group[name])
            row.append(plus_minus(mean, half, "{:.3g}", seeds=int(group[name].notna().sum())))
        rows.append(row)
    return markdown_table(["task", "variant", "seeds", *(f"`{name}`" for name in names)], rows)


def _peak_text(r, fmt: str, scale: float) -> str:
    """Peak memory's mean ± interval over the fresh cells (``fresh_process_peaks``)."""
    text = plus_minus(r["peak_memory_bytes_mean"], r["peak_memory_bytes_ci95"], fmt, scale, seeds=r["peak_memory_n"])
    return text if text == "-" else text + verdicts.fresh_note(r["peak_memory_n"], int(r["seeds_complete"]))


# ------------------------------------------------------------------------------------------------
# Markdown and the command
# ------------------------------------------------------------------------------------------------


# The key to the "Every measured number" table (in the glossary where the report links one, else above the table).
MEASURED_KEY = ("Mean ± 95% confidence interval over seeds (Student t); failed and missing cells are left out of the "
                "means. On CPU, peak memory is the cell process's peak RSS, Python and torch included, over the cells "
                "that ran first in their process (a warm worker's later cells read what its earlier cells left; '-' "
                "where no cell did, 'k of n fresh' where only some did); params+grads+optim counts what training adds "
                "(a critic included).")
PROVENANCE = "Provenance and run history"  # the heading of the report's last section


def render(data: dict, summary: pd.DataFrame, images: list[tuple[str, str]], prefix: str, source: str,
           *, brief: bool = False, glossary: Optional[str] = None) -> str:
    """The report as markdown; ``prefix`` is the path from the README holding it to DIR. ``brief``: what a
    README section shows, the matrix's header lines and a link to the whole report (the verdicts go in a
    section of their own). ``glossary``: the link from the page to the glossary (``glossary_text``), which then
    holds the key to the marks and the tables instead of the page. Where the numbers come from (the device, the
    sessions, the code versions) closes the report, under its own heading."""
    meta, cells = data["meta"], data["cells"]
    done = cells[cells["status"] == "complete"] if "status" in cells else cells.iloc[:0]
    lines = [f"### Matrix `{meta.get('name', Path(source).name)}`" + (f": {meta['description']}" if meta.get("description") else "")]
    budgets = cells.drop_duplicates("task")[["task", "budget"]].dropna()
    if not budgets.empty:
        lines.append("Budget: " + ", ".join(f"{int(b)} generated completions per cell on {t}" for t, b in budgets.values)
                     + "; each variant runs budget // (its completions per step) steps, shown in the table as steps = "
                       "completions used (a variant that generates more than a step's worth to fill a batch, as DAPO's "
                       "dynamic sampling, takes fewer steps for the same completions: 'T of P planned').")
    counts = cells["status"].value_counts() if "status" in cells else {}
    lines.append(f"Cells: {len(cells)} planned, " + ", ".join(f"{n} {s}" for s, n in counts.items()) + ".")
    lines += pair_sample_lines(data.get("steps", pd.DataFrame()), budgets)
    if brief:
        return "\n".join(lines + [f"The verdicts, every measured number, the learning curves, the diagnostics, the "
                                      f"statistics plots and where the numbers come from: "
                                      f"[{prefix}README.md]({prefix}README.md)."]) + "\n"
    if data.get("flags") is not None:
        lines += ["", flags.render(data["flags"], history=False).rstrip()]
    if data.get("analysis") is not None:
        lines += ["", verdicts.render(data["analysis"], glossary=glossary).rstrip()]
    key = f"How to read it: [glossary]({glossary}#every-measured-number)." if glossary else MEASURED_KEY
    lines += ["", "#### Every measured number", "", key, "", summary_markdown(summary)]
    named = named_metrics(meta)
    if named:  # the training metrics the matrix file's [report] names
        lines += ["", "The training metrics this matrix names ([report] metrics): each cell's mean over its steps, "
                  "then mean ± 95% t-interval over seeds:", "",
                  named_metrics_markdown(named_metric_means(data.get("steps", pd.DataFrame()), named), named)]
    pass_at_k = passk_table.markdown(cells)
    if pass_at_k:
        lines += ["", "#### pass@k before and after training", "", pass_at_k]
    reference = data.get("cost_reference")
    phases = phase_markdown(cells, reference) if "status" in cells else ""
    if phases:
        lines += ["", "What a cell costs, by phase (wall-clock seconds per cell, mean over seeds; times the threads, "
                  "core-seconds):", "", phases]
    ratios = cost_ratio_markdown(cells, reference) if reference and "status" in cells else ""
    if ratios:
        lines += ["", f"What a cell costs against `{reference}`'s, seed by seed (the geometric mean of the per-seed "
                  "ratios over the seeds both completed, with its 95% t-interval on the log ratios; cells that ran at "
                  "the same time shared the machine, and the interval carries that noise; peak memory from fresh "
                  "processes only):", "", ratios]
    failed = cells[cells["status"] == "failed"] if "status" in cells else cells.iloc[:0]
    if not failed.empty:
        lines += ["", "Failed cells:", "", markdown_table(
            ["task", "variant", "seed", "error"], [[r.task, r.variant, r.seed, r.error] for r in failed.itertuples()])]
    missing = cells[~cells["status"].isin(["complete", "failed"])] if "status" in cells else cells
    if not missing.empty:
        lines += ["", f"Not run yet ({len(missing)}): " + ", ".join(f"{r.task} {r.variant} seed {r.seed} ({r.status})"
                                                                    for r in missing.itertuples())]
    for name, caption in images:
        lines += ["", f"![{caption}]({prefix}plots/{name})"]
    tables = TABLES + ([PASS_AT_K_TABLE] if pass_at_k else [])
    links = [f"[{prefix}tables/{name}.csv]({prefix}tables/{name}.csv)" + note for name, note in tables]
    lines += ["", "Tables: " + ", ".join(links) + "."]
    lines += ["", provenance(data, done, source).rstrip()]
    return "\n".join(lines) + "\n"


def provenance(data: dict, done: pd.DataFrame, source: str) -> str:
    """The report's last section: the device and libraries the cells ran with, the sessions that ran them, the code
    versions (``flags.history_lines``) and the command that makes the matrix and its report again."""
    meta = data["meta"]
    lines = [f"### {PROVENANCE}", ""]
    if not done.empty:
        first = done.iloc[0]
        versions = ", ".join(f"{lib} {first.get('version_' + lib)}" for lib in ("torch", "transformers", "trl")
                             if isinstance(first.get("version_" + lib), str))
        lines += [f"Device: {first.get('device_name')} ({first.get('precision')}); {versions}.", ""]
    clock = wall_clock_line(meta.get("sessions", []), done)
    if clock:
        lines += [clock, ""]
    history = flags.history_lines(data["flags"]) if data.get("flags") is not None else []
    if history:
        lines += [f"- {line}" for line in history] + [""]
    if meta.get("file"):
        reference = data.get("cost_reference")
        again = f" --cost-reference {reference}" if reference else ""
        lines.append(f"Regenerate: `grpo-bench matrix {meta['file']} --out {source} && grpo-bench report {source}{again}`")
    if len(lines) == 2:
        lines.append("Not recorded: no complete cell, no session and no matrix file.")
    return "\n".join(lines).rstrip() + "\n"


def pair_sample_lines(steps: pd.DataFrame, budgets: pd.DataFrame) -> list[str]:
    """For each variant that built preference pairs (DPO's ``pairs/samples``): how many completions it sampled to
    build them per cell, and whether they counted against the budget (its first step's completions then exceed
    its later steps'). Uncounted, they are generated completions beyond the budget the other variants had. One line
    per variant and way of counting, its tasks listed in it."""
    if steps.empty or "pairs/samples" not in steps:
        return []
    budget_of = dict(budgets.values) if not budgets.empty else {}
    found: dict[tuple[str, bool], list[tuple[str, float]]] = {}
    for (task, variant), rows in steps[steps["pairs/samples"].notna()].groupby(["task", "variant"], sort=False):
        samples = rows.groupby("seed")["pairs/samples"].max().mean()
        first = rows[rows["step"] == rows["step"].min()]["completions"].mean()
        later = rows[rows["step"] > rows["step"].min()]["completions"].median()
        counted = bool(first > later) if pd.notna(later) else False
        found.setdefault((variant, counted), []).append((task, samples))
    out = []
    for (variant, counted), tasks in found.items():
        how = ("counted against the budget (count_pair_samples): drawn up front, then its planned steps over the pairs"
               if counted else "not counted against the budget (count_pair_samples off)")
        if len(tasks) == 1:
            (task, samples), = tasks
            more = "" if counted else _beyond(samples, budget_of.get(task), ", {}")
            out.append(f"`{variant}` on {task} built its preference pairs from {samples:.0f} samples of the starting "
                       f"policy per cell, {how}{more}" + ("." if counted else ": not like for like with the others on "
                                                          "generated completions."))
            continue
        each = ", ".join(f"{task} {samples:.0f}" + ("" if counted else _beyond(samples, budget_of.get(task), " ({})"))
                         for task, samples in tasks)
        out.append(f"`{variant}` built its preference pairs from samples of the starting policy per cell, {how}"
                   + ("" if counted else ": not like for like with the others on generated completions")
                   + f". Samples per cell: {each}.")
    return out


def _beyond(samples: float, budget, form: str) -> str:
    """How far pair samples outside the budget go beyond it, in ``form``; nothing without a budget."""
    if not budget:
        return ""
    return form.format(f"{samples / budget:.0%} more generated completions than the budget of {budget:.0f}")


def wall_clock_line(sessions: list[dict], done: pd.DataFrame) -> str:
    """The matrix's elapsed time: the sessions that made the cells shown, each on the clock on the wall, apart
    from cell time summed over parallel workers (which is not a duration anyone waited for). Every number says
    what it counts: sessions whose cells were run again, and resumed cells whose earlier processes are not
    recorded, are named rather than summed into a total that would contradict another."""
    if not sessions:
        return ""
    made = done["matrix_session"].dropna().astype(int).tolist() if "matrix_session" in done else []
    producing = sorted(set(made))
    ran = [i for i, s in enumerate(sessions) if s.get("cells_run") and i not in producing]
    tuning = [sessions[i] for i in ran if str(sessions[i].get("stage", "")).startswith("tuning")]
    ran = [i for i in ran if not str(sessions[i].get("stage", "")).startswith("tuning")]
    untagged = len(done) - len(made)
    parts = []
    if producing:
        elapsed = sum(sessions[i]["elapsed_s"] for i in producing if i < len(sessions))
        jobs = sorted({sessions[i].get("jobs") for i in producing if i < len(sessions)} - {None})
        parts.append(f"Matrix wall-clock: {elapsed:.0f} s, the elapsed time of the {len(producing)} session(s) that "
                     f"ran the {len(made)} complete cells shown" + (f" ({', '.join(map(str, jobs))} cell(s) at a time)" if jobs else ""))
        others = [sessions[i] for i in ran]
        if others and not untagged:
            parts.append(f"{len(others)} more session(s) ran cells for {sum(s['elapsed_s'] for s in others):.0f} s "
                         f"without finishing any of those shown (stopped and resumed later, failed, or run again)")
    if untagged:
        those = [sessions[i] for i in ran]
        text = (f"the store does not say which session ran {untagged} of the cells (finished before it recorded that, "
                "or re-read from their folders by a resume before 64451b6)")
        if those:
            runs = sum(int(s["cells_run"]) for s in those)
            text += (f"; {len(those)} session(s) ran cells: " + ", ".join(
                f"{s['elapsed_s']:.0f} s ({s['cells_run']} cell runs, {s.get('jobs') or 1} at a time)" for s in those))
            if runs > untagged:
                text += (f", {runs} cell runs for these {untagged} cells: a cell run again (after a change, a failure "
                         f"or a stop) replaces its earlier result, so the sessions' times add up to more than these "
                         f"cells took")
        parts.append(text)
    if tuning:
        parts.append(f"the tuning stage took {sum(s['elapsed_s'] for s in tuning):.0f} s in {len(tuning)} session(s) "
                     f"({sum(int(s['cells_run']) for s in tuning)} tuning cell runs, not among the cells shown)")
    if not done.empty:
        parts.append(_cell_time_text(done))
    line = "; ".join(parts) + "."
    return line[0].upper() + line[1:]  # a sentence, whichever part leads it


def _cell_time_text(done: pd.DataFrame) -> str:
    """Cell time summed over workers. A resumed cell's training time adds up its attempts but only its last
    attempt's process is recorded: such cells are counted apart, so that "of which" is always a part."""
    head = "cell time summed over workers (not a wall-clock): "
    training = done["wall_clock_s"]
    process = done["process_wall_clock_s"] if "process_wall_clock_s" in done else pd.Series(math.nan, index=done.index)
    if process.isna().all():
        return head + f"training {training.sum():.0f} s (the cells' process time is not recorded)"
    resumed = training > process
    whole, again = done[~resumed], done[resumed]
    if again.empty:
        return head + f"{process.sum():.0f} s, of which training {training.sum():.0f} s"
    text = head
    if not whole.empty:
        text += (f"{len(whole)} cell(s) took {process[~resumed].sum():.0f} s, of which training "
                 f"{training[~resumed].sum():.0f} s; ")
    return text + (f"{len(again)} resumed cell(s) trained {training[resumed].sum():.0f} s over every attempt, and "
                   f"their last attempts' processes took {process[resumed].sum():.0f} s (their earlier attempts' "
                   f"process time is not recorded)")


TABLES = [("summary", ""), ("cells", " (every cell)"), ("evals", ""), ("curves", " (accuracy on each task's grid)"),
          ("curve_metrics", " (per cell: AUC, completions to threshold)"), ("verdicts", ""), ("overall", ""),
          ("probability_of_improvement", ""), ("performance_profiles", ""),
          ("scaling_fits", " (ScaleRL fits per task and variant)"), ("power", " (minimum detectable difference per task)"),
          ("aa_pairs", " (declared-equivalent pairs)"), ("tuning", " (each variant's grid on the tuning seeds)")]
# written and linked only where some cell recorded pass@k
PASS_AT_K_TABLE = ("pass_at_k", " (per task, variant and k: pass@k before and after training)")


def analyse(data: dict, *, reps: int = stats.REPS) -> dict:
    """Learning curves and the statistics over them, added to ``data`` as "curves" and "analysis"; ``reps``: the
    resamples behind the descriptive bootstrap intervals (the marks do not use them)."""
    data["curves"] = learning_curves.build(data["cells"], data["evals"], verdicts.analysis_spec(data["meta"])["primary"])
    data["analysis"] = verdicts.analyse(data["cells"], data["curves"], meta=data["meta"], reps=reps)
    return data


def matrix_flags(data: dict) -> dict:
    """``flags.find`` over a collected and analysed matrix: its store, its steps and each variant's mean primary
    metric per task (what an update count's correlation with the ranking reads)."""
    per_cell = data.get("curves", {}).get("cells", pd.DataFrame())
    scores = (per_cell.groupby(["task", "variant"])["primary"].mean().to_dict()
              if not per_cell.empty and "primary" in per_cell else {})
    return flags.find(data["meta"], data["store"], data["steps"], scores=scores)


def matrix_verdicts(out: Path | str) -> pd.DataFrame:
    """One row per (task, variant) of a matrix directory: its seeds, mark and final accuracy, and its primary
    metric (named in ``primary_metric``) as the marks read it: the mean over its complete seeds with a
    stratified-bootstrap 95% interval (``primary_all_mean``, ``_low``, ``_high``; the final accuracy's own when the
    primary metric is the final accuracy), and its seeds' values in seed order (``primary_values``)."""
    data = analyse(collect(Path(out)))
    tasks, per_cell = data["analysis"]["tasks"], data["curves"]["cells"]
    if tasks.empty:
        return tasks
    if "primary" not in per_cell:
        per_cell = per_cell.assign(primary=per_cell["final_accuracy"])
    intervals = []
    for task, frame in per_cell.groupby("task", sort=False):
        runs = {v: g.sort_values("seed")["primary"].to_numpy(float) for v, g in frame.groupby("variant", sort=False)}
        estimates = stats.mean_and_iqm(runs)
        intervals.append(pd.DataFrame({"task": task, "variant": estimates["name"], "primary_all_mean": estimates["mean"],
                                       "primary_all_low": estimates["mean_low"], "primary_all_high": estimates["mean_high"],
                                       "primary_values": [tuple(runs[v]) for v in estimates["name"]]}))
    return tasks.merge(pd.concat(intervals), on=["task", "variant"], how="left").assign(
        primary_metric=data["analysis"]["spec"]["primary"])


def _results_root(out: Path) -> Optional[Path]:
    for parent in [out, *out.parents]:
        if parent.name == "results":
            return parent
    return None


GLOSSARY = "glossary.md"  # in the results folder: the key every matrix report under it links to


def glossary_path(out: Path | str) -> Optional[Path]:
    """The glossary a matrix directory's report links to: GLOSSARY in the results folder above it (None where DIR
    is not under one: its report then holds the key itself)."""
    out = Path(out).resolve()
    root = _results_root(out)
    return root / GLOSSARY if root is not None and root != out else None


def glossary_text() -> str:
    """The glossary page: how to read the marks, a task's tuning table, the measured numbers and the provenance,
    once for every matrix report (each links here instead of repeating it); prose wrapped at 120 characters."""
    sections = [
        ("How to read the marks", verdicts.MARKS_KEY),
        ("Tuning", "A tuned matrix's table per task: each variant's chosen grid point and its score on the validation "
                   "problems. " + verdicts.TUNING_KEY),
        ("Every measured number", MEASURED_KEY),
        (PROVENANCE, "The last section of a report: the device and libraries its cells ran with, the sessions that ran "
                     "them (elapsed time on the wall, apart from cell time summed over parallel workers), the commits "
                     "they ran at (naming those this repository's history lacks, and cells run with uncommitted "
                     "changes) and the command that makes the matrix and its report again.")]
    wrap = lambda text: "\n".join(textwrap.wrap(text, 120, break_on_hyphens=False, break_long_words=False))
    lines = ["# How to read the matrix reports", "",
             wrap("Written by `grpo-bench report DIR` for every matrix report under this folder, each of which links "
                  "here instead of repeating it. The front page's terms: [../README.md](../README.md#glossary).")]
    for heading, text in sections:
        lines += ["", f"## {heading}", "", wrap(text)]
    return "\n".join(lines) + "\n"


def _link(target: Path, page_folder: Path) -> str:
    return Path(os.path.relpath(target.resolve(), page_folder.resolve())).as_posix()


def _progress(out: Path, enabled: bool):
    """A function printing one line per step of the report, with the seconds since it started (the analysis and
    the plots take tens of seconds after a matrix's last cell). On stdout, beside the report's other lines: stderr
    holds an error's one line alone."""
    started = time.perf_counter()

    def say(what: str) -> None:
        if enabled:
            print(f"report {out}: {what} ({time.perf_counter() - started:.1f} s)", flush=True)

    return say


def report(out: Path | str, *, readme: Optional[str] = None, section: Optional[str] = None, plot: bool = True,
           verdicts_section: bool = True, cost_reference: Optional[str] = None, progress: bool = True,
           population=None) -> dict:
    """Tables, statistics, plots, README.md and index.html (``html``) of DIR; with ``readme`` (and always for
    results/README.md when DIR is under results/) two sections of that README: SECTION (the header lines and a
    link) and SECTION-verdicts. ``cost_reference``: a variant of the matrix, the unit of the cost tables (each
    variant's cost against it, seed by seed). ``progress``: a line on stdout as each step starts. ``population``:
    (DIR, analysis) -> {task: line}, each verdict section's population line (report/population.py's
    ``task_lines``, which sits above this module: the caller passes it)."""
    out = Path(out)
    meta = read_json(out / "matrix.json")
    if tuning_stage.in_tuning_stage(meta):
        return _tuning_stage_report(out, meta, readme, section)
    say = _progress(out, progress)
    say("reading the result store")
    collected = collect(out)
    variants = list(dict.fromkeys(collected["cells"]["variant"])) if "variant" in collected["cells"] else []
    if cost_reference is not None and cost_reference not in variants:  # before the analysis, not after it
        raise UsageError(f"--cost-reference {cost_reference}: not a variant of {out} (its variants: "
                         f"{', '.join(variants)})")
    say(f"{len(collected['cells'])} cells read; learning curves and verdicts")
    data = analyse(collected)
    if population is not None:
        data["analysis"]["population"] = population(out, data["analysis"])
    data["cost_reference"] = cost_reference
    data["flags"] = matrix_flags(data)
    summary = summarize(data["cells"])
    curves, analysis = data["curves"], data["analysis"]
    # Every step's metrics stay in the store alone (a steps.csv repeated them: 26 MB on the default matrix).
    # The per-question records stay in the store too (grpo-bench variance reads them): a digit a question per evaluation.
    evals = data["evals"].drop(columns=["questions", "question_samples"], errors="ignore")
    frames = [("cells", data["cells"]), ("evals", evals), ("summary", summary),
              ("curves", curves["completions"]), ("curve_metrics", curves["cells"]), ("verdicts", analysis["tasks"]),
              ("overall", analysis["overall"]), ("probability_of_improvement", analysis["poi"]),
              ("scaling_fits", analysis["scaling_fits"]), ("power", analysis["power"]), ("aa_pairs", analysis["aa"]),
              ("performance_profiles", analysis["profiles"]), ("tuning", analysis["tuning"])]
    pass_at_k = passk_table.summarize(data["cells"])
    if not pass_at_k.empty:
        frames.append((PASS_AT_K_TABLE[0], pass_at_k))
    for name, frame in frames:
        atomic_write_text(out / "tables" / f"{name}.csv", frame.to_csv(index=False))
    atomic_write_text(out / "tables" / "summary.md", summary_markdown(summary) + "\n")
    tasks = analysis["tasks"]
    best_set = set(tasks.loc[tasks["in_best_set"], "variant"]) if "in_best_set" in tasks else set()
    svgs: dict = {}
    if plot:
        say("plots")
    images = plots(data, curves, analysis, out / "plots", highlight=best_set or None,
                   highlight_label="could be best", svg=svgs) if plot else []
    source = str(out)
    say("README.md and index.html")
    key = glossary_path(out)
    if key is not None:
        atomic_write_text(key, glossary_text())
    own = _link(key, out) if key is not None else None
    whole = render(data, summary, images, "", source, glossary=own)
    atomic_write_text(out / "README.md", "# grpo-bench results\n\n" + whole)
    brief = render(data, summary, images, "", source, brief=True).rstrip().splitlines()
    html.write_page(out / html.PAGE, title=brief[0].lstrip("# "), header_md="\n\n".join(brief[1:-1]),
                    sentences=analysis["sentences"], tasks=tasks, summary=summary, svgs=svgs,
                    flags_md=flags.render(data["flags"], history=False),
                    pass_at_k_md=passk_table.markdown(data["cells"]),
                    report_md=render(data, summary, [], "", source, glossary=own),
                    files=[f"plots/{name}" for name, _ in images] + [f"tables/{name}.csv" for name, _ in frames])
    section_name = section or f"matrix-{out.name}"
    targets = _readme_targets(out, readme, verdicts_section)
    for target, with_verdicts in targets:
        prefix = Path(os.path.relpath(out.resolve(), target.resolve().parent)).as_posix() + "/"
        update_section(target, section_name, render(data, summary, images, prefix, source, brief=True))
        if with_verdicts:
            update_section(target, f"{section_name}-verdicts", verdicts.render(
                analysis, scaling=False, glossary=_link(key, target.parent) if key is not None else None))
    data["summary"] = summary
    data["written"] = [str(out / "README.md"), str(out / html.PAGE)] + [str(t) for t, _ in targets]
    say("done")
    return data


def _readme_targets(out: Path, readme: Optional[str], verdicts_section: bool) -> list[tuple[Path, bool]]:
    """The READMEs that get a section on DIR, each with whether it also gets the verdicts: results/README.md (an
    index of the matrices, without them) when DIR is under results/, and ``readme``."""
    targets = []
    root = _results_root(out.resolve())
    if root is not None and root != out.resolve():
        targets.append((root / "README.md", False))
    if readme:
        same = [i for i, (t, _) in enumerate(targets) if t.resolve() == Path(readme).resolve()]
        if same:  # --readme names the results index itself: one page, written once, with the verdicts
            targets[same[0]] = (targets[same[0]][0], verdicts_section)
        else:
            targets.append((Path(readme), verdicts_section))
    return targets


def _tuning_stage_report(out: Path, meta: dict, readme: Optional[str], section: Optional[str]) -> dict:
    """DIR/README.md (and the READMEs' sections) of a matrix still in its tuning stage: the grid so far."""
    store = ResultStore.read(out) or ResultStore(out / STORE_FILE, {}, {})
    found = flags.find(meta, store)  # what the tuning cells so far rest on: their code and hosts
    atomic_write_text(out / "README.md", "# grpo-bench results\n\n" + tuning_stage.render(meta, store) + "\n"
                      + flags.render(found))
    targets = _readme_targets(out, readme, False)
    for target, _ in targets:
        prefix = Path(os.path.relpath(out.resolve(), target.resolve().parent)).as_posix() + "/"
        update_section(target, section or f"matrix-{out.name}", tuning_stage.render(meta, store, prefix, brief=True))
    return {"meta": meta, "tuning_stage": tuning_stage.progress_rows(meta, store), "analysis": {}, "flags": found,
            "written": [str(out / "README.md")] + [str(t) for t, _ in targets]}
