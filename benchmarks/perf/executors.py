"""``grpo-bench bench executors FILE``: one matrix run twice, side by side in one command: one cell at a
time in fresh processes (``subprocess``), then the default ``local`` executor (warm workers, cells in
parallel). Reports each run's wall-clock and where it went (start-up, build, training, evaluation,
idle slots), the ratio, and whether every cell's metrics rows are equal (timing columns aside)."""

from __future__ import annotations

import csv
import dataclasses
import json
import statistics
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
    return {"matrix": matrix_file, "seeds": sorted({c.seed for c in plan.cells}), "cells": len(plan.cells),
            "executors": list(names), "runs": runs,
            "ratio": runs[fast]["elapsed_s"] / runs[base]["elapsed_s"], "identical_cells": len(same),
            "differing_cells": [c.relpath for c in plan.cells if c.relpath not in same]}


def seed_spread(matrix_dir: Path) -> dict[str, dict[str, float]]:
    """Each task/variant's final accuracy over seeds in a finished matrix's cells.csv: standard deviation, min, max."""
    by_variant: dict[str, list[float]] = {}
    with open(Path(matrix_dir) / "tables" / "cells.csv", newline="") as f:
        for row in csv.DictReader(f):
            if row.get("accuracy_after"):
                by_variant.setdefault(row["dir"].rsplit("/", 1)[0], []).append(float(row["accuracy_after"]))
    return {key: {"std": statistics.stdev(values), "min": min(values), "max": max(values)}
            for key, values in by_variant.items() if len(values) > 1}


def compare_accuracy(out: Path, names: Sequence[str], spread: Optional[dict[str, dict[str, float]]] = None) -> dict:
    """Every cell's final accuracy under both executors, their threads per cell, and (given the seed spread of
    another run of the same matrix) whether a difference is within that spread."""
    base, fast = names
    cells = []
    for summary_path in sorted((out / base).glob("**/summary.json")):
        relpath = str(summary_path.parent.relative_to(out / base))
        other = out / fast / relpath / "summary.json"
        if not other.exists():
            continue
        a, b = (json.loads(p.read_text()) for p in (summary_path, other))
        if a.get("accuracy_after") is None or b.get("accuracy_after") is None:
            continue
        variant = relpath.rsplit("/", 1)[0]
        cells.append({"cell": relpath, "task": relpath.split("/", 1)[0], base: a["accuracy_after"], fast: b["accuracy_after"],
                      "threads": [a.get("threads"), b.get("threads")], "seeds": (spread or {}).get(variant)})
    tasks = {}
    for cell in cells:
        t = tasks.setdefault(cell["task"], {"cells": 0, base: [], fast: [], "abs_diff": [], "seed_std": []})
        t["cells"] += 1
        t[base].append(cell[base])
        t[fast].append(cell[fast])
        t["abs_diff"].append(abs(cell[base] - cell[fast]))
        if cell["seeds"] is not None:
            t["seed_std"].append(cell["seeds"]["std"])
    equal = sum(c[base] == c[fast] for c in cells)
    judged = [c for c in cells if c[base] != c[fast] and c["seeds"] is not None]
    within = sum(abs(c[base] - c[fast]) <= c["seeds"]["std"] for c in judged)
    in_range = sum(c["seeds"]["min"] <= min(c[base], c[fast]) and max(c[base], c[fast]) <= c["seeds"]["max"] for c in judged)
    return {"cells": cells, "equal": equal, "differing_judged": len(judged), "within_seed_std": within,
            "within_seed_range": in_range,
            "threads": sorted({tuple(c["threads"]) for c in cells}),
            "tasks": {name: {"cells": t["cells"], f"{base}_mean": statistics.fmean(t[base]), f"{fast}_mean": statistics.fmean(t[fast]),
                             "max_abs_diff": max(t["abs_diff"]),
                             "mean_seed_std": statistics.fmean(t["seed_std"]) if t["seed_std"] else None}
                      for name, t in tasks.items()}}


def _executor_order(result: dict) -> list[str]:
    """One cell at a time first, then the default (a stored result's ``runs`` may come back key-sorted)."""
    return result.get("executors") or sorted(result["runs"], key=lambda name: name != "subprocess")


