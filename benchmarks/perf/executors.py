"""``grpo-bench bench executors FILE``: one matrix run in three arms, one after another in one command, which
separate what warm workers gain from what running cells side by side gains:

    fresh-1   ``--executor subprocess``: one cell at a time, a fresh process each (the baseline)
    fresh-N   ``--executor subprocess --jobs N``: N fresh processes at once, each cell on cores // N threads
    warm-N    ``--executor local --jobs N`` (the default executor): N warm workers, each cell on cores // N threads

warm-N / fresh-N is the warm start at equal parallelism, fresh-N / fresh-1 the gain from running N cells at
once. The report gives each arm's wall-clock and where it went (start-up, build, training, evaluation, idle
slots), those ratios on lines of their own, whether every cell's metrics rows are equal across arms (timing
columns aside), and every cell's final accuracy under each arm."""

from __future__ import annotations

import csv
import dataclasses
import itertools
import json
import statistics
import time
from pathlib import Path
from typing import Optional, Sequence

from benchmarks.errors import UsageError
from benchmarks.io import atomic_write_json, read_jsonl
from benchmarks.matrix import parse, run_matrix
from benchmarks.matrix.executors import make_executor
from benchmarks.matrix.timing import wallclock_breakdown
from benchmarks.markdown import markdown_table
from benchmarks.study import StudySettings, option, rerender_source

# The report's columns of a session's time (benchmarks.matrix.timing), in order.
TIMING_COLUMNS = ("startup_s", "build_s", "train_s", "eval_s", "reset_s", "other_s", "idle_s")


@dataclasses.dataclass(frozen=True)
class Arm:
    executor: str
    jobs: Optional[int]  # cells at once; None: the bench's N (--jobs)
    what: str  # as the report describes it, with N as {n}


# In the order they run and are shown.
ARMS = {
    "fresh-1": Arm("subprocess", 1, "one cell at a time, a fresh process each"),
    "fresh-N": Arm("subprocess", None, "{n} cells at once, a fresh process each, on cores // {n} torch threads"),
    "warm-N": Arm("local", None, "{n} cells at once in warm worker processes, on cores // {n} torch threads: the "
                                 "default executor"),
}
DEFAULT_JOBS = 2

# (faster arm, slower arm, what their wall-clock ratio measures, the ratio aimed at), each a paragraph of its own;
# the first is the report's headline (the README's index of reports quotes its first bold line).
GAINS = (
    ("warm-N", "fresh-N", "**Warm start at equal parallelism** ({n} cells at once)", None),
    ("fresh-N", "fresh-1", "**Parallelism** (fresh processes, {n} at once against one at a time)", None),
    ("warm-N", "fresh-1", "**Both together** (the default against the baseline)", 0.40),
)


def _rows_without_timing(path: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in read_jsonl(path)]


