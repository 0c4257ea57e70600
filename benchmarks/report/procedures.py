"""``python -m benchmarks.report.procedures [DIR ...] [--out FILE]``: the verdict procedures side by side at every
committed design (benchmarks/report/inference.py's PROCEDURES).

Per result store (every results/**/results.parquet with its matrix.json, or the directories given) and task: the
design (variants x complete seeds), the procedure the matrix registered, and per procedure its critical value with
the Monte Carlo band, its MDD (the true gap to the best called "worse" with 80% probability, for a pair of the
design's pooled spread; and the median over the pairs of each pair's own), and how many variants each marks worse,
best, equivalent or not resolved, with the marks that are fragile (they change with c moved within its band).
Written as a markdown page (default: results/calibration/procedures.md), atomically; it reads the stores only.
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
from benchmarks.report import inference
from benchmarks.report.curves import build
from benchmarks.report.matrix import collect
from benchmarks.report.verdicts import analysis_spec

DEFAULT_OUT = "results/calibration/procedures.md"
COMPARED = ("pairs-v2", "paired-v3")


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


def row_of(matrix: str, task: str, scores: dict, registered: Optional[str], margin) -> Optional[dict]:
    """One design's line: per procedure c [band], the MDDs and the marks' counts (None: no model)."""
    row = {"matrix": matrix, "task": task, "registered": registered or "none"}
    for name in COMPARED:
        marks, f = inference.compare(scores, margin=margin, procedure=name)
        if f is None or not np.isfinite(f.c):
            return None
        row.update({"design": f"{len(f.variants)} x {int(np.median(f.n))}",
                    f"{name} c": f"{f.c:.2f} [{f.c_low:.2f}, {f.c_high:.2f}]",
                    f"{name} MDD": inference.summary(f, margin=margin)["mdd"], f"{name} pair MDD": pair_mdd(f),
                    f"{name} marks": _counts(marks)})
    return row


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
        for task, scores in by_task.items():
            row = row_of(meta.get("name") or directory.name, task, scores,
                         inference.registered(meta.get("analysis")), spec["margin"])
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
    return "\n".join(lines + [markdown_table(columns + [f"pair MDD {COMPARED[1]} / {COMPARED[0]}"], rows)]) + "\n"


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
