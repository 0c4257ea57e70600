"""``grpo-bench bench executors FILE``: one matrix run twice, side by side in one command: one cell at a
time in fresh processes (``subprocess``), then the default ``local`` executor (warm workers, cells in
parallel). Reports each run's wall-clock and where it went (start-up, build, training, evaluation,
idle slots), the ratio, and whether every cell's metrics rows are equal (timing columns aside)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Optional, Sequence

from benchmarks.errors import UsageError
from benchmarks.io import atomic_write_json, atomic_write_text, read_jsonl
from benchmarks.matrix import parse, run_matrix
from benchmarks.matrix.executors import make_executor
from benchmarks.matrix.timing import wallclock_breakdown
from benchmarks.report.tables import markdown_table

PHASES = ("startup_s", "build_s", "train_s", "eval_s", "reset_s", "other_s", "idle_s")


def _rows_without_timing(path: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in read_jsonl(path)]


def compare_executors(matrix_file: str, out: Path, *, jobs: int = 0, names=("subprocess", "local"),
                      seeds: Optional[Sequence[int]] = None) -> dict:
    plan = parse(matrix_file)
    if seeds:  # the matrix's cells of these seeds only, so that two full runs of a large matrix fit a session
        missing = sorted(set(seeds) - {c.seed for c in plan.cells})
        if missing:
            raise UsageError(f"--seeds {' '.join(map(str, missing))}: not among the seeds of {matrix_file}")
        plan = dataclasses.replace(plan, cells=[c for c in plan.cells if c.seed in seeds])
    runs = {}
    for name in names:
        start = time.perf_counter()
        counts = run_matrix(plan, out / name, overwrite=True, progress=True, executor=make_executor(name, jobs=jobs))
        elapsed = time.perf_counter() - start
        breakdown = wallclock_breakdown(out / name)
        runs[name] = {"elapsed_s": elapsed, "counts": counts, "timing": breakdown["total"],
                      "jobs": (breakdown["sessions"][-1] if breakdown["sessions"] else {}).get("jobs")}
    base, fast = names
    same = [c.relpath for c in plan.cells
            if _rows_without_timing(out / base / c.relpath / "metrics.jsonl") == _rows_without_timing(out / fast / c.relpath / "metrics.jsonl")]
    return {"matrix": matrix_file, "seeds": sorted({c.seed for c in plan.cells}), "cells": len(plan.cells), "runs": runs,
            "ratio": runs[fast]["elapsed_s"] / runs[base]["elapsed_s"], "identical_cells": len(same),
            "differing_cells": [c.relpath for c in plan.cells if c.relpath not in same]}


def render(result: dict, command: str) -> str:
    headers = ["executor", "jobs", "cells complete", "wall-clock (s)"] + [p[:-2].replace("_", " ") + " (s)" for p in PHASES]
    rows = []
    for name, run in result["runs"].items():
        t = run["timing"]
        rows.append([name, run["jobs"] or 1, run["counts"]["complete"], f"{run['elapsed_s']:.0f}"]
                    + [f"{t.get(p, 0.0):.0f}" for p in PHASES])
    names = list(result["runs"])
    seeds = result.get("seeds")
    lines = [
        f"Matrix `{result['matrix']}` ({result['cells']} cells"
        + (f", seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}" if seeds else "") + ") run twice in one command: `{names[0]}` (one cell at a "
        f"time, a fresh process each) then `{names[1]}` (the default). Phase columns are summed over cells; idle is "
        "worker slots x wall-clock minus the cells' process time.", "",
        markdown_table(headers, rows), "",
        f"**{names[1]} / {names[0]} wall-clock: {result['ratio']:.2f}** (target: at most 0.40).",
        f"Metrics rows identical (timing columns aside) in {result['identical_cells']} of {result['cells']} cells"
        + ("." if not result["differing_cells"] else
           f"; the others differ because the thread count per cell differs between the runs: {', '.join(result['differing_cells'][:6])}"
           + (" ..." if len(result["differing_cells"]) > 6 else "")),
        "", f"Regenerate: `{command}`",
    ]
    return "\n".join(lines) + "\n"


def run_bench_executors(matrix_file: str, out: str, jobs: int = 0, readme: Optional[str] = None,
                        seeds: Optional[Sequence[int]] = None, section: str = "executors") -> dict:
    out_dir = Path(out)
    result = compare_executors(matrix_file, out_dir / "runs", jobs=jobs, seeds=seeds)
    command = (f"grpo-bench bench executors {matrix_file} --out {out}" + (f" --jobs {jobs}" if jobs else "")
               + (f" --seeds {' '.join(map(str, seeds))}" if seeds else "")
               + (f" --readme {readme}" if readme else "") + (f" --section {section}" if section != "executors" else ""))
    body = render(result, command)
    atomic_write_json(out_dir / "executors.json", result)
    atomic_write_text(out_dir / "executors.md", "# Executors: one cell at a time vs the default\n\n" + body)
    print(body)
    if readme:
        from benchmarks.report.readme import update_section

        update_section(readme, section, "### Executors: one cell at a time vs warm workers in parallel\n\n" + body)
    return result