def compare_executors(matrix_file: str, out: Path, *, jobs: int = DEFAULT_JOBS, arms: Sequence[str] = tuple(ARMS),
                      seeds: Optional[Sequence[int]] = None) -> dict:
    """Run the matrix's cells (of ``seeds`` only, if given) under each of ``arms`` into ``out/ARM``."""
    if jobs < 2:
        raise UsageError(f"--jobs must be >= 2 (the cells at once of the fresh-N and warm-N arms), got {jobs}")
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        raise UsageError(f"unknown arm {', '.join(unknown)}; choose from {', '.join(ARMS)}")
    arms = [arm for arm in ARMS if arm in arms]
    plan = parse(matrix_file)
    if seeds:  # the matrix's cells of these seeds only, so that every arm's run of a large matrix fits a session
        missing = sorted(set(seeds) - {c.seed for c in plan.cells})
        if missing:
            raise UsageError(f"--seeds {' '.join(map(str, missing))}: not among the seeds of {matrix_file}")
        plan = dataclasses.replace(plan, cells=[c for c in plan.cells if c.seed in seeds])
    runs = {}
    for arm in arms:
        executor, cells_at_once = ARMS[arm].executor, ARMS[arm].jobs or jobs
        start = time.perf_counter()
        counts = run_matrix(plan, out / arm, overwrite=True, progress=True,
                            executor=make_executor(executor, jobs=cells_at_once))
        elapsed = time.perf_counter() - start
        breakdown = wallclock_breakdown(out / arm)
        session = breakdown["sessions"][-1] if breakdown["sessions"] else {}
        runs[arm] = {"executor": executor, "jobs": session.get("jobs") or cells_at_once, "elapsed_s": elapsed,
                     "counts": counts, "timing": breakdown["total"]}
    identical = []
    for a, b in itertools.combinations(arms, 2):
        differing = [c.relpath for c in plan.cells if _rows_without_timing(out / a / c.relpath / "metrics.jsonl")
                     != _rows_without_timing(out / b / c.relpath / "metrics.jsonl")]
        identical.append({"arms": [a, b], "identical_cells": len(plan.cells) - len(differing),
                          "differing_cells": differing})
    return {"matrix": matrix_file, "seeds": sorted({c.seed for c in plan.cells}),
            "selected_seeds": list(seeds) if seeds else None, "cells": len(plan.cells), "jobs": jobs, "arms": arms,
            "runs": runs, "identical": identical}


def seed_spread(matrix_dir: Path) -> dict[str, dict[str, float]]:
    """Each task/variant's final accuracy over seeds in a finished matrix's cells.csv: standard deviation, min, max."""
    by_variant: dict[str, list[float]] = {}
    with open(Path(matrix_dir) / "tables" / "cells.csv", newline="") as f:
        for row in csv.DictReader(f):
            if row.get("accuracy_after"):
                by_variant.setdefault(row["dir"].rsplit("/", 1)[0], []).append(float(row["accuracy_after"]))
    return {key: {"std": statistics.stdev(values), "min": min(values), "max": max(values)}
            for key, values in by_variant.items() if len(values) > 1}


def compare_accuracy(out: Path, arms: Sequence[str], spread: Optional[dict[str, dict[str, float]]] = None) -> dict:
    """Every cell's final accuracy under each arm, their threads per cell, and (given the seed spread of another
    run of the same matrix) whether a difference between the arms is within that spread."""
    cells = []
    for summary_path in sorted((out / arms[0]).glob("**/summary.json")):
        relpath = str(summary_path.parent.relative_to(out / arms[0]))
        paths = [out / arm / relpath / "summary.json" for arm in arms]
        if not all(p.exists() for p in paths):
            continue
        summaries = [json.loads(p.read_text()) for p in paths]
        accuracy = [s.get("accuracy_after") for s in summaries]
        if None in accuracy:
            continue
        cells.append({"cell": relpath, "task": relpath.split("/", 1)[0], "accuracy": dict(zip(arms, accuracy)),
                      "difference": max(accuracy) - min(accuracy), "threads": [s.get("threads") for s in summaries],
                      "seeds": (spread or {}).get(relpath.rsplit("/", 1)[0])})
    tasks: dict[str, list[dict]] = {}
    for cell in cells:
        tasks.setdefault(cell["task"], []).append(cell)
    judged = [c for c in cells if c["difference"] and c["seeds"] is not None]
    return {"cells": cells, "equal": sum(not c["difference"] for c in cells), "differing_judged": len(judged),
            "within_seed_std": sum(c["difference"] <= c["seeds"]["std"] for c in judged),
            "within_seed_range": sum(c["seeds"]["min"] <= min(c["accuracy"].values())
                                     and max(c["accuracy"].values()) <= c["seeds"]["max"] for c in judged),
            "threads": sorted({tuple(c["threads"]) for c in cells}),
            "tasks": {task: {"cells": len(group),
                             "mean": {arm: statistics.fmean(c["accuracy"][arm] for c in group) for arm in arms},
                             "max_abs_diff": max(c["difference"] for c in group),
                             "mean_seed_std": statistics.fmean(c["seeds"]["std"] for c in group if c["seeds"])
                             if any(c["seeds"] for c in group) else None}
                      for task, group in tasks.items()}}


