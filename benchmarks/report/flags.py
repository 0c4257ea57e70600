"""What a matrix's numbers rest on that its verdicts do not say: the confounds and the provenance its report flags.

Read from the result store's cells and matrix.json alone, each flag is one function returning plain data:

    code_versions     which commits each variant's cells ran at, cells at a commit this repository's history lacks,
                      cells run with uncommitted changes, and a task whose variants ran at different code
    update_counts     optimizer updates per cell (steps taken x mu x epochs x minibatches) that differ across the
                      variants at equal completions: a ranking may follow the update count, not the algorithm
    mixed_hosts       cells of one task on different machines (CPU model and its kernel capability, or GPU), across
                      variants or between the tuning and the evaluation cells: bf16 products round differently
    identical_pairs   variants whose cells are bit-identical on every shared seed: identical runs, not a comparison
    grid_edges        tuning choices at an edge of their grid: a better setting may lie beyond it, untried
    tuning_reliability  how often a rerun of the tuning stage would pick the same point, from the tuning cells' spread

``find`` runs them all and ``render`` writes the lines of those that fire (the matrix report's "Flags" section);
``history_lines`` are the code versions' lines alone (commits, code outside the history, uncommitted changes), which
a matrix report keeps with its provenance at its end, its Flags section (``render(..., history=False)``) keeping
what bears on a comparison.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from itertools import combinations
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import pandas as pd
from scipy import stats

from benchmarks.errors import UsageError
from benchmarks.git import git
from benchmarks.report.tuning_stage import finished_scores
from benchmarks.store import ResultStore

# The checkout whose history the cells' commits are looked up in: the suite that reports them.
REPO = Path(__file__).resolve().parents[2]
# Two variants bit-identical on at least this share of their shared seeds are flagged (every seed: not a comparison).
MOSTLY_IDENTICAL = 0.5
# A rerun of the tuning that picks the same point less often than this is flagged.
RELIABLE = 0.9
RERUNS, RERUN_SEED = 20_000, 0
# The settings whose product with the steps taken is a cell's optimizer updates (each 1 where an algorithm has none).
UPDATES_PER_STEP = ("mu", "epochs", "minibatches")
# Columns of the steps frame that name a cell rather than measure it, and measurements of time, which differ between
# two runs of the same computation.
_CELL_KEYS = ("task", "variant", "algo", "seed")
_HEX = re.compile(r"[0-9a-f]{4,40}")


def _timing(column: str) -> bool:
    return column.startswith("time/") or column.endswith(("_seconds", "_s"))


# ------------------------------------------------------------------------------------------------
# The cells
# ------------------------------------------------------------------------------------------------


def cell_records(meta: Optional[dict], store: ResultStore) -> list[dict]:
    """One record per complete cell the store holds as the matrix plans it, evaluation and tuning cells both (all
    the store's cells where there is no matrix.json; those under tune/ as tuning): its stage, task, variant, seed,
    budget and completions, its optimizer updates, its code (commit, dirty, diff_hash) and its host."""
    meta = meta or {}
    planned = [("evaluation", c) for c in meta.get("cells") or []]
    planned += [("tuning", c) for c in (meta.get("tuning") or {}).get("cells") or []]
    if not meta:
        planned = [("tuning" if k.startswith("tune/") else "evaluation", {"dir": k, **v["spec"]})
                   for k, v in store.cells.items()]
    records = []
    for stage, spec in planned:
        if not store.holds(spec):
            continue
        entry = store.cells[spec["dir"]]
        summary = entry["summary"]
        if summary.get("status") != "complete":
            continue
        records.append({"cell": spec["dir"], "stage": stage, "task": spec.get("task_label", spec.get("task")),
                        "variant": spec.get("variant"), "seed": spec.get("seed"), "budget": spec.get("budget"),
                        "completions": summary.get("completions_generated"), "updates": _updates(spec, summary),
                        **_code(entry), **_host(summary)})
    return records


def _environment(summary: dict) -> dict:
    return (summary.get("config") or {}).get("environment") or {}


def _code(entry: dict) -> dict:
    """A cell's code: its commit (None: not recorded), whether it ran with uncommitted changes (None: not known, as
    for a copy run from $GRPO_BENCH_REVISION) and a hash of those changes where recorded. A store's own per-cell
    ``dirty`` and ``diff_hash`` win over what the summary's environment recorded."""
    code = _environment(entry["summary"]).get("code") or {}
    dirty = entry["dirty"] if entry.get("dirty") is not None else code.get("dirty")
    return {"commit": code.get("commit"), "dirty": None if dirty is None else bool(dirty),
            "diff_hash": entry.get("diff_hash") or code.get("diff_hash")}


