"""pass@k: the unbiased estimator of Chen et al. 2021 by hand, and a pizza policy's pass@k."""

from __future__ import annotations

import math

import pytest
import torch

from tasks import make_task
from tasks.base import TaskError, pass_at_k


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
