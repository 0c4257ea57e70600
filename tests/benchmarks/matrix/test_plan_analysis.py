"""A matrix's pre-registered analysis: [analysis] is parsed and checked, recorded with when it was stated, and a
resumed matrix whose analysis changed is refused; tuning cells evaluate on validation problems and choose by the
primary metric; an A/A replicate draws other training random numbers and keeps the evaluation's seed."""

from __future__ import annotations

import pytest

from benchmarks.curve import primary_value
from benchmarks.errors import UsageError
from benchmarks.harness.config import REPLICATE_STRIDE, RunConfig, training_seed
from benchmarks.matrix import parse
from benchmarks.matrix.execute import _stated_analysis
from benchmarks.matrix.plan import MatrixError
from benchmarks.store import experiment

MATRIX = """\
seeds = [0, 1, 2]
budget = 128
eval_every = 32
{analysis}
[tuning]
seeds = [100]
learning_rate = [1e-3, 3e-3]

[tasks.pizza]
[tasks.addition]
budget = 256
eval_every = 64

[algorithms.grpo]
[algorithms.grpo_twin]
algo = "grpo"
replicate = 1
"""
ANALYSIS = '[analysis]\nprimary = "last_2"\nmargin = 0.02\n'


def _plan(tmp_path, analysis=ANALYSIS):
    path = tmp_path / "m.toml"
    path.write_text(MATRIX.format(analysis=analysis))
    return parse(path)


def test_analysis_is_parsed_and_tuning_cells_evaluate_on_validation(tmp_path):
    plan = _plan(tmp_path)
    assert plan.analysis.primary == "last_2" and plan.analysis.margin == 0.02 and plan.analysis.target_mdd is None
    assert {c.task_options.get("eval_set") for c in plan.tuning_cells()} == {"validation"}
    assert all("eval_set" not in c.task_options for g in plan.tuning for cells in g.candidates for c in cells)
    twin = [c for g in plan.tuning for c in g.candidates[0] if c.variant == "grpo_twin"]
    assert twin and all(c.settings["replicate"] == 1 for c in twin)


@pytest.mark.parametrize("analysis, message", [
    ('[analysis]\nprimary = "best"\n', "primary metric 'best': one of final"),
    ('[analysis]\nprimary = "last_9"\n', "needs 9 evaluations after the start, but eval_every 32 gives 4"),
    ('[analysis]\nmargin = 2\n', "margin must be a number in (0, 1)"),
    ('[analysis]\nalpha = 0.1\n', "unknown key 'alpha' of [analysis]"),
])
def test_a_bad_analysis_is_one_line(tmp_path, analysis, message):
    with pytest.raises(MatrixError, match=r"m.toml:\d+: .*" + message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        _plan(tmp_path, analysis)


def test_the_analysis_is_recorded_once_and_a_change_is_refused(tmp_path):
    plan = _plan(tmp_path)
    first = _stated_analysis(plan, {}, [])
    assert first["primary"] == "last_2" and first["stated_at"]
    ran = [{"cells_run": 3}]
    assert _stated_analysis(plan, {"analysis": first}, ran) == first  # a resume keeps the first statement
    changed = _plan(tmp_path, ANALYSIS.replace("0.02", "0.05"))
    with pytest.raises(UsageError, match=r"\[analysis\] changed since the first session.*a new experiment"):
        _stated_analysis(changed, {"analysis": first}, ran)
    with pytest.raises(UsageError, match="drops the \\[analysis\\]"):
        _stated_analysis(_plan(tmp_path, ""), {"analysis": first}, ran)
    late = _stated_analysis(plan, {}, ran)  # added after cells had run: recorded, not pre-registered
    assert late["stated_at"] is None


def test_primary_metric_values():
    x, y = [0, 32, 64, 96, 128], [0.2, 0.5, 0.6, 0.7, 0.9]
    assert primary_value("final", x, y, 128) == 0.9
    assert primary_value("last_2", x, y, 128) == pytest.approx(0.8)
    assert primary_value("auc", x, y, 128) == pytest.approx((0.35 + 0.55 + 0.65 + 0.8) / 4)
    assert str(primary_value("last_3", [0, 128], [0.2, 0.9], 128)) == "nan"  # before and after only


def test_a_replicate_moves_the_training_seed_not_the_evaluation_seed():
    rc = RunConfig(seed=3, replicate=2)
    assert training_seed(rc) == 3 + 2 * REPLICATE_STRIDE and rc.seed == 3
    assert training_seed(RunConfig(seed=3)) == 3


def test_stored_cells_without_the_replicate_setting_are_the_same_experiment():
    old = {"task": "pizza", "settings": {"seed": 0, "learning_rate": 1e-3}}
    new = {"task": "pizza", "settings": {"seed": 0, "learning_rate": 1e-3, "replicate": 0}}
    assert experiment(old) == experiment(new)
    assert experiment(old) != experiment({**new, "settings": {**new["settings"], "replicate": 1}})
