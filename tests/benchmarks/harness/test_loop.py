"""The harness end to end on the pizza task: outputs, seeded reproducibility, resume, the mu = 1 zero loss."""

import json

import pytest

from algorithms import GRPOConfig
from benchmarks.harness import RunConfig, run
from benchmarks.io import read_jsonl
from tests.conftest import strip_timing


def small_run(out, steps=6, **grpo):
    rc = RunConfig(task="pizza", algo="grpo", steps=steps, seed=3, out=str(out), eval_every=3, checkpoint_every=2, device="cpu")
    return run(rc, GRPOConfig(**grpo), {"eval_samples": 64}, progress=False)


def test_run_writes_config_metrics_summary(tmp_path):
    summary = small_run(tmp_path, steps=4, mu=2, level="sequence")
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["algo_config"]["mu"] == 2 and config["algo_config"]["level"] == "sequence"
    assert config["algo_config"]["learning_rate"] == 5e-5  # resolved from the task
    assert {"torch", "transformers", "trl"} <= set(config["environment"]["versions"])
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for key in ("reward/mean", "reward/std", "loss", "kl/k3", "advantage/mean", "advantage/std", "clipfrac",
                "grad_norm", "time/step", "time/wall", "tokens/generated", "loss/iter2", "clipfrac/iter2"):
        assert key in rows[0], key
    assert "eval/accuracy" in rows[2]
    for key in ("task", "algo", "variant", "seed", "device", "accuracy_before", "accuracy_after", "reward_before",
                "reward_after", "wall_clock_s", "peak_memory_bytes", "steps"):
        assert key in summary, key
    assert summary["status"] == "complete" and summary["steps"] == 4
    assert summary["peak_memory_bytes"] > 0 and summary["param_bytes"] > 0
    # AdamW keeps two moments per parameter plus one scalar step counter per tensor.
    assert 0 <= summary["optimizer_bytes"] - 2 * summary["param_bytes"] <= 4 * 64
    assert summary["completions_generated"] == 4 * 4 * 8


def test_a_pause_lengthens_the_wall_clock_not_the_cpu_seconds(tmp_path, monkeypatch):
    """Each step records its CPU seconds (time/cpu) beside its wall clock; the summary sums them (training_cpu_s). A
    step that waits (a stopped process, another's turn on the core) is longer on the wall clock only."""
    import time

    from algorithms.grpo import GRPO

    real, calls = GRPO.train_step, []

    def waits(self, prompts):
        calls.append(1)
        if len(calls) == 2:  # the second step sleeps 0.5 s: wall clock, no CPU
            time.sleep(0.5)
        return real(self, prompts)

    monkeypatch.setattr(GRPO, "train_step", waits)
    summary = small_run(tmp_path, steps=3)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert all(0 < r["time/cpu"] for r in rows) and "cpu" not in summary["phase_seconds"]
    assert rows[1]["time/step"] - rows[1]["time/cpu"] >= 0.45  # the sleep, on the wall clock alone
    assert summary["training_cpu_s"] == pytest.approx(sum(r["time/cpu"] for r in rows))
    assert summary["wall_clock_s"] - summary["training_cpu_s"] >= 0.45


def test_same_seed_same_metrics(tmp_path):
    small_run(tmp_path / "a")
    small_run(tmp_path / "b")
    a, b = (strip_timing(read_jsonl(tmp_path / d / "metrics.jsonl")) for d in "ab")
    assert a == b
    assert len({r["reward/mean"] for r in a}) > 1  # the runs did something


def test_resume_after_crash_reproduces_uninterrupted_run(tmp_path):
    small_run(tmp_path / "full")

    class Crash(Exception):
        pass

    def crash_at_5(row):
        if row["step"] == 5:
            raise Crash

    rc = RunConfig(task="pizza", algo="grpo", steps=6, seed=3, out=str(tmp_path / "resumed"), eval_every=3,
                   checkpoint_every=2, device="cpu")
    with pytest.raises(Crash):
        run(rc, GRPOConfig(), {"eval_samples": 64}, on_step=crash_at_5, progress=False)
    assert not (tmp_path / "resumed" / "summary.json").exists()
    assert [r["step"] for r in read_jsonl(tmp_path / "resumed" / "metrics.jsonl")] == [1, 2, 3, 4, 5]
    rc.resume = True
    summary = run(rc, GRPOConfig(), {"eval_samples": 64}, progress=False)
    full = strip_timing(read_jsonl(tmp_path / "full" / "metrics.jsonl"))
    resumed = strip_timing(read_jsonl(tmp_path / "resumed" / "metrics.jsonl"))
    assert resumed == full  # step 5 re-run from the step-4 checkpoint, not counted twice
    assert summary["accuracy_after"] == json.loads((tmp_path / "full" / "summary.json").read_text())["accuracy_after"]


