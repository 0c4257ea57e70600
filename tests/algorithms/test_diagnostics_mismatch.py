"""The sampler/trainer mismatch diagnostics (Tinker's kl_sample_train_v1/v2 and the ratio band): by hand, and in
every step of a GRPO run that records the sampler's log-probs."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from algorithms.base import Sampling
from algorithms.diagnostics import sampler_mismatch
from algorithms.grpo import GRPO, GRPOConfig
from algorithms.rollout import rollout_logps
from tasks import make_task

KEYS = ("mismatch/kl_v1", "mismatch/kl_v2", "mismatch/ratio_outside")


def test_mismatch_by_hand():
    trainer = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.7, -0.9]], dtype=torch.float64)
    sampler = torch.tensor([[-1.0, -1.8, -3.3], [-0.55, 9.9, 9.9]], dtype=torch.float64)  # 9.9: masked out
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    # sampler - trainer over the 4 active tokens: 0, 0.2, -0.3, -0.05
    # v1 = (0 + 0.2 - 0.3 - 0.05) / 4 = -0.0375; v2 = 0.5 * (0 + 0.04 + 0.09 + 0.0025) / 4 = 0.0165625
    # ratios exp(trainer - sampler): 1, exp(-0.2) = 0.819 (out), exp(0.3) = 1.350 (out), exp(0.05) = 1.051 (in)
    got = sampler_mismatch(trainer, sampler, mask)
    assert got["mismatch/kl_v1"] == pytest.approx(-0.0375, abs=1e-12)
    assert got["mismatch/kl_v2"] == pytest.approx(0.0165625, abs=1e-12)
    assert got["mismatch/ratio_outside"] == 0.5


def test_equal_log_probs_give_exact_zeros_and_nan_counts_as_no_mismatch():
    logps = torch.log_softmax(torch.randn(3, 5, 7), -1)[..., 0]
    assert sampler_mismatch(logps, logps.clone(), torch.ones(3, 5)) == dict.fromkeys(KEYS, 0.0)
    unscored = logps.clone()
    unscored[0, 0] = float("nan")
    assert sampler_mismatch(logps, unscored, torch.ones(3, 5)) == dict.fromkeys(KEYS, 0.0)
    assert sampler_mismatch(logps, logps + 1, torch.zeros(3, 5)) == dict.fromkeys(KEYS, 0.0)  # no active token


def test_a_ratio_on_the_band_edge_is_inside():
    trainer = torch.zeros(1, 2, dtype=torch.float64)
    sampler = torch.tensor([[-math.log(1.1) + 1e-9, -math.log(0.9) - 1e-9]], dtype=torch.float64)
    assert sampler_mismatch(trainer, sampler, torch.ones(1, 2))["mismatch/ratio_outside"] == 0.0
    assert sampler_mismatch(trainer, sampler * 1.01, torch.ones(1, 2))["mismatch/ratio_outside"] == 1.0


@pytest.fixture(scope="module")
def pizza():
    return make_task("pizza")


def _grpo(task, **options):
    torch.manual_seed(0)
    policy = task.load_policy(torch.device("cpu"))
    config = GRPOConfig(learning_rate=task.recommended_learning_rate, group_size=4, **options)
    return GRPO(policy, copy.deepcopy(policy).requires_grad_(False), task, config,
                Sampling(max_new_tokens=task.generation.max_new_tokens), seed=0)


def test_a_run_whose_sampler_is_the_trainer_logs_exact_zeros(pizza, monkeypatch):
    algo = _grpo(pizza, sampling_precision="fp32")
    sample = algo.generate

    def trainer_scored(prompts, group_size):  # the sampler's log-probs replaced by the trainer's own forward's
        rollout = sample(prompts, group_size)
        with torch.no_grad():
            rollout.sampling_logps = rollout_logps(algo.policy, rollout, temperature=algo.sampling.temperature)
        return rollout

    monkeypatch.setattr(algo, "generate", trainer_scored)
    metrics = algo.step(pizza.train_prompts() * 4)
    assert {k: metrics[k] for k in KEYS} == dict.fromkeys(KEYS, 0.0)


def test_fp32_sampling_is_within_rounding_of_the_trainer_and_bf16_int8_are_not(pizza):
    steps = {p: _grpo(pizza, sampling_precision=p).step(pizza.train_prompts() * 4) for p in ("fp32", "bf16", "int8")}
    for metrics in steps.values():
        assert set(KEYS) <= set(metrics)
    # fp32: the KV-cache decoder and the packed training forward round differently (a few tokens, <= 1e-6 apart)
    assert abs(steps["fp32"]["mismatch/kl_v1"]) < 1e-7 and steps["fp32"]["mismatch/kl_v2"] < 1e-12
    assert steps["fp32"]["mismatch/ratio_outside"] == 0.0
    for precision in ("bf16", "int8"):
        assert steps[precision]["mismatch/kl_v2"] > 1e-6
        assert steps[precision]["mismatch/kl_v2"] > 1e4 * steps["fp32"]["mismatch/kl_v2"]
    assert steps["int8"]["mismatch/ratio_outside"] >= 0.0
