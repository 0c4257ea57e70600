"""Racing: seeds beyond a matrix's first ones go only to variants whose mark is undecided, up to max_seeds;
a resumed matrix re-derives the same rounds from the store and runs nothing again."""

import json

import pytest

from benchmarks.matrix import parse, run_matrix
from benchmarks.matrix.plan import MatrixError, Racing
from benchmarks.report.verdicts import undecided

MATRIX = """\
seeds = [0, 1, 2]
budget = 64
eval_every = 32
device = "cpu"

[racing]
max_seeds = 5

[tasks.pizza]
eval_samples = 8

[algorithms.grpo]
learning_rate = 1e-3
[algorithms.reinforce]
learning_rate = 1e-3
[algorithms.dpo]
"""


def _warm():
    """Warm workers, two at a time: a fresh process per cell would spend most of the test importing torch."""
    from benchmarks.matrix.executors import make_executor

    return make_executor("local", jobs=2)


def test_the_rule_leaves_decided_marks_alone():
    # worse (interval far below 0) is decided; the best and a tied rival with a wide interval are not
    scores = {"a": [0.80, 0.90, 0.70], "b": [0.75, 0.95, 0.60], "c": [0.10, 0.12, 0.11]}
    assert undecided(scores, 0.03) == ["a", "b"]
    # tied within +-target: decided, and with no open rival the best is decided too
    close = {"a": [0.800, 0.801, 0.802], "b": [0.799, 0.800, 0.801], "c": [0.10, 0.12, 0.11]}
    assert undecided(close, 0.03) == []
    assert undecided(close, 0.001) == ["a", "b"]  # the same interval is too wide for a tighter target
    assert undecided({"a": [0.97, 0.99, 1.0], "b": [0.96, 1.0, 0.95]}, 0.03) == []  # saturated: ranks nothing
    assert undecided({"a": [0.5, 0.6], "b": [0.4, 0.5, 0.6]}, 0.03) == ["a", "b"]  # too few seeds for a mark


def test_racing_seeds_skip_the_tuning_seeds_and_stop_at_max_seeds():
    racing = Racing(max_seeds=6, step=2)
    assert racing.seeds_after([0, 1, 2], avoid=[3, 10]) == [4, 5]
    assert racing.seeds_after([0, 1, 2, 4, 5], avoid=[3, 10]) == [6]  # one short of max_seeds
    assert racing.seeds_after([0, 1, 2, 4, 5, 6], avoid=[3]) == []


@pytest.mark.parametrize("edit, words", [
    ("max_seeds = 5", "max_seeds must be an integer >= 4, got 3"),
    ("max_seeds = 5\nstep = 0", "step must be an integer >= 1, got 0"),
    ("max_seeds = 5\ntarget = 2", "target must be a number in (0, 1), got 2"),
    ("max_seeds = 5\nrounds = 2", "unknown key 'rounds' of [racing]"),
])
def test_a_bad_racing_table_is_one_line(tmp_path, edit, words):
    path = tmp_path / "m.toml"
    path.write_text(MATRIX.replace("max_seeds = 5", edit if "rounds" in edit or "step" in edit or "target" in edit
                                   else "max_seeds = 3"))
    with pytest.raises(MatrixError) as info:
        parse(path)
    assert words in str(info.value) and str(info.value).startswith(f"{path}:")


@pytest.mark.slow  # a whole raced matrix, run and resumed: about 20 s
def test_a_raced_matrix_adds_seeds_to_undecided_variants_only_and_resumes(tmp_path):
    path, out = tmp_path / "m.toml", tmp_path / "out"
    path.write_text(MATRIX)
    plan = parse(path)
    counts = run_matrix(plan, out, progress=False, executor=_warm(), racing_rule=undecided)
    meta = json.loads((out / "matrix.json").read_text())
    seeds = {}
    for cell in meta["cells"]:
        seeds.setdefault(cell["variant"], []).append(cell["seed"])
    assert seeds["dpo"] == [0, 1, 2]  # at 3 seeds dpo is clearly worse on pizza (it barely moves in 2 steps)
    stages = [s["stage"] for s in meta["sessions"]]
    assert stages[0] == "evaluation" and all(s.startswith("racing round") for s in stages[1:])
    assert counts["complete"] == len(meta["cells"]) and max(len(v) for v in seeds.values()) <= 5
    # Each round extended exactly the variants the rule called undecided after the round before.
    from benchmarks.store import ResultStore

    store = ResultStore.open(out)
    finals = {v: [store.summary(f"pizza/{v}/seed{s}")["accuracy_after"] for s in ss] for v, ss in seeds.items()}
    if len(stages) > 1:
        first = {v: f[:3] for v, f in finals.items()}
        assert sorted(v for v, ss in seeds.items() if len(ss) > 3) == sorted(undecided(first, 0.03))
    again = run_matrix(plan, out, resume=True, progress=False, executor=_warm(), racing_rule=undecided)
    assert again == {"complete": 0, "failed": 0, "skipped": len(meta["cells"])}
