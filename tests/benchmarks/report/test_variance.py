"""Where a primary metric's spread comes from (the real-LM variance pilot): every evaluation keeps a per-question
record, the split-half estimator recovers planted policy and evaluation variances, and `grpo-bench variance`
turns a store's records into the components and the cheapest design for a target MDD."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from benchmarks.io import decode_correct, encode_correct
from benchmarks.report import inference
from benchmarks.report.variance import components, projected_sd, split_half
from benchmarks.store import ResultStore


def test_the_record_round_trips_and_refuses_what_it_cannot_hold():
    correct = [[True, False], [False, False], [True, True]]
    record = encode_correct(correct)
    assert record == {"questions/correct": "102", "questions/samples": 2}
    assert decode_correct("102", 2) == [0.5, 0.0, 1.0]
    many = [[True] * 12, [False] * 11 + [True]]
    assert encode_correct(many) == {"questions/correct": "12,1", "questions/samples": 12}
    assert decode_correct("12,1", 12) == [1.0, 1 / 12]
    assert encode_correct([[True], [True, False]]) is None  # questions asked unequally often: nothing to average
    with pytest.raises(ValueError):
        decode_correct("3", 2)


def _planted(n: int, q: int, policy_sd: float, seed: int = 0) -> tuple[np.ndarray, float]:
    """Greedy-like records: seed s gets question q right with probability p_q + u_s (u_s ~ N(0, policy_sd)), the
    questions' p_q fixed; the evaluation variance at q questions is mean p(1 - p) / q."""
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.2, 0.8, q)
    u = rng.normal(0.0, policy_sd, n)
    prob = np.clip(p[None, :] + u[:, None], 0, 1)
    return (rng.random((n, q)) < prob).astype(float), float(np.mean(prob * (1 - prob)) / q)


def test_split_half_recovers_the_planted_components():
    m, evaluation = _planted(n=400, q=400, policy_sd=0.03)
    policy_hat, evaluation_hat = split_half(m, splits=100)
    assert policy_hat == pytest.approx(0.03 ** 2, rel=0.25)
    assert evaluation_hat == pytest.approx(evaluation, rel=0.15)  # not halved: would read 2x; not rescaled: 2x
    # the parts add up to the spread of the full-set metric
    assert policy_hat + evaluation_hat == pytest.approx(m.mean(1).var(ddof=1), rel=0.1)


def test_no_policy_spread_reads_near_zero_and_the_interval_covers_it():
    m, evaluation = _planted(n=200, q=300, policy_sd=0.0, seed=3)
    c = components(m, splits=50, bootstrap=200)
    # unbiased (mean over 40 planted matrices of 60 seeds: 1e-6), its sd at 200 seeds about 0.12 x the evaluation part
    assert abs(c["policy_var"]) < 0.4 * evaluation
    assert c["policy_var_low"] <= 0.0 <= c["policy_var_high"]
    assert c["evaluation_var_low"] <= evaluation <= c["evaluation_var_high"]


def test_projection_and_the_seeds_it_asks_for():
    # policy 0.0004, evaluation 0.0008 at 200 questions: at 800 questions 0.0002
    assert projected_sd(0.0004, 0.0008, 200, 800) == pytest.approx(math.sqrt(0.0006))
    assert projected_sd(-0.0001, 0.0008, 200, 200) == pytest.approx(math.sqrt(0.0008))  # a negative part counts 0
    fewer = inference.seeds_for_mdd(0.05, projected_sd(0.0004, 0.0008, 200, 800), 8)
    more = inference.seeds_for_mdd(0.05, projected_sd(0.0004, 0.0008, 200, 200), 8)
    assert fewer < more
    n = more
    assert inference.mdd(math.sqrt(0.0012), n, 8, 7 * (n - 1)) <= 0.05 < inference.mdd(math.sqrt(0.0012), n - 1, 8, 7 * (n - 2))


