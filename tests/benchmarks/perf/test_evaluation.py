"""grpo-bench bench eval: each way of decoding a task's evaluation timed in interleaved rounds on the same policy,
the speed-up read from the same rounds, the answers compared with the first setup's; bad input is one line."""

from __future__ import annotations

import statistics

import pytest

from benchmarks.errors import UsageError
from benchmarks.perf import evaluation
from benchmarks.perf.evaluation import EvalBenchSettings, SETUPS, render, run_eval_bench, time_policy


class _Task:
    """A task whose evaluation takes a known CPU time and writes known completions."""

    def __init__(self, spin: int, completions: list[list[str]]):
        self.spin, self.completions, self.calls = spin, completions, 0

    def load_policy(self, device):
        return _Model()

    def evaluate(self, model, *, seed):
        total = 0
        for i in range(self.spin):  # CPU time, not sleep: the bench reads process time
            total += i * i
        self.last_evaluation = {"completions": self.completions[min(self.calls, len(self.completions) - 1)]}
        self.calls += 1
        return {"accuracy": 0.5, "completion_tokens": 3.0}


class _Model:
    def eval(self):
        return self


def test_ratios_and_agreement_come_from_the_same_rounds():
    answers = [["1"], ["2"], ["3"], ["4"]]
    changed = [["1"], ["2"], ["x"], ["4"]]
    tasks = {"slow": _Task(3_000_000, [answers]), "fast": _Task(600_000, [changed]),
             "flaky": _Task(600_000, [answers, changed, answers])}
    out = time_policy("base", tasks, rounds=3, seed=0, log=lambda line: None)
    assert out.pop("policy") == "the task's starting policy"
    for label, r in out.items():
        ratios = [a["core_s"] / b["core_s"] for a, b in zip(out["slow"]["rounds"], r["rounds"])]
        assert r["speedup"] == pytest.approx(statistics.median(ratios))
        assert r["speedup_ci95"][0] <= r["speedup"] <= r["speedup_ci95"][1]
        assert r["core_s"] == pytest.approx(statistics.median(x["core_s"] for x in r["rounds"]))
    assert out["slow"]["speedup"] == 1.0
    assert out["fast"]["speedup"] > 2  # five times fewer operations
    assert out["fast"]["differ_from_reference"] == 1 and out["slow"]["differ_from_reference"] == 0
    assert out["fast"]["same_every_round"] and not out["flaky"]["same_every_round"]
    assert [t.calls for t in tasks.values()] == [3, 3, 3]
    table = render({"command": "c", "matrix": "m", "task": "t", "threads": 1, "seed": 0, "rounds": 3, "setups": ["slow", "fast", "flaky"],
                    "environment": {"device_name": "cpu", "versions": {}}, "load": {"start": 0.0, "end": 0.0},
                    "policies": {"base": {"policy": "the task's starting policy", **out}}})
    assert "| base | fast |" in table and "1 of 4" in table
    assert "**One evaluation, `flaky` against `slow`: base" in table and "| base | flaky |" in table
    assert "Policies: `base`, the task's starting policy." in table


def test_bad_input_is_one_line(tmp_path):
    with pytest.raises(UsageError, match="--rounds must be >= 2"):
        run_eval_bench(EvalBenchSettings(rounds=1, out=str(tmp_path)))
    with pytest.raises(UsageError, match="no checkpoint file"):
        run_eval_bench(EvalBenchSettings(policies=("base", str(tmp_path / "none.pt")), out=str(tmp_path)))
    matrix = tmp_path / "m.toml"
    matrix.write_text('name = "p"\nseeds = [0]\nbudget = 64\n[tasks.pizza]\n[algorithms.grpo]\n')
    with pytest.raises(UsageError, match="pizza has no eval_drop_finished, eval_share_prefix option"):
        run_eval_bench(EvalBenchSettings(matrix=str(matrix), out=str(tmp_path)))


def test_the_setups_differ_only_in_how_they_decode(tmp_path):
    assert list(SETUPS)[0] == "whole" and SETUPS["whole"] == {"eval_share_prefix": False, "eval_drop_finished": False}
    assert all(set(setup) == {"eval_share_prefix", "eval_drop_finished"} for setup in SETUPS.values())
    assert len({tuple(sorted(setup.items())) for setup in SETUPS.values()}) == len(SETUPS)
    for setups in (("shared",), ("shared", "bogus")):
        with pytest.raises(UsageError, match="--setups takes two or more"):
            run_eval_bench(EvalBenchSettings(setups=setups, out=str(tmp_path)))
    assert evaluation.BASE == "base"
