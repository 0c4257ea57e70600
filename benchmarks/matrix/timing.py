"""Where a matrix's wall-clock went: start-up, task build, training, evaluation, waiting, cell by cell.

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

