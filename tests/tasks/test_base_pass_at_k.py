"""pass@k: the unbiased estimator of Chen et al. 2021 by hand, and a pizza policy's pass@k."""

from __future__ import annotations

import math

import pytest
import torch

from tasks import base as tasks_base, make_task
from tasks.base import GenerationDefaults, Samples, Task, TaskError, pass_at_k


@pytest.mark.parametrize("n, c, k, expected", [
    (5, 2, 2, 1 - 3 / 10),  # 1 - C(3, 2) / C(5, 2)
    (10, 3, 4, 1 - 35 / 210),  # 1 - C(7, 4) / C(10, 4)
    (4, 1, 1, 0.25),  # pass@1 is c / n
    (16, 5, 1, 5 / 16),
    (4, 0, 4, 0.0),  # n = k, nothing correct
    (4, 1, 4, 1.0),  # n = k, one correct: every draw of all n holds it
    (8, 8, 3, 1.0),  # c = n
    (8, 0, 3, 0.0),  # c = 0
    (6, 4, 3, 1.0),  # n - c < k
])
def test_pass_at_k_by_hand(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_is_the_binomial_ratio_and_stays_finite_where_binomials_overflow():
    for n, c, k in ((20, 7, 5), (50, 1, 10), (100, 30, 16)):
        assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), rel=1e-12)
    assert pass_at_k(5000, 1, 1) == pytest.approx(1 / 5000, rel=1e-9)
    assert 0.0 < pass_at_k(5000, 3, 2000) < 1.0  # C(5000, 2000) is no float


@pytest.mark.parametrize("n, c, k", [(4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5)])
def test_impossible_counts_are_refused(n, c, k):
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


@pytest.fixture(scope="module")
def pizza_start():
    task = make_task("pizza", eval_samples=256)
    return task, task.load_policy(torch.device("cpu"))


def test_pizza_pass_at_k_is_monotone_and_pass_at_1_matches_accuracy(pizza_start):
    task, policy = pizza_start
    got = task.evaluate_pass_at_k(policy, [16, 1, 4], 256, seed=0)
    curve = got["pass_at_k"]
    assert list(curve) == ["1", "4", "16"]
    assert len(got["correct"]) == 1 and len(got["correct"][0]) == 256  # one question, its 256 samples
    p1 = sum(got["correct"][0]) / 256
    assert curve["1"] == pytest.approx(p1, abs=1e-12)
    assert 0 < curve["1"] < curve["4"] < curve["16"] < 1
    # one question: pass@k is close to 1 - (1 - p)^k (sampling without replacement from 256)
    assert curve["16"] == pytest.approx(1 - (1 - p1) ** 16, abs=0.02)
    # pass@1 and the evaluation's accuracy estimate the same probability (Ravin's pizza share, about 0.15)
    accuracy = task.evaluate(policy, seed=1)["accuracy"]
    se = math.sqrt(2 * accuracy * (1 - accuracy) / 256)
    assert abs(curve["1"] - accuracy) < 4 * se
    assert 0.05 < curve["1"] < 0.3


def test_pass_at_k_beyond_the_samples_is_one_line(pizza_start):
    task, policy = pizza_start
    with pytest.raises(TaskError, match=r"pass@k needs 1 <= k <= the samples per question \(4\); got k = 1, 8"):
        task.evaluate_pass_at_k(policy, [1, 8], 4)


class _Questions(Task):
    """Five questions; the "model" answers question i right in the first i of its samples (a stub sampler)."""

    name = "questions"
    success_threshold = 1.0
    generation = GenerationDefaults(max_new_tokens=3, temperature=0.7)
    eval_prompts = [f"q{i}" for i in range(5)]

    def reward(self, prompts, completions):
        return [1.0 if c == "right" else 0.0 for c in completions]


def test_pass_at_k_samples_every_question_in_seeded_batches_and_averages_them(monkeypatch):
    calls = []

    def sampler(model, tokenizer, prompts, *, k, max_new_tokens, temperature, seed):
        calls.append((list(prompts), k, max_new_tokens, temperature, seed))
        texts = [["right"] * int(p[1:]) + ["wrong"] * (k - int(p[1:])) for p in prompts]
        return Samples(texts, [[False] * k for _ in prompts], 0)

    task = _Questions()
    task.eval_sampler = sampler
    monkeypatch.setattr(tasks_base, "PASS_AT_K_ROWS", 8)  # 8 rows a call: 2 questions of 4 samples
    got = task.evaluate_pass_at_k(None, [1, 2], 4, seed=10)
    assert calls == [(["q0", "q1"], 4, 3, 0.7, 10), (["q2", "q3"], 4, 3, 0.7, 11), (["q4"], 4, 3, 0.7, 12)]
    assert [sum(row) for row in got["correct"]] == [0, 1, 2, 3, 4]
    # pass@1: (0 + 1 + 2 + 3 + 4) / 4 / 5 = 0.5; pass@2 = mean of 0, 1 - 3/6, 1 - 1/6, 1, 1 (c = 3, 4: n - c < k)
    assert got["pass_at_k"]["1"] == pytest.approx(0.5)
    assert got["pass_at_k"]["2"] == pytest.approx((0 + 0.5 + 5 / 6 + 1 + 1) / 5)


def test_a_task_without_a_notion_of_correct_has_no_pass_at_k():
    task = _Questions()
    task.success_threshold = None
    with pytest.raises(TaskError, match="states no success threshold"):
        task.evaluate_pass_at_k(None, [1], 4)