def _ratio(result: dict, fast: str, slow: str) -> Optional[float]:
    runs = result["runs"]
    if fast not in runs or slow not in runs or not runs[slow]["elapsed_s"]:
        return None
    return runs[fast]["elapsed_s"] / runs[slow]["elapsed_s"]


def gain_lines(result: dict) -> list[str]:
    """A line per pair of arms run: their wall-clock ratio and what it measures."""
    lines = []
    for fast, slow, what, target in GAINS:
        ratio = _ratio(result, fast, slow)
        if ratio is None:
            continue
        line = f"{what.format(n=result['jobs'])}: {fast} / {slow} wall-clock **{ratio:.2f}**"
        if target is not None:
            line += f" (target: at most {target:.2f})"
        lines.append(line + (f", {1 / ratio:.2f}x as fast." if ratio else "."))  # 0: the faster arm ran nothing
    return lines


def _versus(values) -> str:
    return " vs ".join(f"{v:.3f}" for v in values)


def _cells_text(cells: list[str]) -> str:
    return ", ".join(cells[:6]) + (" ..." if len(cells) > 6 else "")


def render(result: dict, command: str) -> str:
    arms, runs, n = result["arms"], result["runs"], result["jobs"]
    headers = (["arm", "executor", "jobs", "cells complete", "wall-clock (s)"]
               + [p[:-2].replace("_", " ") + " (s)" for p in TIMING_COLUMNS])
    rows = [[arm, runs[arm]["executor"], runs[arm]["jobs"], runs[arm]["counts"]["complete"], f"{runs[arm]['elapsed_s']:.0f}"]
            + [f"{runs[arm]['timing'].get(p, 0.0):.0f}" for p in TIMING_COLUMNS] for arm in arms]
    seeds = result["seeds"]
    paragraphs = [
        f"Matrix `{result['matrix']}` ({result['cells']} cells"
        + (f", seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}" if seeds else "")
        + f") run in {len(arms)} arm{'s' if len(arms) > 1 else ''}, one after another in one command: "
        + "; ".join(f"`{arm}` ({ARMS[arm].what.format(n=n)})" for arm in arms)
        + ". A cell whose matrix names its num_cpus runs on that many threads instead. Phase columns are summed "
        "over cells; idle is worker slots x wall-clock minus the cells' process time.",
        markdown_table(headers, rows),
        *gain_lines(result),
    ]
    if result["identical"]:
        paragraphs.append(f"Metrics rows identical (timing columns aside), of {result['cells']} cells: " + "; ".join(
            f"{' and '.join(pair['arms'])} in {pair['identical_cells']}"
            + (f" (they differ in {_cells_text(pair['differing_cells'])})" if pair["differing_cells"] else "")
            for pair in result["identical"]) + ".")
    accuracy = result.get("accuracy")
    if accuracy and accuracy["cells"]:
        threads = "; ".join(" vs ".join(map(str, t)) for t in accuracy["threads"])
        intro = (f"Final accuracy per task, mean over its cells, under each arm (torch threads per cell, "
                 f"{' vs '.join(arms)}: {threads})")
        if accuracy.get("spread_from"):
            intro += ("; the seed spread is the standard deviation over seeds of each variant's final accuracy in "
                      f"`{accuracy['spread_from']}`, averaged over the task's variants")
        rows = [[task, t["cells"], *(f"{t['mean'][arm]:.3f}" for arm in arms), f"{t['max_abs_diff']:.3f}",
                 "" if t["mean_seed_std"] is None else f"{t['mean_seed_std']:.3f}"] for task, t in accuracy["tasks"].items()]
        verdict = f"Final accuracy equal under every arm in {accuracy['equal']} of {len(accuracy['cells'])} cells"
        if accuracy["differing_judged"]:
            verdict += (f"; of the {accuracy['differing_judged']} that differ, {accuracy['within_seed_std']} differ by no "
                        f"more than their variant's standard deviation over seeds, and {accuracy['within_seed_range']} "
                        "have every value inside their variant's range over seeds (min to max): ")
            verdict += "; ".join(f"{c['cell']} {_versus(c['accuracy'].values())} (seeds {c['seeds']['min']:.3f} to "
                                 f"{c['seeds']['max']:.3f}, std {c['seeds']['std']:.3f})"
                                 for c in accuracy["cells"] if c["difference"] and c["seeds"])
        paragraphs += [intro + ":", markdown_table(["task", "cells", *arms, "largest cell difference", "seed spread"], rows),
                       verdict + "."]
    paragraphs.append(f"Regenerate: `{command}`")
    return "\n\n".join(p for p in paragraphs if p) + "\n"


