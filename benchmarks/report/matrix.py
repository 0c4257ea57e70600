"""``grpo-bench report DIR``: a matrix directory's cells as tidy tables, learning curves, robust
statistics, verdicts and plots. This module collects the cells and orchestrates; the parts live by concern:
``curves`` (learning curves from the evaluations), ``stats`` (AUC, thresholds, t and bootstrap intervals),
``verdicts`` (rankings and the guidance sentences), ``plots``, ``tables`` (markdown). The report reads
files only: it never imports the harness or the command line.

Writes under DIR:
    tables/cells.csv   one row per cell (complete, failed or missing), every measured number
    tables/evals.csv   accuracy and reward before, during and after training (long format)
    tables/steps.csv   every training step's metrics (long format: one row per cell and step)
    tables/summary.csv / summary.md   per task and variant: mean and 95% t-interval over seeds
    tables/curves.csv  accuracy on each task's grid of completion counts, per cell
    tables/curve_metrics.csv   per cell: final accuracy, AUC, completions to the threshold
    tables/verdicts.csv / overall.csv / probability_of_improvement.csv / performance_profiles.csv
    plots/*.png        learning curves, training reward, bars, per-task diagnostics, rliable plots
    README.md          the verdicts, tables and plots; also a section of results/README.md when DIR is under results/

Over a partial directory it says which cells are missing and reports the rest; failed cells are
listed with their error and left out of the means and the statistics.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Optional

import pandas as pd

from benchmarks.errors import UsageError
from benchmarks.io import atomic_write_text, read_jsonl
from benchmarks.report import curves as learning_curves
from benchmarks.report import verdicts
from benchmarks.report.readme import update_section
from benchmarks.report.stats import t_interval
from benchmarks.report.tables import markdown_table, plus_minus

CELL_KEYS = ["task", "variant", "algo", "seed"]
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


def _read_json(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _planned_cells(out: Path) -> tuple[dict, list[dict]]:
    meta = _read_json(out / "matrix.json")
    if meta:
        return meta, meta.get("cells", [])
    # No plan (cells copied around, or runs of `grpo-bench run`): whatever cell directories are there.
    cells = []
    for marker in sorted({p.parent for p in out.rglob("cell.json")} | {p.parent for p in out.rglob("summary.json")}):
        spec = _read_json(marker / "cell.json") or {}
        summary = _read_json(marker / "summary.json") or {}
        cells.append({
            "dir": str(marker.relative_to(out)), "task_label": spec.get("task_label", summary.get("task")),
            "task": spec.get("task", summary.get("task")), "variant": spec.get("variant", summary.get("algo")),
            "algo": spec.get("algo", summary.get("algo")), "seed": spec.get("seed", summary.get("seed")),
            "steps": spec.get("steps", summary.get("steps")), "budget": spec.get("budget"),
            "completions_per_step": spec.get("completions_per_step"), "eval_every": spec.get("eval_every"),
        })
    return {}, cells


def collect(out: Path) -> dict:
    """Read every cell of DIR into three tidy frames (cells, evals, steps) plus the matrix's metadata."""
    out = Path(out)
    if not out.is_dir():
        raise UsageError(f"no such directory: {out}")
    meta, planned = _planned_cells(out)
    if not planned:
        raise UsageError(f"nothing to report in {out}: no matrix.json and no cell summaries "
                         f"(run: grpo-bench matrix FILE --out {out})")
    cell_rows, eval_rows, step_rows = [], [], []
    for spec in planned:
        cell_dir = out / spec["dir"]
        keys = {"task": spec["task_label"], "variant": spec["variant"], "algo": spec["algo"], "seed": spec["seed"]}
        summary = _read_json(cell_dir / "summary.json")
        metrics = read_jsonl(cell_dir / "metrics.jsonl")
        row = {**keys, "task_name": spec["task"], "steps_planned": spec.get("steps"), "budget": spec.get("budget"),
               "completions_per_step": spec.get("completions_per_step"), "eval_every": spec.get("eval_every"),
               "dir": spec["dir"]}
        if summary is None:
            row["status"] = "missing" if not metrics else f"unfinished ({len(metrics)} of {spec.get('steps')} steps)"
            cell_rows.append(row)
            continue
        row.update(_flatten_summary(summary))
        cell_rows.append(row)
        if summary.get("status") != "complete":
            continue
        cps = spec.get("completions_per_step") or (summary["completions_generated"] / max(summary["steps"], 1))
        samples, samples_at = 0.0, {0: 0.0}
        for r in metrics:  # "completions" is per step; "samples" counts them up (what the budget counts)
            samples += r.get("completions", cps)
            samples_at[r["step"]] = samples
            step_rows.append({**keys, **r, "samples": samples})
        evals = [(0, 0.0, "before", {k[: -len("_before")]: v for k, v in summary.items() if k.endswith("_before")})]
        evals += [(r["step"], r["time/wall"], "during", {k[len("eval/"):]: v for k, v in r.items() if k.startswith("eval/")})
                  for r in metrics if any(k.startswith("eval/") for k in r)]
        evals.append((summary["steps"], summary["wall_clock_s"], "after",
                      {k[: -len("_after")]: v for k, v in summary.items() if k.endswith("_after")}))
        for step, wall, phase, values in evals:
            eval_rows.append({**keys, "step": step, "samples": samples_at.get(step, step * cps), "time/wall": wall, "phase": phase, **values})
    cells = pd.DataFrame(cell_rows)
    # A summary written by a failed or foreign cell may lack fields: they are missing values, not errors.
    for column in [c for c, _, _, _ in SUMMARY_COLUMNS] + ["peak_memory_bytes", "peak_memory_kind", "accuracy_after"]:
        if column not in cells:
            cells[column] = math.nan
    return {"meta": meta, "cells": cells, "evals": pd.DataFrame(eval_rows), "steps": pd.DataFrame(step_rows)}