def _write(out: Path, seeds: int = 6, q: int = 200, policy_sd: float = 0.04, records: bool = True) -> Path:
    """A finished one-variant matrix whose 4 evaluations (before, 2 during, after) keep per-question records."""
    out.mkdir(parents=True)
    store = ResultStore.open(out)
    rng = np.random.default_rng(7)
    p = rng.uniform(0.1, 0.7, q)
    cells = []
    for seed in range(seeds):
        u = rng.normal(0, policy_sd)
        evals = []
        for gain in (0.0, 0.1, 0.15, 0.2):
            correct = rng.random(q) < np.clip(p + gain + u * gain / 0.2, 0, 1)
            evals.append(encode_correct([[bool(c)] for c in correct]))
        accuracy = [sum(decode_correct(e["questions/correct"], 1)) / q for e in evals]
        rel = f"chain_sum/grpo/seed{seed}"
        spec = {"task_label": "chain_sum", "task": "reasoning_gym", "variant": "grpo", "algo": "grpo", "seed": seed,
                "steps": 3, "budget": 96, "completions_per_step": 32, "eval_every": 32}
        rows = [{"step": 1, "completions": 32.0, "time/wall": 10.0, "eval/accuracy": accuracy[1], **(evals[1] if records else {})},
                {"step": 2, "completions": 32.0, "time/wall": 20.0, "eval/accuracy": accuracy[2], **(evals[2] if records else {})},
                {"step": 3, "completions": 32.0, "time/wall": 30.0}]
        summary = {"status": "complete", "steps": 3, "accuracy_before": accuracy[0], "accuracy_after": accuracy[3],
                   "completions_generated": 96.0, "wall_clock_s": 30.0, "eval_s": 40.0, "threads": 1,
                   **({"eval_questions": {"before": evals[0], "after": evals[3]}} if records else {})}
        store.put(rel, spec, summary, rows)
        cells.append({"dir": rel, **spec})
    store.write()
    (out / "matrix.json").write_text(json.dumps({"name": out.name, "cells": cells, "sessions": [],
                                                 "analysis": {"primary": "last_2", "margin": None, "target_mdd": None,
                                                              "stated_at": None, "claims": []}}))
    return out


def test_the_variance_command_writes_components_and_designs(run_cli, tmp_path):
    matrix = _write(tmp_path / "pilot")
    out = tmp_path / "variance.md"
    code, stdout, err = run_cli("variance", matrix, "--out", out, "--questions", "200", "800", "--variants", "6",
                                "--metrics", "final", "last_2", "auc")
    assert code == 0, err
    text = out.read_text()
    data = json.loads(out.with_suffix(".json").read_text())[0]
    parts = {r["primary"]: r for r in data["parts"]}
    assert set(parts) == {"final", "last_2", "auc"} and parts["final"]["seeds"] == 6 and parts["final"]["questions"] == 200
    # the final metric's components add up to its seed-to-seed variance
    assert parts["final"]["policy_var"] + parts["final"]["evaluation_var"] == pytest.approx(parts["final"]["total_var"], rel=0.35)
    plans = {(r["primary"], r["questions"]): r for r in data["plans"]}
    # 4 questions more: the evaluation part shrinks, never the policy part
    assert plans[("final", 800)]["sd"] < plans[("final", 200)]["sd"]
    assert plans[("final", 800)]["sd"] ** 2 >= max(parts["final"]["policy_var"], 0) - 1e-12
    # cost per cell: 30 s training + (evaluations the metric needs + the one before) x 40 s / (4 x 200 questions) x Q
    assert plans[("final", 200)]["core_s_per_cell"] == pytest.approx(30 + 2 * 40 / 800 * 200)
    assert plans[("auc", 800)]["core_s_per_cell"] == pytest.approx(30 + 4 * 40 / 800 * 800)
    assert plans[("final", 200)]["core_s_total"] == pytest.approx(plans[("final", 200)]["seeds"] * 6 * plans[("final", 200)]["core_s_per_cell"])
    cheapest = min(data["plans"], key=lambda r: r["core_s_total"])
    assert f"**{cheapest['primary']}**" in text
    assert "policy sd [95%]" in text and "Written by `grpo-bench variance" in text
    # the headline names the cheapest design, and the command prints it first
    assert (f"{cheapest['primary']} on {cheapest['questions']} questions, {cheapest['seeds']} seeds a variant"
            in stdout.splitlines()[0])


def test_a_store_without_records_is_one_line(run_cli, tmp_path):
    matrix = _write(tmp_path / "old", records=False)
    code, _, err = run_cli("variance", matrix, "--out", tmp_path / "v.md")
    assert code == 2 and "per-question records" in err and "Traceback" not in err
    code, _, err = run_cli("variance", matrix, "--out", tmp_path / "v.md", "--metrics", "best_5")
    assert code == 2 and "--metrics" in err and "Traceback" not in err


def test_a_run_keeps_a_record_of_every_evaluation(run_cli, tmp_path):
    code, _, err = run_cli("run", "--algo", "grpo", "--task", "addition", "--steps", "2", "--eval-every", "1",
                           "--out", tmp_path / "r")
    assert code == 0, err
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    records = [(summary["accuracy_before"], summary["eval_questions"]["before"])]
    records += [(r["eval/accuracy"], r) for r in rows if "eval/accuracy" in r]
    records.append((summary["accuracy_after"], summary["eval_questions"]["after"]))
    assert len(records) == 3
    for accuracy, record in records:
        fractions = decode_correct(record["questions/correct"], record["questions/samples"])
        assert len(fractions) > 10 and sum(fractions) / len(fractions) == pytest.approx(accuracy)