def report_command(result: dict, settings: ExecutorsSettings) -> str:
    """The command that runs this comparison again, as the report quotes it (paths as they were typed)."""
    s = settings
    return (f"grpo-bench bench executors {result['matrix']} --out {s.out}"
            + (f" --jobs {result['jobs']}" if result["jobs"] != DEFAULT_JOBS else "")
            + (f" --arms {' '.join(result['arms'])}" if result["arms"] != list(ARMS) else "")
            + (f" --seeds {' '.join(map(str, result['selected_seeds']))}" if result["selected_seeds"] else "")
            + (f" --spread-from {s.spread_from}" if s.spread_from else "")
            + (f" --readme {s.readme}" if s.readme else "") + (f" --section {s.section}" if s.section != "executors" else ""))


@dataclasses.dataclass
class ExecutorsSettings(StudySettings):
    """What ``grpo-bench bench executors`` asks for."""

    file: str = dataclasses.field(metadata={"help": "matrix file (TOML), e.g. benchmarks/matrices/scaleout.toml"})
    out: str = option("out", "results/executors")  # executors.md/json and every arm's run
    jobs: int = dataclasses.field(default=DEFAULT_JOBS, metadata={
        "help": "N: cells at once in the fresh-N and warm-N arms, each on cores // N torch threads"})
    arms: list[str] = dataclasses.field(default_factory=lambda: list(ARMS), metadata={
        "help": "the arms to run: " + "; ".join(f"{name}: {arm.what.format(n='N')}" for name, arm in ARMS.items()),
        "choices": list(ARMS)})
    seeds: Optional[list[int]] = dataclasses.field(default=None, metadata={
        "help": "run only the matrix's cells of these seeds (default: every seed)", "values": "seed"})
    spread_from: Optional[str] = dataclasses.field(default=None, metadata={
        "help": "a finished run of the same matrix (e.g. results/cpu): a cell whose accuracy differs between the arms "
                "is judged against its variant's standard deviation over seeds there (default: none)", "metavar": "DIR"})
    rerender: bool = option("rerender")
    readme: Optional[str] = option("readme", shown="none")
    section: str = option("section", "executors")


def stored_comparison(path: Path) -> dict:
    """A finished comparison's json, as --rerender reads it (one UsageError line for none, or for one from before
    the fresh-N arm)."""
    result = rerender_source(path, "comparison")
    if "arms" not in result:
        raise UsageError(f"--rerender: {path} is from before the comparison had its fresh-N arm; run it again")
    return result


def judge_accuracy(result: dict, settings: ExecutorsSettings, path: Path) -> None:
    """The accuracy under each arm, read from OUT/runs and judged against ``spread_from``'s seed spread (a finished
    run of the same matrix), added to ``result``, which is then written to ``path`` (executors.json)."""
    s = settings
    try:
        spread = seed_spread(Path(s.spread_from)) if s.spread_from else None
    except OSError as e:
        raise UsageError(f"--spread-from {s.spread_from}: {e}") from None
    result["accuracy"] = {**compare_accuracy(Path(s.out) / "runs", result["arms"], spread), "spread_from": s.spread_from}
    atomic_write_json(path, result)
