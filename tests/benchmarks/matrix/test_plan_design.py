"""A matrix whose design cannot give a verdict says so at --dry-run and before its first cell (not refused)."""

import inspect

from benchmarks.matrix.plan import VERDICT_MIN_SEEDS, design_warnings, parse
from benchmarks.report import inference

MATRIX = """\
seeds = {seeds}
budget = 64
{extra}
[tasks.pizza]
eval_samples = 16

[algorithms.grpo]
level = ["token", "sequence"]
"""


def test_the_plans_minimum_is_the_verdicts():
    assert VERDICT_MIN_SEEDS == inspect.signature(inference.compare).parameters["min_seeds"].default


def test_a_two_seed_matrix_is_told_at_dry_run(tmp_path, run_cli):
    path = tmp_path / "m.toml"
    path.write_text(MATRIX.format(seeds="[0, 1]", extra=""))
    code, out, err = run_cli("matrix", path, "--out", tmp_path / "out", "--dry-run")
    assert code == 0, err
    warned = [line for line in out.splitlines() if line.startswith("warning:")]
    assert len(warned) == 1 and "2 seed(s) per variant" in warned[0] and "at least 3" in warned[0]
    assert "describe grpo(level=token), grpo(level=sequence) but" in warned[0]
    assert "pizza/grpo_level=token/seed1" in out  # still listed: told, not refused
    assert not (tmp_path / "out").exists()


def test_three_seeds_and_an_evaluation_inside_the_budget_say_nothing(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text(MATRIX.format(seeds="[0, 1, 2]", extra="eval_every = 32"))
    assert design_warnings(parse(path)) == []


def test_a_budget_below_the_first_evaluation_is_told(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text(MATRIX.format(seeds="[0, 1, 2]", extra="eval_every = 64"))
    (line,) = design_warnings(parse(path))
    assert line.startswith("warning: on pizza the budget of 64 completions is below the first evaluation")