def _flatten_summary(s: dict) -> dict:
    row = {k: v for k, v in s.items() if not isinstance(v, (dict, list)) and k not in CELL_KEYS}
    row.update({f"time_{phase}_s": v for phase, v in (s.get("phase_seconds") or {}).items()})
    row.update({f"version_{lib}": v for lib, v in (s.get("versions") or {}).items()})
    if not s.get("tokens_generated"):
        row["tokens_per_second"] = None
    if "param_bytes" in s:
        row["training_state_bytes"] = s["param_bytes"] + s.get("grad_bytes", 0) + s.get("optimizer_bytes", 0)
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
               "steps": group["steps_planned"].iloc[0]}
        for column, _, _, _ in SUMMARY_COLUMNS:
            mean, half = t_interval(done[column]) if column in done else (math.nan, math.nan)
            row[f"{column}_mean"], row[f"{column}_ci95"] = mean, half
        rows.append(row)
    return pd.DataFrame(rows)


PHASES = ["generate", "score", "logprobs", "update"]


def phase_markdown(cells: pd.DataFrame) -> str:
    """Mean seconds per phase over complete seeds; "other" is process start-up and evaluation."""
    done = cells[cells["status"] == "complete"].copy()
    if done.empty:
        return ""
    for phase in PHASES:
        done[f"time_{phase}_s"] = done.get(f"time_{phase}_s", pd.Series(0.0, index=done.index)).fillna(0.0)
    done["other"] = done["process_wall_clock_s"] - done["wall_clock_s"] if "process_wall_clock_s" in done else math.nan
    means = done.groupby(["task", "variant"], sort=False)[[f"time_{p}_s" for p in PHASES] + ["wall_clock_s", "other"]].mean()
    rows = [[task, variant] + [f"{v:.2f}" for v in r] for (task, variant), r in zip(means.index, means.values)]
    return markdown_table(["task", "variant"] + PHASES + ["training total", "start-up + evaluation"], rows)


def summary_markdown(summary: pd.DataFrame) -> str:
    headers = ["task", "variant", "seeds", "steps x completions"] + [h for _, h, _, _ in SUMMARY_COLUMNS]
    rows = []
    for _, r in summary.iterrows():
        seeds = f"{r['seeds_complete']}/{r['seeds_planned']}" + (f" ({r['failed']} failed)" if r["failed"] else "")
        used = "-" if pd.isna(r["completions_used"]) else f"{r['completions_used']:.0f}"
        rows.append([r["task"], r["variant"], seeds, f"{r['steps']} = {used}"]
                    + [plus_minus(r[f"{c}_mean"], r[f"{c}_ci95"], fmt, scale) for c, _, fmt, scale in SUMMARY_COLUMNS])
    return markdown_table(headers, rows)


# ------------------------------------------------------------------------------------------------
# Markdown and the command
# ------------------------------------------------------------------------------------------------


