"""Racing is gone: a matrix runs the fixed seeds it states. More seeds for the variants whose mark was still open,
with no correction for the repeated looks, raised the false-"worse" rate above 5%; the verdict's
procedure (benchmarks/report/inference.py) is calibrated for a fixed design."""

import pytest

from benchmarks.matrix import parse
from benchmarks.matrix.plan import MatrixError


def test_a_racing_table_is_refused_with_the_reason(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text("seeds = [0, 1, 2]\nbudget = 64\n\n[racing]\nmax_seeds = 5\n\n[tasks.pizza]\n[algorithms.grpo]\n")
    with pytest.raises(MatrixError, match=r"m.toml:4: \[racing\] is no longer supported.*repeated looks"):
        parse(path)