def _host(summary: dict) -> dict:
    """A cell's machine as it changes rounding: the CPU model and the vector capability torch dispatched to (and
    the CPU's bf16 instructions, where recorded), or the GPU; and the cell's precision."""
    env = _environment(summary)
    device = str(env.get("device") or summary.get("device") or "")
    name = env.get("device_name") or summary.get("device_name") or "not recorded"
    parts = [str(name)]
    if not device.startswith("cuda"):
        capability = (env.get("rounding") or {}).get("cpu_capability")
        parts += [str(capability)] if capability else []
        bf16 = env.get("cpu_bf16")  # its bf16 instructions (AMX-BF16, AVX512-BF16), where the harness records them
        parts += [f"bf16 {bf16}"] if bf16 else []
    return {"host": ", ".join(parts), "precision": summary.get("precision")}


def _updates(spec: dict, summary: dict) -> Optional[int]:
    """Optimizer updates of the policy: the steps the cell took times its updates per step."""
    steps = summary.get("steps", spec.get("steps"))
    if not isinstance(steps, (int, float)):
        return None
    settings = spec.get("settings") or ((summary.get("config") or {}).get("algo_config")) or {}
    per_step = math.prod(int(settings.get(name) or 1) for name in UPDATES_PER_STEP)
    return int(steps) * per_step


# ------------------------------------------------------------------------------------------------
# 1. Code versions
# ------------------------------------------------------------------------------------------------


def commits_in_history(commits, repo: Path | str = REPO) -> Optional[dict[str, bool]]:
    """{commit: whether ``repo``'s git history holds it}; None where ``repo`` is no git checkout (not known)."""
    try:
        git(str(repo), "rev-parse", "--git-dir")
    except UsageError:
        return None
    found = {}
    for commit in commits:
        if not isinstance(commit, str) or not _HEX.fullmatch(commit):
            found[commit] = False
            continue
        try:
            git(str(repo), "cat-file", "-e", f"{commit}^{{commit}}")
            found[commit] = True
        except UsageError:
            found[commit] = False
    return found


def code_label(record: dict) -> str:
    """A cell's code in short: its commit's first 7 characters, '+changes' (and their hash) where it ran with
    uncommitted changes, 'not recorded' without a commit."""
    if not record["commit"]:
        return "not recorded"
    label = str(record["commit"])[:7]
    if record["dirty"]:
        label += "+changes" + (f" {str(record['diff_hash'])[:7]}" if record.get("diff_hash") else "")
    return label


def code_versions(records: list[dict], in_history: Optional[Callable] = commits_in_history) -> dict:
    """The code every cell ran: ``cells`` and ``tuning_cells`` (how many of them are tuning cells), ``commits``
    {commit: cells} over every cell (tuning ones included), ``not_recorded``
    (cells without a commit), ``not_in_history`` {commit: cells} (None where the history cannot be read),
    ``dirty`` and ``dirty_unknown`` (cells with uncommitted changes, and with a commit but no word on changes), and
    ``comparisons``: per task whose evaluation cells ran at more than one code, each variant's {code: cells}."""
    commits = Counter(r["commit"] for r in records if r["commit"])
    known = in_history(list(commits)) if in_history else None
    comparisons = []
    for task, mine in _by_task([r for r in records if r["stage"] == "evaluation"]).items():
        variants: dict[str, Counter] = {}
        for r in mine:
            variants.setdefault(r["variant"], Counter())[code_label(r)] += 1
        codes = set().union(*variants.values())
        if len(codes) > 1:
            comparisons.append({"task": task, "codes": len(codes),
                                "variants": {v: dict(c) for v, c in variants.items()}})
    return {"cells": len(records), "tuning_cells": sum(1 for r in records if r["stage"] == "tuning"),
            "commits": dict(commits), "not_recorded": sum(1 for r in records if not r["commit"]),
            "not_in_history": None if known is None else {c: n for c, n in commits.items() if not known.get(c)},
            "dirty": sum(1 for r in records if r["dirty"]),
            "dirty_unknown": sum(1 for r in records if r["commit"] and r["dirty"] is None),
            "comparisons": comparisons}


