"""One matrix cell's process: ``python -m benchmarks.matrix.cell CELL_DIR [--resume]``.

Reads CELL_DIR/cell.json (written by the matrix: the run's full resolved settings) and runs it with
the harness into CELL_DIR; no command line is rebuilt from options. Exit status as ``grpo-bench run``:
0 done, 1 the run failed, 2 bad input (one line on stderr).
"""

from __future__ import annotations

import sys
from pathlib import Path

from benchmarks.errors import TrainingFailed, UsageError
from benchmarks.harness.config import resolve
from benchmarks.harness.loop import run
from benchmarks.io import read_json
from benchmarks.plugins import load_plugins
from tasks import TaskError


def run_cell_dir(cell_dir: Path, *, resume: bool, progress: bool = True) -> dict:
    """Run the cell described by ``cell_dir/cell.json`` in this process; returns its summary."""
    spec = read_json(cell_dir / "cell.json")
    if spec is None or "settings" not in spec:
        raise UsageError(f"{cell_dir}: no readable cell.json with settings")
    load_plugins()
    rc, algo_config, task_options = resolve({**spec["settings"], "out": str(cell_dir), "resume": resume})
    return run(rc, algo_config, task_options, progress=progress)


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print("usage: python -m benchmarks.matrix.cell CELL_DIR [--resume]", file=sys.stderr)
        return 2
    try:
        run_cell_dir(Path(argv[0]), resume="--resume" in argv[1:])
    except (UsageError, TaskError) as exc:
        print(f"grpo-bench: error: {exc}", file=sys.stderr)
        return 2
    except TrainingFailed as exc:
        print(f"grpo-bench: failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