def render(result: dict, command: str) -> str:
    headers = ["executor", "jobs", "cells complete", "wall-clock (s)"] + [p[:-2].replace("_", " ") + " (s)" for p in PHASES]
    rows = []
    names = _executor_order(result)
    for name in names:
        run, t = result["runs"][name], result["runs"][name]["timing"]
        rows.append([name, run["jobs"] or 1, run["counts"]["complete"], f"{run['elapsed_s']:.0f}"]
                    + [f"{t.get(p, 0.0):.0f}" for p in PHASES])
    seeds = result.get("seeds")
    lines = [
        f"Matrix `{result['matrix']}` ({result['cells']} cells"
        + (f", seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}" if seeds else "") + f") run twice in one command: `{names[0]}` (one cell at a "
        f"time, a fresh process each) then `{names[1]}` (the default). Phase columns are summed over cells; idle is "
        "worker slots x wall-clock minus the cells' process time.", "",
        markdown_table(headers, rows), "",
        f"**{names[1]} / {names[0]} wall-clock: {result['ratio']:.2f}** (target: at most 0.40).",
        f"Metrics rows identical (timing columns aside) in {result['identical_cells']} of {result['cells']} cells"
        + ("." if not result["differing_cells"] else
           f"; they differ in {', '.join(result['differing_cells'][:6])}" + (" ..." if len(result["differing_cells"]) > 6 else "")
           + "."),
    ]
    accuracy = result.get("accuracy")
    if accuracy and accuracy["cells"]:
        threads = "; ".join(f"{a} vs {b}" for a, b in accuracy["threads"])
        lines += ["", f"Final accuracy per task, mean over its cells, under both (torch threads per cell, {names[0]} vs "
                  f"{names[1]}: {threads}); the seed spread is the standard deviation over seeds of each variant's "
                  f"final accuracy in `{accuracy['spread_from']}`, averaged over the task's variants:" if accuracy.get("spread_from")
                  else f"Final accuracy per task, mean over its cells, under both (torch threads per cell, {names[0]} vs "
                  f"{names[1]}: {threads}):", ""]
        rows = [[task, t["cells"], f"{t[names[0] + '_mean']:.3f}", f"{t[names[1] + '_mean']:.3f}", f"{t['max_abs_diff']:.3f}",
                 "" if t["mean_seed_std"] is None else f"{t['mean_seed_std']:.3f}"] for task, t in accuracy["tasks"].items()]
        lines += [markdown_table(["task", "cells", names[0], names[1], "largest cell difference", "seed spread"], rows), ""]
        verdict = f"Final accuracy equal in {accuracy['equal']} of {len(accuracy['cells'])} cells"
        if accuracy["differing_judged"]:
            verdict += (f"; of the {accuracy['differing_judged']} that differ, {accuracy['within_seed_std']} differ by no "
                        f"more than their variant's standard deviation over seeds, and {accuracy['within_seed_range']} "
                        "have both values inside their variant's range over seeds (min to max)")
            verdict += ": " + "; ".join(f"{c['cell']} {c[names[0]]:.3f} vs {c[names[1]]:.3f} (seeds {c['seeds']['min']:.3f} to "
                                        f"{c['seeds']['max']:.3f}, std {c['seeds']['std']:.3f})"
                                        for c in accuracy["cells"] if c[names[0]] != c[names[1]] and c["seeds"])
        lines.append(verdict + ".")
    lines += ["", f"Regenerate: `{command}`"]
    return "\n".join(lines) + "\n"


def run_bench_executors(matrix_file: str, out: str, jobs: int = 0, readme: Optional[str] = None,
                        seeds: Optional[Sequence[int]] = None, section: str = "executors",
                        spread_from: Optional[str] = None, rerender: bool = False) -> dict:
    """Run the comparison (or, with ``rerender``, re-read a finished one's executors.json and runs) and write
    its report; ``spread_from`` names a finished run of the same matrix whose seed spread judges differences."""
    out_dir = Path(out)
    if rerender:
        try:
            result = json.loads((out_dir / "executors.json").read_text())
        except (OSError, ValueError) as e:
            raise UsageError(f"--rerender needs a finished comparison in {out_dir}: {e}") from None
    else:
        result = compare_executors(matrix_file, out_dir / "runs", jobs=jobs, seeds=seeds)
    try:
        spread = seed_spread(Path(spread_from)) if spread_from else None
    except OSError as e:
        raise UsageError(f"--spread-from {spread_from}: {e}") from None
    for name, run in result["runs"].items():
        # A run recorded before sessions stored the resolved --jobs counted one slot: the cells' worker slots say
        # how many ran at once, and the idle time follows from them.
        slots = len({json.loads(p.read_text()).get("worker") for p in (out_dir / "runs" / name).glob("**/summary.json")})
        if slots > (run.get("jobs") or 1) and "process_s" in run["timing"]:
            run["jobs"] = slots
            run["timing"]["idle_s"] = max(0.0, slots * run["timing"]["elapsed_s"] - run["timing"]["process_s"])
    result["accuracy"] = {**compare_accuracy(out_dir / "runs", _executor_order(result), spread), "spread_from": spread_from}
    command = (f"grpo-bench bench executors {matrix_file} --out {out}" + (f" --jobs {jobs}" if jobs else "")
               + (f" --seeds {' '.join(map(str, seeds))}" if seeds else "")
               + (f" --spread-from {spread_from}" if spread_from else "")
               + (f" --readme {readme}" if readme else "") + (f" --section {section}" if section != "executors" else ""))
    body = render(result, command)
    atomic_write_json(out_dir / "executors.json", result)
    atomic_write_text(out_dir / "executors.md", "# Executors: one cell at a time vs the default\n\n" + body)
    print(body)
    if readme:
        from benchmarks.report.readme import update_section

        update_section(readme, section, "### Executors: one cell at a time vs warm workers in parallel\n\n" + body)
    return result
