"""Where a matrix's wall-clock went: start-up, task build, training, evaluation, waiting, per executor.

Every cell's summary.json carries (``benchmarks.matrix.execute.finish_cell``):

    process_wall_clock_s   dispatch of the cell to its result reaching the driver
    startup_s              process start and imports this cell paid for (0 for a warm worker's later cells)
    build_s                task, policy and algorithm built
    wall_clock_s           training steps alone
    eval_s                 every evaluation (before, during, after)
    reset_s                a warm worker's reset between cells
    queue_wait_s           the session's start to the cell's dispatch

and the rest of ``process_wall_clock_s`` (files, checkpoints, the driver's transfers) is ``other_s``.
matrix.json's session entries hold the same sums per session under ``timing``, with ``elapsed_s``,
``executor`` and ``jobs`` beside them.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.io import read_json

# Summary field -> the name of its sum in a session's ``timing``.
CELL_FIELDS = {"process_wall_clock_s": "process_s", "startup_s": "startup_s", "build_s": "build_s",
               "wall_clock_s": "train_s", "eval_s": "eval_s", "reset_s": "reset_s", "queue_wait_s": "queue_wait_s"}
SESSION_KEYS = tuple(CELL_FIELDS.values()) + ("other_s",)


def cell_timing(summary: dict) -> dict[str, float]:
    """One cell's seconds under the session names; ``other_s`` is what the named phases leave of its process time."""
    out = {name: float(summary.get(field) or 0.0) for field, name in CELL_FIELDS.items()}
    named = sum(out[k] for k in ("startup_s", "reset_s", "build_s", "train_s", "eval_s"))
    out["other_s"] = max(0.0, out["process_s"] - named)
    return out


def wallclock_breakdown(out_dir: str | Path) -> dict:
    """Seconds per phase of a matrix directory, summed over its cells, per executor and in all.

    Returns ``{"sessions": [...], "by_executor": {name: {...}}, "total": {...}, "cells": {relpath: {...}}}``;
    each sum has ``SESSION_KEYS`` plus ``cells``, ``elapsed_s`` (driver wall-clock) and ``idle_s`` (worker slots
    x elapsed minus the cells' process time: slots waiting for work or for the last cells)."""
    out_dir = Path(out_dir)
    meta = read_json(out_dir / "matrix.json") or {}
    cells = {}
    for entry in meta.get("cells", []):
        summary = read_json(out_dir / entry["dir"] / "summary.json")
        if summary is not None:
            cells[entry["dir"]] = {"executor": summary.get("executor", "unknown"), "status": summary.get("status"),
                                   **cell_timing(summary)}
    sessions = []
    for s in meta.get("sessions", []):
        slots = s.get("jobs") or 1
        timing = dict(s.get("timing") or {})
        timing["idle_s"] = max(0.0, slots * s.get("elapsed_s", 0.0) - timing.get("process_s", 0.0))
        sessions.append({"executor": s.get("executor"), "jobs": slots, "elapsed_s": s.get("elapsed_s", 0.0),
                         "cells": s.get("cells_run", 0), **timing})

    def add(into: dict, row: dict) -> None:
        for key, value in row.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "jobs":
                into[key] = into.get(key, 0.0) + value

    by_executor: dict[str, dict] = {}
    total: dict = {}
    for s in sessions:
        add(by_executor.setdefault(s["executor"], {}), s)
        add(total, s)
    return {"sessions": sessions, "by_executor": by_executor, "total": total, "cells": cells}