def render(data: dict, summary: pd.DataFrame, images: list[tuple[str, str]], prefix: str, source: str,
           *, with_verdicts: bool = True) -> str:
    """The report as markdown; ``prefix`` is the path from the README holding it to DIR. The verdicts
    (``data["analysis"]``) come first unless ``with_verdicts`` is False (a README that holds them in a
    section of their own)."""
    meta, cells = data["meta"], data["cells"]
    done = cells[cells["status"] == "complete"] if "status" in cells else cells.iloc[:0]
    lines = [f"### Matrix `{meta.get('name', Path(source).name)}`" + (f": {meta['description']}" if meta.get("description") else "")]
    if not done.empty:
        first = done.iloc[0]
        versions = ", ".join(f"{lib} {first.get('version_' + lib)}" for lib in ("torch", "transformers", "trl")
                             if isinstance(first.get("version_" + lib), str))
        lines.append(f"Device: {first.get('device_name')} ({first.get('precision')}); {versions}.")
    budgets = cells.drop_duplicates("task")[["task", "budget"]].dropna()
    if not budgets.empty:
        lines.append("Budget: " + ", ".join(f"{int(b)} generated completions per cell on {t}" for t, b in budgets.values)
                     + "; each variant runs budget // (its completions per step) steps, shown in the table as steps = completions used.")
    sessions = meta.get("sessions", [])
    if sessions:
        lines.append(f"Matrix wall-clock: {sum(s['elapsed_s'] for s in sessions):.0f} s over {len(sessions)} session(s)"
                     + (f"; training alone {done['wall_clock_s'].sum():.0f} s, the rest is process start-up and evaluation."
                        if not done.empty else "."))
    counts = cells["status"].value_counts() if "status" in cells else {}
    lines.append(f"Cells: {len(cells)} planned, " + ", ".join(f"{n} {s}" for s, n in counts.items()) + ".")
    if with_verdicts and data.get("analysis") is not None:
        lines += ["", verdicts.render(data["analysis"]).rstrip()]
    lines += ["", "#### Every measured number", "",
              "Mean ± 95% confidence interval over seeds (Student t); failed and missing cells are left out of the means. "
              "On CPU, peak memory is the cell process's peak RSS, Python and torch included; "
              "params+grads+optim counts what training adds (a critic included).",
              "", summary_markdown(summary)]
    phases = phase_markdown(cells) if "status" in cells else ""
    if phases:
        lines += ["", "Wall-clock per phase (seconds per cell, mean over seeds):", "", phases]
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
    links = [f"[{prefix}tables/{name}.csv]({prefix}tables/{name}.csv)" + note for name, note in TABLES]
    lines += ["", "Tables: " + ", ".join(links) + "."]
    if meta.get("file"):
        lines += ["", f"Regenerate: `grpo-bench matrix {meta['file']} --out {source} && grpo-bench report {source}`"]
    return "\n".join(lines) + "\n"


TABLES = [("summary", ""), ("cells", " (every cell)"), ("evals", ""), ("steps", ""), ("curves", " (accuracy on each task's grid)"),
          ("curve_metrics", " (per cell: AUC, completions to threshold)"), ("verdicts", ""), ("overall", ""),
          ("probability_of_improvement", ""), ("performance_profiles", "")]


def analyse(data: dict) -> dict:
    """Learning curves and the statistics over them, added to ``data`` as "curves" and "analysis"."""
    data["curves"] = learning_curves.build(data["cells"], data["evals"])
    data["analysis"] = verdicts.analyse(data["cells"], data["curves"])
    return data


def _results_root(out: Path) -> Optional[Path]:
    for parent in [out, *out.parents]:
        if parent.name == "results":
            return parent
    return None


def report(out: Path | str, *, readme: Optional[str] = None, section: Optional[str] = None, plot: bool = True) -> dict:
    """Tables, statistics, plots and README.md of DIR; with ``readme`` (and always for results/README.md when DIR
    is under results/) also two sections of that README: SECTION (the report) and SECTION-verdicts."""
    from benchmarks.report.plots import plots

    out = Path(out)
    data = analyse(collect(out))
    summary = summarize(data["cells"])
    curves, analysis = data["curves"], data["analysis"]
    frames = [("cells", data["cells"]), ("evals", data["evals"]), ("steps", data["steps"]), ("summary", summary),
              ("curves", curves["completions"]), ("curve_metrics", curves["cells"]), ("verdicts", analysis["tasks"]),
              ("overall", analysis["overall"]), ("probability_of_improvement", analysis["poi"]),
              ("performance_profiles", analysis["profiles"])]
    for name, frame in frames:
        atomic_write_text(out / "tables" / f"{name}.csv", frame.to_csv(index=False))
    atomic_write_text(out / "tables" / "summary.md", summary_markdown(summary) + "\n")
    images = plots(data, curves, analysis, out / "plots") if plot else []
    source = str(out)
    atomic_write_text(out / "README.md", "# grpo-bench results\n\n" + render(data, summary, images, "", source))
    section_name = section or f"matrix-{out.name}"
    targets = []
    root = _results_root(out.resolve())
    if root is not None and root != out.resolve():
        targets.append(root / "README.md")
    if readme:
        targets.append(Path(readme))
    for target in targets:
        prefix = Path(os.path.relpath(out.resolve(), target.resolve().parent)).as_posix() + "/"
        update_section(target, section_name, render(data, summary, images, prefix, source, with_verdicts=False))
        update_section(target, f"{section_name}-verdicts", verdicts.render(analysis))
    data["summary"] = summary
    data["written"] = [str(out / "README.md")] + [str(t) for t in targets]
    return data