def test_mu1_beta0_loss_is_zero_while_learning(tmp_path):
    summary = small_run(tmp_path, steps=20, beta=0.0, learning_rate=1e-4)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert all(abs(r["loss"]) <= 1e-6 for r in rows)
    assert all(r["grad_norm"] > 0 for r in rows if r["advantage/std"] > 0)
    assert summary["accuracy_after"] > summary["accuracy_before"] + 0.3


def test_grpo_learns_pizza(tmp_path):
    summary = small_run(tmp_path, steps=30)
    assert summary["accuracy_before"] < 0.3
    assert summary["accuracy_after"] >= 0.85


def test_a_resampling_variant_is_evaluated_where_its_completions_cross_the_grid(tmp_path):
    # DAPO's dynamic sampling draws extra groups in some steps, so its step counts fall at other completion
    # counts than its rivals': it is evaluated at the step whose completions cross each multiple of 64.
    rc = RunConfig(task="pizza", algo="grpo", steps=8, seed=0, out=str(tmp_path), eval_every=1,
                   eval_every_completions=64, checkpoint_every=0, device="cpu")
    run(rc, GRPOConfig(dynamic_sampling=True, prompts_per_step=2, group_size=4), {"eval_samples": 16}, progress=False)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    total, crossed = 0, []
    for r in rows:
        before, total = total, total + r["completions"]
        crossed.append(total // 64 > before // 64 and r is not rows[-1])
    assert any(r["completions"] > 8 for r in rows), "no step re-sampled: the test would not tell steps from counts"
    assert [("eval/accuracy" in r) for r in rows] == crossed and any(crossed)  # eval_every=1 is overridden


def test_a_resampling_variant_generates_exactly_the_budget(tmp_path):
    # DAPO's refills stop at the budget, so a budget that is a multiple of a group is met exactly: the equal
    # samples the matrix compares at. Before the cap its last step's refills ran on (1,440 of 1,280 seen).
    rc = RunConfig(task="pizza", algo="grpo", steps=50, seed=0, out=str(tmp_path), budget=60, eval_every=0,
                   checkpoint_every=0, device="cpu")
    run(rc, GRPOConfig(dynamic_sampling=True, prompts_per_step=2, group_size=4, dynamic_sampling_max_rounds=10),
        {"eval_samples": 8}, progress=False)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert any(r["completions"] > 8 for r in rows), "no step re-sampled: the test would not reach the cap"
    assert sum(r["completions"] for r in rows) == 60


def test_the_matrix_evaluates_only_resampling_variants_by_completion_count():
    from benchmarks.matrix import parse

    cells = {(c.task, c.variant): c for c in parse("benchmarks/matrices/verdicts.toml").cells if c.seed == 0}
    dapo, rloo = cells[("addition", "dapo")], cells[("addition", "rloo")]
    assert dapo.settings["eval_every_completions"] == 1024 and dapo.settings["dynamic_sampling"]
    assert rloo.settings["eval_every_completions"] == 0 and rloo.settings["eval_every"] * 8 == 1024


@pytest.mark.parametrize("precision, native, said", [("bf16", False, True), ("bf16", True, False), ("bf16", None, False),
                                                     ("fp32", False, False), ("auto", False, False)])
def test_bf16_on_a_cpu_that_emulates_it_says_so_in_one_line(monkeypatch, capsys, precision, native, said):
    from benchmarks.harness import measure
    from benchmarks.harness.loop import build

    monkeypatch.setattr(measure, "cpu_bf16_native", lambda: native)
    _, _, algo, resolved = build(RunConfig(task="pizza", algo="grpo", device="cpu", precision=precision),
                                 GRPOConfig(), {"eval_samples": 1})
    err = capsys.readouterr().err
    assert resolved["precision"] == ("bf16" if precision == "bf16" else "fp32")  # the notice changes nothing
    if said:
        lines = [line for line in err.splitlines() if "bf16" in line]
        assert len(lines) == 1 and lines[0].startswith("grpo-bench: note: --precision bf16 on ")
        assert "emulates" in lines[0] and "--precision fp32" in lines[0]
    else:
        assert "emulates" not in err
