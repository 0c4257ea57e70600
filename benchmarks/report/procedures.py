"""``python -m benchmarks.report.procedures [DIR ...] [--out FILE]``: the verdict procedures side by side at every
committed design (benchmarks/report/inference.py's PROCEDURES).

Per result store (every results/**/results.parquet with its matrix.json, or the directories given) and task: the
design (variants x complete seeds), the procedure the matrix registered, and per procedure its critical value with
the Monte Carlo band, its MDD (the true gap to the best called "worse" with 80% probability, for a pair of the
design's pooled spread; and the median over the pairs of each pair's own), and how many variants each marks worse,
best, equivalent or not resolved, with the marks that are fragile (they change with c moved within its band).
Where the store keeps per-question records, crossed-v4 (the questions sampled too) beside them: the same numbers,
its MDD at 2x and 4x the seeds and with 10,000 (the question floor), the seeds an MDD of TARGET needs, and the MDD
among the variants it leaves in the could-be-best set. Written as a markdown page (default:
results/calibration/procedures.md), atomically; it reads the stores only.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd
from scipy import stats as st

from benchmarks.errors import UsageError
from benchmarks.io import atomic_write_text
from benchmarks.markdown import markdown_table
from benchmarks.report import crossed, inference
from benchmarks.report.curves import build
from benchmarks.report.matrix import collect
from benchmarks.report.verdicts import analysis_spec

DEFAULT_OUT = "results/calibration/procedures.md"
COMPARED = ("pairs-v2", "paired-v3")
CROSSED = "crossed-v4"  # beside them where the store keeps per-question records
TARGET = 0.05  # the MDD whose seeds crossed-v4's columns give


def stores(root: Path | str = "results") -> list[Path]:
    """Every committed result store under ``root`` that has a matrix.json."""
    return sorted(p.parent for p in Path(root).glob("**/results.parquet") if (p.parent / "matrix.json").exists())


def task_scores(directory: Path) -> tuple[dict, dict[str, dict]]:
    """(matrix.json's meta, {task: {variant: {seed: primary metric}}}) over the complete cells."""
    data = collect(directory)
    spec = analysis_spec(data["meta"])
    cells = data["cells"][data["cells"]["status"] == "complete"]
    per_cell = build(cells, data["evals"], spec["primary"]).get("cells", pd.DataFrame())
    out = {}
    for task, frame in (per_cell.groupby("task", sort=False) if not per_cell.empty else []):
        out[task] = {v: dict(zip(g["seed"].astype(int), g["primary"].astype(float)))
                     for v, g in frame.groupby("variant", sort=False)}
    return data["meta"], out


def pair_mdd(f: inference.Fit) -> float:
    """The median over the pairs of (c + t_0.8(df)) * SE_ij, each pair's own standard error."""
    k = len(f.variants)
    se = f.pair_se if f.pair_se is not None else f.half_widths / f.c
    return float(np.median((f.c + st.t.ppf(inference.POWER, f.pair_df)) * se[np.triu_indices(k, 1)]))


def row_of(matrix: str, task: str, scores: dict, registered: Optional[str], margin,
           questions: Optional[dict] = None) -> Optional[dict]:
    """One design's line: per procedure c [band], the MDDs and the marks' counts (None: no model); with
    ``questions`` ({variant: {seed: per-question scores}}) crossed-v4's too (``crossed_columns``)."""
    row = {"matrix": matrix, "task": task, "registered": registered or "none"}
    for name in COMPARED:
        marks, f = inference.compare(scores, margin=margin, procedure=name)
        if f is None or not np.isfinite(f.c):
            return None
        row.update({"design": f"{len(f.variants)} x {int(np.median(f.n))}",
                    f"{name} c": f"{f.c:.2f} [{f.c_low:.2f}, {f.c_high:.2f}]",
                    f"{name} MDD": inference.summary(f, margin=margin)["mdd"], f"{name} pair MDD": pair_mdd(f),
                    f"{name} marks": _counts(marks)})
    return {**row, **crossed_columns(scores, questions, margin)}


def crossed_columns(scores: dict, questions: Optional[dict], margin) -> dict:
    """crossed-v4's numbers of a design: c [band], the MDDs (pooled, at 2x and 4x the seeds, with 10,000, among
    its could-be-best set), the median pair MDD, the seeds an MDD of TARGET needs, the marks; {} where there are
    no per-question records or too few complete seeds to pair them."""
    if questions is None:
        return {}
    try:
        marks, f = inference.compare(scores, margin=margin, procedure=CROSSED, questions=questions)
    except ValueError:  # fewer than MIN_BLOCKS complete seeds, a cell without its record
        return {}
    if f is None or not np.isfinite(f.c):
        return {}
    out = inference.summary(f, margin=margin, target=TARGET, contenders=list(marks["variant"][marks["in_best_set"]]))
    return {f"{CROSSED} c": f"{f.c:.2f} [{f.c_low:.2f}, {f.c_high:.2f}]", f"{CROSSED} MDD": out["mdd"],
            f"{CROSSED} pair MDD": pair_mdd(f), f"{CROSSED} MDD x2 seeds": out["mdd_x2"],
            f"{CROSSED} MDD x4 seeds": out["mdd_x4"], f"{CROSSED} MDD floor": out["mdd_question_floor"],
            f"{CROSSED} seeds for target": out["seeds_for_target"], f"{CROSSED} set MDD": out.get("mdd_set"),
            f"{CROSSED} marks": _counts(marks), f"{CROSSED} questions": out["questions"]}


def task_questions(directory: Path) -> dict[str, dict]:
    """{task: {variant: {seed: per-question scores}}} of a store with per-question records ({} without)."""
    try:
        frame = crossed.question_scores(directory)
    except UsageError:  # cells run before the harness kept per-question records
        return {}
    return {task: crossed.task_inputs(frame, task=task)[1] for task in dict.fromkeys(frame["task"])}


def _counts(marks: pd.DataFrame) -> str:
    judged = marks[marks["mark"] != inference.TOO_FEW]
    counts = judged["mark"].value_counts()
    text = ", ".join(f"{counts[m]} {m}" for m in (inference.BEST, inference.WORSE, inference.EQUIVALENT,
                                                  inference.NOT_RESOLVED) if m in counts)
    fragile = int(judged["fragile"].sum())
    return text + (f"; {fragile} fragile" if fragile else "")


def table(directories: Sequence[Path]) -> pd.DataFrame:
    rows = []
    for directory in directories:
        try:
            meta, by_task = task_scores(directory)
        except UsageError as error:  # e.g. a tuned matrix between its stages: nothing to judge yet
            print(f"skipped {directory}: {error}", file=sys.stderr)
            continue
        spec = analysis_spec(meta)
        questions = task_questions(directory)
        for task, scores in by_task.items():
            row = row_of(meta.get("name") or directory.name, task, scores,
                         inference.registered(meta.get("analysis")), spec["margin"], questions.get(task))
            if row is not None:
                rows.append({"store": str(directory), **row})
    return pd.DataFrame(rows)


def render(frame: pd.DataFrame) -> str:
    """The page: one line per design, the pair MDD ratio of the two COMPARED procedures last."""
    head = ["store", "task", "design", "registered"]
    lines = ["# The verdict procedures at the committed designs", "",
             "Written by `python -m benchmarks.report.procedures` (benchmarks/report/procedures.py) from the result "
             "stores; the procedures are benchmarks/report/inference.py's PROCEDURES. *c*: the critical value "
             "[its Monte Carlo band, +-2 SE]; *MDD*: the gap to the best called worse with 80% probability for a "
             "pair of the design's pooled spread; *pair MDD*: the median over the pairs of each pair's own.", ""]
    rows = []
    for r in frame.itertuples(index=False):
        r = r._asdict()
        cells = [r["store"], r["task"], r["design"], r["registered"]]
        for name in COMPARED:
            key = name.replace("-", "_")
            cells += [r[f"{key}_c"], f"{r[f'{key}_MDD']:.3f}", f"{r[f'{key}_pair_MDD']:.3f}", r[f"{key}_marks"]]
        base, other = (name.replace("-", "_") for name in COMPARED)
        cells.append(f"{r[f'{other}_pair_MDD'] / r[f'{base}_pair_MDD']:.2f}")
        rows.append(cells)
    columns = head + [f"{name} {what}" for name in COMPARED for what in ("c", "MDD", "pair MDD", "marks")]
    lines.append(markdown_table(columns + [f"pair MDD {COMPARED[1]} / {COMPARED[0]}"], rows))
    return "\n".join(lines + _crossed_table(frame)) + "\n"


def _crossed_table(frame: pd.DataFrame) -> list[str]:
    """crossed-v4's columns, for the designs whose stores keep per-question records."""
    key = lambda what: f"{CROSSED} {what}".replace("-", "_").replace(" ", "_")
    if key("c") not in frame:
        return []
    missing = lambda x: x is None or (isinstance(x, float) and not np.isfinite(x))
    number = lambda x, fmt="{:.3f}": "-" if missing(x) else fmt.format(x)
    rows = []
    for r in frame[frame[key("c")].map(lambda x: isinstance(x, str))].itertuples(index=False):
        r = r._asdict()
        base = COMPARED[0].replace("-", "_")
        rows.append([r["store"], r["task"], f"{r['design']} x {int(r[key('questions')])}", r[key("c")],
                     number(r[key("MDD")]), number(r[key("pair_MDD")]),
                     number(r[key("pair_MDD")] / r[f"{base}_pair_MDD"], "{:.2f}"), number(r[key("MDD_x2_seeds")]),
                     number(r[key("MDD_x4_seeds")]), number(r[key("MDD_floor")]),
                     "past 1024" if missing(r[key("seeds_for_target")]) else f"{r[key('seeds_for_target')]:.0f}",
                     number(r[key("set_MDD")]), r[key("marks")]])
    if not rows:
        return []
    return ["", f"## `{CROSSED}`: the questions sampled too", "",
            f"Where a store keeps per-question records: `{CROSSED}` judges each pair on its per-(seed, question) "
            "differences, so its marks speak for the task's questions, not the Q evaluated (offered, not current). "
            "*MDD*, *pair MDD*: as above, with the questions sampled; the ratio is its pair MDD over "
            f"`{COMPARED[0]}`'s (seeds only); *x2*, *x4 seeds*: its MDD with that many more seeds, the questions "
            "fixed (c scaled from the equal-spread value as at the design's own seeds); *floor*: with 10,000 seeds, "
            f"what the Q questions leave; *seeds for {TARGET:g}*: the fewest seeds whose MDD reaches {TARGET:g} "
            "('past 1024': under the floor); *set MDD*: among the variants it leaves in the could-be-best set "
            "('-': all of them).", "",
            markdown_table(["store", "task", "design (variants x seeds x questions)", f"{CROSSED} c", "MDD",
                            "pair MDD", f"pair MDD / {COMPARED[0]}", "MDD x2 seeds", "MDD x4 seeds", "MDD floor",
                            f"seeds for {TARGET:g}", "set MDD", "marks"], rows)]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``[DIR ...] [--out FILE]``: no flags beyond --out (this module stays out of the command line's argparse)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--help" in args or "-h" in args:
        print(__doc__.strip())
        return 0
    out = DEFAULT_OUT
    if "--out" in args:
        at = args.index("--out")
        if at + 1 >= len(args):
            print("error: --out needs a file", file=sys.stderr)
            return 2
        out = args[at + 1]
        del args[at:at + 2]
    unknown = [a for a in args if a.startswith("-")]
    directories = [Path(d) for d in args] or stores()
    missing = [str(d) for d in directories if not (d / "matrix.json").exists()]
    if unknown or missing:
        print(f"error: {'unknown option ' + unknown[0] if unknown else 'not a result store (no matrix.json): '}"
              f"{', '.join(missing) if not unknown else ''}; usage: python -m benchmarks.report.procedures "
              "[DIR ...] [--out FILE]", file=sys.stderr)
        return 2
    frame = table(directories)
    renamed = frame.rename(columns=lambda c: c.replace("-", "_").replace(" ", "_"))
    atomic_write_text(Path(out), render(renamed))
    print(f"wrote {out} ({len(frame)} designs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
