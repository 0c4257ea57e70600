"""The matrix: plan (a TOML file -> cells, ``plan``), execute (cells through an executor, ``execute``),
one cell's process (``cell``), the executors (``executors``), the tuning stage (``tuning``), stored cells re-run
(``replay``) and where a matrix's wall-clock went (``timing``)."""

from benchmarks.matrix.execute import CellJob, Executor, SubprocessExecutor, is_complete, run_matrix
from benchmarks.matrix.plan import Cell, MatrixError, Plan, line_of, parse

__all__ = ["Cell", "CellJob", "Executor", "MatrixError", "Plan", "SubprocessExecutor", "is_complete", "line_of",
           "parse", "run_matrix"]
