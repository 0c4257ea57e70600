"""The report of a matrix still in its tuning stage: each variant's grid so far, on the validation questions.

A matrix with ``[tuning]`` has no evaluation cells until every tuning cell is in and each variant's grid point
is chosen (benchmarks/matrix/tuning.py). Until then ``grpo-bench report`` shows what the tuning cells measured:
per variant and grid point, the tuning seeds finished, their mean primary metric (the score the choice will
rank by) and final accuracy, the completions each cell generated (the budget every variant gets) and its
training time. It names no choice: a point chosen on a partial grid could change when the rest arrives.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from benchmarks.curve import PRIMARY_DEFAULT, cell_scores
from benchmarks.markdown import markdown_table
from benchmarks.store import ResultStore


def in_tuning_stage(meta: Optional[dict]) -> bool:
    """matrix.json of a matrix whose tuning cells are planned and whose evaluation cells are not yet."""
    return bool(((meta or {}).get("tuning") or {}).get("cells")) and not (meta or {}).get("cells")


def finished_scores(meta: dict, store: ResultStore) -> dict[str, tuple[float, float, float]]:
    """{tuning cell: its (primary metric, AUC, final accuracy)} for each planned tuning cell the store holds as that
    cell and complete, scored as the choice scores it (``cell_scores`` on the matrix's primary metric)."""
    primary = (meta.get("analysis") or {}).get("primary") or PRIMARY_DEFAULT
    scores = {}
    for spec in (meta.get("tuning") or {}).get("cells") or []:
        summary = store.summary(spec["dir"]) if store.holds(spec) else None
        if summary is not None and summary.get("status") == "complete":
            scores[spec["dir"]] = cell_scores(summary, store.metrics(spec["dir"]), primary, spec["budget"])
    return scores


def progress_rows(meta: dict, store: ResultStore) -> list[dict]:
    """One row per (task, variant, grid point), in the matrix's order, over its planned tuning cells."""
    primary = (meta.get("analysis") or {}).get("primary") or PRIMARY_DEFAULT
    finished = finished_scores(meta, store)
    rows: dict[tuple, dict] = {}
    for spec in meta["tuning"]["cells"]:
        relpath = spec["dir"]
        point = relpath.split("/")[-2]  # tune/TASK/VARIANT/POINT/seedN
        row = rows.setdefault((spec["task_label"], spec["variant"], point), {
            "task": spec["task_label"], "variant": spec["variant"], "point": point, "planned": 0, "failed": 0,
            "scores": [], "completions": [], "train_s": [], "budget": spec.get("budget")})
        row["planned"] += 1
        summary = store.summary(relpath) if store.holds(spec) else None
        if summary is None:
            continue
        if relpath not in finished:
            row["failed"] += 1
            continue
        row["scores"].append(finished[relpath])
        row["completions"].append(int(summary.get("completions_generated", 0)))
        row["train_s"].append(float(summary.get("wall_clock_s", math.nan)))
    out = []
    for row in rows.values():
        scores = np.array(row.pop("scores"), dtype=float).reshape(-1, 3)
        out.append({**row, "primary_metric": primary, "seeds": len(scores),
                    "primary": float(scores[:, 0].mean()) if len(scores) else math.nan,
                    "final_accuracy": float(scores[:, 2].mean()) if len(scores) else math.nan})
    return out


def render(meta: dict, store: ResultStore, prefix: str = "", *, brief: bool = False) -> str:
    """The page (or, ``brief``, the lines a results README's section shows) of a matrix in its tuning stage."""
    rows = progress_rows(meta, store)
    done, planned = sum(r["seeds"] for r in rows), sum(r["planned"] for r in rows)
    failed = sum(r["failed"] for r in rows)
    head = [f"### Matrix `{meta.get('name', '?')}`" + (f": {meta['description']}" if meta.get("description") else ""),
            f"Tuning stage: {done} of {planned} tuning cells finished" + (f", {failed} failed" if failed else "")
            + "; no evaluation cell has run. Each variant's grid point is chosen once all of its tuning cells are "
              "in, on the validation questions, by the matrix's primary metric."]
    if brief:
        return "\n".join(head + [f"The grid so far: [{prefix}README.md]({prefix}README.md)."]) + "\n"
    primary = rows[0]["primary_metric"] if rows else PRIMARY_DEFAULT
    table = [[r["task"], r["variant"], r["point"], f"{r['seeds']} of {r['planned']}" + (f" ({r['failed']} failed)" if r["failed"] else ""),
              "-" if math.isnan(r["primary"]) else f"{r['primary']:.3f}",
              "-" if math.isnan(r["final_accuracy"]) else f"{r['final_accuracy']:.3f}",
              ", ".join(f"{c:,}" for c in r["completions"]) or "-",
              ", ".join(f"{t:.0f}" for t in r["train_s"]) or "-"] for r in rows]
    over = [f"{r['variant']} {r['point']}" for r in rows for c in r["completions"] if r["budget"] and c > r["budget"]]
    lines = head + ["", f"Per grid point, means over its finished tuning seeds: *score*, the primary metric ({primary}) "
                        "on the validation questions, which the choice ranks by; *final*, the accuracy after training. "
                        "*Completions*: what each finished cell generated (the budget every variant gets); "
                        "*training s*: each cell's training time (machines shared with other work: not a cost "
                        "measurement).", "",
                    markdown_table(["task", "variant", "point", "tuning seeds", "score", "final", "completions",
                                    "training s"], table)]
    if over:
        lines += ["", f"Over the budget: {', '.join(over)}."]
    return "\n".join(lines) + "\n"

