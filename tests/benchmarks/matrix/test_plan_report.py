"""A matrix file's [report] table: metrics, a list of distinct metric names; anything else is one line naming the
key and its line, exit 2, nothing run."""

import pytest

from benchmarks.cli.main import main
from benchmarks.matrix import parse
from tests.benchmarks.matrix.test_plan import GOOD


def test_report_metrics_are_accepted(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text(GOOD + '\n[report]\nmetrics = ["mismatch/kl_v1", "clipfrac"]\n')
    assert len(parse(path).cells) == 2


@pytest.mark.parametrize("text, line, words", [
    (GOOD + '\n[report]\nmetric = ["clipfrac"]\n', 11, ["unknown key 'metric' of [report]; it has: metrics"]),
    (GOOD + '\n[report]\nmetrics = "clipfrac"\n', 11, ["metrics must be a list of distinct metric names"]),
    (GOOD + '\n[report]\nmetrics = ["clipfrac", "clipfrac"]\n', 11, ["distinct"]),
    (GOOD + '\n[report]\nmetrics = [""]\n', 11, ["metric names"]),
    ('report = 3\n' + GOOD, 1, ["report must be a table: [report]"]),
])
def test_a_bad_report_table_is_one_line(tmp_path, capsys, text, line, words):
    path = tmp_path / "m.toml"
    path.write_text(text)
    assert main(["matrix", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"grpo-bench: error: {path}:{line}: "), err
    assert all(w in err for w in words), err
    assert not (tmp_path / "out").exists()
