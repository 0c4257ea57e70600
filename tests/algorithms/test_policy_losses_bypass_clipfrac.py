"""The clip fraction under verl's bypass mode: the share of tokens the loss clipped against the pi_old it used, the
sampler's log-probs (verl's pg_clipfrac with old_log_prob = rollout_log_prob), not the trainer's. The tensors are
chosen so that the two definitions differ: against the trainer's own log-probs no token is clipped."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from algorithms.base import Sampling
from algorithms.grpo import GRPO, GRPOConfig
from tasks import make_task

NAN = float("nan")
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
ADV = torch.tensor([1.0, -1.0])
LOGPS = torch.tensor([[-1.0, -2.0, -5.0], [-0.5, -1.5, -0.7]])
# log(pi_theta / pi_sampler): row 0 (A > 0) 0.3 (e^0.3 = 1.35 > 1.2: clipped), 0.1 (1.105: not), padding;
# row 1 (A < 0) -0.3 (0.741 < 0.8: clipped), -0.1 (0.905: not), unscored (NaN: the trainer's, ratio 1: not)
SAMPLER = torch.tensor([[-1.3, -2.1, NAN], [-0.2, -1.4, NAN]])


def test_bypass_clip_fraction_is_against_the_sampler_and_matches_the_tokens_the_loss_clipped():
    loss = GRPOConfig(beta=0.0, importance_sampling_mode="bypass").loss()
    logps = LOGPS.clone().requires_grad_(True)
    assert loss.clip_fraction(logps, LOGPS, ADV, MASK, sampling_logps=SAMPLER).item() == pytest.approx(2 / 5)
    assert loss.clip_fraction(logps, LOGPS, ADV, MASK).item() == 0.0  # the trainer's pi_old: ratio 1 everywhere
    # the tokens counted are exactly those the loss took no gradient from (a clipped term is constant)
    loss(logps, None, None, ADV, MASK, sampling_logps=SAMPLER).backward()
    no_gradient = (logps.grad == 0) & MASK.bool()
    assert no_gradient.tolist() == [[True, False, False], [True, False, False]]


def test_at_a_later_iteration_bypass_still_measures_against_the_sampler():
    old = LOGPS - torch.tensor([[0.5, 0.0, 0.0], [0.0, 0.0, 0.0]])  # the trainer's pi_old: one ratio e^0.5 > 1.2
    bypass = GRPOConfig(beta=0.0, importance_sampling_mode="bypass").loss()
    assert bypass.clip_fraction(LOGPS, old, ADV, MASK, sampling_logps=SAMPLER).item() == pytest.approx(2 / 5)
    assert bypass.clip_fraction(LOGPS, old, ADV, MASK).item() == pytest.approx(1 / 5)  # no sampler: the trainer's
    for options in ({"importance_sampling_mode": "token_truncate"},  # a weight: pi_old stays the trainer's
                    {"importance_sampling_mode": "bypass", "importance_sampling_correction": False}):
        loss = GRPOConfig(beta=0.0, **options).loss()
        got = loss.clip_fraction(LOGPS, old, ADV, MASK, sampling_logps=SAMPLER)
        assert got.item() == pytest.approx(1 / 5)
        assert torch.equal(loss.pi_old(old, SAMPLER), old)
    assert torch.equal(bypass.pi_old(old, SAMPLER), torch.where(torch.isnan(SAMPLER), old, SAMPLER))


def test_the_grpo_step_reports_the_bypass_clip_fraction_against_the_sampler():
    task = make_task("pizza")
    torch.manual_seed(0)
    policy = task.load_policy(torch.device("cpu"))
    config = GRPOConfig(learning_rate=task.recommended_learning_rate, group_size=4, sampling_precision="fp32",
                        importance_sampling_mode="bypass")
    algo = GRPO(policy, copy.deepcopy(policy).requires_grad_(False), task, config,
                Sampling(max_new_tokens=task.generation.max_new_tokens), seed=0)
    sample, advantages_of, seen = algo.generate, algo.batch_advantages, {}

    def sampler_one_nat_less_likely(prompts, group_size):  # pi_theta / pi_sampler = e^1 on every token
        rollout = sample(prompts, group_size)
        rollout.sampling_logps = rollout.sampling_logps - 1.0
        seen["mask"] = rollout.completion_mask
        return rollout

    def recorded(rollout, rewards):
        seen["advantages"] = advantages_of(rollout, rewards)
        return seen["advantages"]

    algo.generate, algo.batch_advantages = sampler_one_nat_less_likely, recorded
    metrics = algo.step(task.train_prompts() * 4)
    mask, adv = seen["mask"].float(), seen["advantages"]
    assert (adv > 0).any() and (adv <= 0).any()
    # e^1 > 1.2 clips every token of a completion with A > 0; e^1 > 0.8 none with A <= 0
    want = (mask * (adv > 0).float().unsqueeze(-1)).sum() / mask.sum()
    assert metrics["clipfrac"] == pytest.approx(want.item(), rel=1e-9)
    assert not math.isclose(metrics["clipfrac"], 0.0)