def _by_task(records: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in records:
        out.setdefault(r["task"], []).append(r)
    return out


# ------------------------------------------------------------------------------------------------
# 2. Optimizer updates at equal completions
# ------------------------------------------------------------------------------------------------


def update_counts(records: list[dict], scores: Optional[dict] = None) -> list[dict]:
    """Per task and budget whose variants' evaluation cells take different numbers of optimizer updates for the same
    completions: each variant's (fewest, most) updates per cell, and, given ``scores`` {(task, variant): the
    variant's mean primary metric} over 3 or more variants, the Spearman correlation of its median updates with
    its score (``spearman``, None otherwise): near +1, the ranking follows the update count."""
    out = []
    for task, mine in _by_task([r for r in records if r["stage"] == "evaluation" and r["updates"]]).items():
        budgets = sorted({r["budget"] for r in mine}, key=lambda b: (b is None, b))
        for budget in budgets:
            counts: dict[str, list[int]] = {}
            for r in mine:
                if r["budget"] == budget:
                    counts.setdefault(r["variant"], []).append(r["updates"])
            medians = {v: float(np.median(c)) for v, c in counts.items()}
            if len(set(medians.values())) < 2:
                continue
            rho = None
            scored = [v for v in counts if not _missing((scores or {}).get((task, v)))]
            xs, ys = [medians[v] for v in scored], [scores[(task, v)] for v in scored]
            if len(scored) >= 3 and len(set(xs)) > 1 and len(set(ys)) > 1:  # a constant side has no ranks to compare
                rho = float(stats.spearmanr(xs, ys)[0])
            out.append({"task": task, "budget": budget, "spearman": rho,
                        "variants": {v: (min(c), max(c)) for v, c in counts.items()}})
    return out


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


# ------------------------------------------------------------------------------------------------
# 3. Hosts
# ------------------------------------------------------------------------------------------------


def mixed_hosts(records: list[dict]) -> list[dict]:
    """Per task whose cells ran on more than one host: ``evaluation`` {host: {variant: cells}}, ``tuning`` {host:
    cells} and the precisions they ran in, where the evaluation cells span hosts, the tuning cells do (their grid
    points then compared across machines), or the tuning cells ran on hosts the evaluation cells did not (or the
    other way round)."""
    out = []
    for task, mine in _by_task(records).items():
        evaluation: dict[str, Counter] = {}
        tuning: Counter = Counter()
        for r in mine:
            if r["stage"] == "evaluation":
                evaluation.setdefault(r["host"], Counter())[r["variant"]] += 1
            else:
                tuning[r["host"]] += 1
        across_stages = bool(tuning) and bool(evaluation) and set(tuning) != set(evaluation)
        if len(evaluation) > 1 or len(tuning) > 1 or across_stages:
            out.append({"task": task, "evaluation": {h: dict(v) for h, v in evaluation.items()}, "tuning": dict(tuning),
                        "across_stages": across_stages,
                        "precisions": sorted({str(r["precision"]) for r in mine if r["precision"]})})
    return out


# ------------------------------------------------------------------------------------------------
# 4. Bit-identical variants
# ------------------------------------------------------------------------------------------------


def identical_pairs(steps: pd.DataFrame, *, least: float = 1.0) -> list[dict]:
    """Pairs of variants of a task whose cells logged bit-identical training (every step's every metric but its
    timings, NaN equal to NaN) on every seed both ran: identical runs, not a comparison. ``steps``: the report's
    steps frame (``collect``'s "steps": task, variant, seed, step and one column per metric). One dict per pair:
    task, first, second (in the frame's order), seeds (how many they share) and identical (on how many of those the
    two are bit-identical). ``least`` < 1 also lists the pairs identical on at least that share of their shared
    seeds (a seed may differ because its cells ran at different code)."""
    if steps is None or steps.empty or not {"task", "variant", "seed", "step"} <= set(steps.columns):
        return []
    measured = [c for c in steps.columns if c not in _CELL_KEYS and not _timing(str(c))]
    prints: dict[str, dict[str, dict]] = {}
    for (task, variant, seed), cell in steps.groupby(["task", "variant", "seed"], sort=False):
        cell = cell.sort_values("step")[measured].reset_index(drop=True)
        digest = hashlib.sha256(pd.util.hash_pandas_object(cell, index=False).to_numpy().tobytes())
        digest.update(str(len(cell)).encode())
        prints.setdefault(task, {}).setdefault(variant, {})[seed] = digest.hexdigest()
    out = []
    for task, variants in prints.items():
        for first, second in combinations(variants, 2):
            shared = set(variants[first]) & set(variants[second])
            same = sum(variants[first][s] == variants[second][s] for s in shared)
            if shared and same and same >= least * len(shared):
                out.append({"task": task, "first": first, "second": second, "seeds": len(shared), "identical": same})
    return out


# ------------------------------------------------------------------------------------------------
# 5. Tuning: grid edges and reliability
# ------------------------------------------------------------------------------------------------


def grid_edges(meta: Optional[dict]) -> list[dict]:
    """Per task with tuning: how many variants were tuned (``groups``) and those whose chosen point sits at an edge
    of its grid: each setting (of several numeric values on the grid) at the grid's smallest or largest."""
    out: dict[str, dict] = {}
    for group in ((meta or {}).get("tuning") or {}).get("table") or []:
        task = out.setdefault(group["task"], {"task": group["task"], "groups": 0, "at_edge": []})
        task["groups"] += 1
        points = group["points"]
        chosen = points[group["chosen"]].get("settings") or {}
        edges = []
        for name, value in chosen.items():
            values = {p.get("settings", {}).get(name) for p in points}
            if len(values) < 2 or not all(isinstance(v, (int, float)) for v in values):
                continue
            if value in (min(values), max(values)):
                side = "smallest" if value == min(values) else "largest"
                edges.append({"setting": name, "value": value, "side": side})
        if edges:
            task["at_edge"].append({"variant": group["variant"], "point": points[group["chosen"]]["point"],
                                    "edges": edges})
    return list(out.values())


def tuning_reliability(meta: Optional[dict], store: ResultStore, *, reruns: int = RERUNS,
                       seed: int = RERUN_SEED) -> list[dict]:
    """Per tuned variant, the probability that a rerun of its tuning (fresh tuning seeds, as many) picks the point it
    chose: each usable grid point's mean score redrawn from a normal with its tuning seeds' mean and sd / sqrt(seeds)
    (a parametric rerun), the highest draw picked as the choice picks (the first of equal scores; a point with a
    failed seed never). ``probability`` None where a competing point has fewer than 2 seeds (no spread to draw
    from). Scores are those the choice ranked by (the primary metric; AUC for a matrix chosen by it)."""
    table = ((meta or {}).get("tuning") or {}).get("table") or []
    if not table:
        return []
    finished = finished_scores(meta, store)
    rng = np.random.default_rng(seed)
    out = []
    for group in table:
        points = group["points"]
        usable = [i for i, p in enumerate(points) if p.get("failed", 0) == 0 and p.get("seeds", 0) > 0]
        if group["chosen"] not in usable:
            continue
        by_auc = not points[group["chosen"]].get("primary_metric")
        values = [[finished[c][1 if by_auc else 0] for c in points[i].get("cells", []) if c in finished]
                  for i in usable]
        values = [[v for v in vs if not math.isnan(v)] for vs in values]
        row = {"task": group["task"], "variant": group["variant"], "chosen": points[group["chosen"]]["point"],
               "points": len(usable), "probability": None}
        if any(len(vs) < 2 for vs in values):
            out.append(row)
            continue
        means = np.array([np.mean(vs) for vs in values])
        errors = np.array([np.std(vs, ddof=1) / math.sqrt(len(vs)) for vs in values])
        draws = rng.normal(means, errors, size=(reruns, len(usable)))
        row["probability"] = float(np.mean(np.argmax(draws, axis=1) == usable.index(group["chosen"])))
        out.append(row)
    return out


# ------------------------------------------------------------------------------------------------
# All of them, and the lines
# ------------------------------------------------------------------------------------------------


def find(meta: Optional[dict], store: ResultStore, steps: Optional[pd.DataFrame] = None, *,
         scores: Optional[dict] = None, in_history: Optional[Callable] = commits_in_history) -> dict:
    """Every flag's data for one matrix: its matrix.json, its store, its steps frame (``collect``'s; no identical
    pairs without it) and the variants' mean primary metric per task (``update_counts``' scores)."""
    records = cell_records(meta, store)
    return {"code": code_versions(records, in_history), "updates": update_counts(records, scores),
            "hosts": mixed_hosts(records),
            "identical": identical_pairs(steps if steps is not None else pd.DataFrame(), least=MOSTLY_IDENTICAL),
            "grid_edges": grid_edges(meta), "reliability": tuning_reliability(meta, store)}


def lines(found: dict, *, history: bool = True) -> list[str]:
    """One line per flag that fires, with its numbers; none where none does. ``history=False``: without
    ``history_lines``."""
    out = (_history_lines(found["code"]) if history else []) + _comparison_lines(found["code"])
    for u in found["updates"]:
        counts = ", ".join(f"`{v}` {_span(c)}" for v, c in sorted(u["variants"].items(), key=lambda kv: kv[1]))
        rho = ("" if u["spearman"] is None else
               f"; Spearman of the primary metric with the update count {u['spearman']:+.2f}")
        at = f"{u['budget']:,.0f} completions" if isinstance(u["budget"], (int, float)) else "equal completions"
        out.append(f"Optimizer updates per cell differ at {at} on {u['task']}: {counts}{rho}.")
    for h in found["hosts"]:
        out.append(_host_line(h))
    for p in found["identical"]:
        if p["identical"] == p["seeds"]:
            out.append(f"Identical runs, not a comparison: `{p['first']}` and `{p['second']}` on {p['task']} are "
                       f"bit-identical on all {p['seeds']} shared seed(s).")
        else:
            out.append(f"Mostly identical runs: `{p['first']}` and `{p['second']}` on {p['task']} are bit-identical "
                       f"on {p['identical']} of their {p['seeds']} shared seeds.")
    for e in found["grid_edges"]:
        if e["at_edge"]:
            chosen = "; ".join(f"`{a['variant']}` " + ", ".join(f"{x['setting']} {x['value']:g} ({x['side']})"
                                                               for x in a["edges"]) for a in e["at_edge"])
            out.append(f"Tuning at a grid edge on {e['task']}: {len(e['at_edge'])} of {e['groups']} variants "
                       f"({chosen}).")
    out += _reliability_lines(found["reliability"])
    return out


def history_lines(found: dict) -> list[str]:
    """The code versions' lines: the commits the cells ran at, those this repository's history lacks, and cells run
    with uncommitted changes."""
    return _history_lines(found["code"])


def render(found: dict, *, history: bool = True) -> str:
    """The "Flags" section of a matrix's report (``history=False``: without ``history_lines``)."""
    found_lines = lines(found, history=history)
    body = [f"- {line}" for line in found_lines] if found_lines else ["None."]
    what = ("code versions, optimizer updates, hosts, identical runs and the tuning's choices" if history else
            "optimizer updates, hosts, identical runs, the tuning's choices and variants run at different code")
    return "\n".join(["#### Flags", "", f"What the numbers rest on that the verdicts do not say: {what}.", ""]
                     + body) + "\n"


def _span(pair) -> str:
    low, high = pair
    return f"{low:,}" if low == high else f"{low:,}-{high:,}"


def _history_lines(code: dict) -> list[str]:
    out = []
    if len(code["commits"]) > 1:
        tuning = f" ({code['tuning_cells']} tuning cells included)" if code.get("tuning_cells") else ""
        out.append(f"Code versions: {sum(code['commits'].values())} cells{tuning} ran at "
                   f"{len(code['commits'])} commits ({_counts(code['commits'], 7)}).")
    outside = code["not_in_history"] or {}
    if outside:
        cells = sum(outside.values())
        out.append(f"Code not in this repository's history: {cells} of {code['cells']} cells ran at "
                   f"{len(outside)} of their {len(code['commits'])} commits that it lacks ({_counts(outside, 7)}).")
    if code["dirty"]:
        out.append(f"Uncommitted changes: {code['dirty']} of {code['cells']} cells ran with changes no commit holds.")
    return out


def _comparison_lines(code: dict) -> list[str]:
    out = []
    for c in code["comparisons"]:
        each = "; ".join(f"`{v}` {_counts(codes)}" for v, codes in c["variants"].items())
        what = "Variants" if len(c["variants"]) > 1 else "Cells"  # one variant: its seeds or replicates compared
        out.append(f"{what} at different code on {c['task']} ({c['codes']} versions): {each}.")
    return out


def _counts(counts: dict, width: int = 0, most: int = 3) -> str:
    """'abc1234 x5, def5678 x3 and 2 more (4 cells)': the most frequent few of {name: cells}."""
    ranked = _most_first(counts)
    shown = ", ".join(f"{str(k)[:width] if width else k} x{n}" for k, n in ranked[:most])
    rest = ranked[most:]
    return shown + (f" and {len(rest)} more ({sum(n for _, n in rest)} cells)" if rest else "")


def _most_first(counts: dict) -> list[tuple]:
    return sorted(counts.items(), key=lambda kv: (-kv[1], str(kv[0])))


def _host_line(h: dict) -> str:
    precision = f" ({', '.join(h['precisions'])})" if h["precisions"] else ""
    parts = []
    if h["tuning"]:
        parts.append("tuning cells on " + "; ".join(f"{host} x{n}" for host, n in _most_first(h["tuning"])))
    evaluation = [f"{host} x{sum(v.values())}" + (f" ({_counts(v)})" if len(h["evaluation"]) > 1 else "")
                  for host, v in sorted(h["evaluation"].items(), key=lambda kv: -sum(kv[1].values()))]
    if evaluation:
        parts.append("evaluation cells on " + "; ".join(evaluation))
    return f"Mixed hosts on {h['task']}{precision}: " + "; ".join(parts) + "."


def _reliability_lines(rows: list[dict]) -> list[str]:
    out = []
    for task in dict.fromkeys(r["task"] for r in rows):
        mine = [r for r in rows if r["task"] == task and r["probability"] is not None]
        low = [r for r in mine if r["probability"] < RELIABLE]
        if not low:
            continue
        low_p, high_p = min(r["probability"] for r in mine), max(r["probability"] for r in mine)
        spread = f"{low_p:.2f}" if f"{low_p:.2f}" == f"{high_p:.2f}" else f"{low_p:.2f} to {high_p:.2f}"
        each = ", ".join(f"`{r['variant']}` {r['probability']:.2f}"
                         for r in sorted(low, key=lambda r: r["probability"]))
        out.append(f"Tuning reliability on {task}: a rerun of the tuning picks the same point with probability "
                   f"{spread}; under {RELIABLE:.2f} for {len(low)} of "
                   f"{len(mine)} variants ({each}).")
    return out
