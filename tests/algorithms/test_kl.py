"""The logged loss by its parts, and a KL column that names its estimator: the parts add up to the loss
that was minimised, asking for them leaves the loss bit for bit as it was, and kl/<estimator> is that estimator's
value, not k3's under another name."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from algorithms import GRPO, PPO, REINFORCE, REINFORCEPP, RLOO, Sampling
from algorithms.kl import KL_PENALTIES, k3_kl
from algorithms.grpo import GRPOConfig
from algorithms.losses import masked_mean_per_sequence, reinforce_loss


def _batch(seed: int = 0, b: int = 8, t: int = 6):
    g = torch.Generator().manual_seed(seed)
    logps = (-torch.rand(b, t, generator=g) * 2).requires_grad_(True)
    old = logps.detach() + 0.1 * torch.randn(b, t, generator=g)
    ref = logps.detach() + 0.2 * torch.randn(b, t, generator=g)
    adv = torch.randn(b, generator=g)
    mask = torch.ones(b, t)
    mask[::2, 4:] = 0
    entropies = torch.rand(b, t, generator=g).requires_grad_(True)
    return logps, old, ref, adv, mask, entropies


@pytest.mark.parametrize("options", [
    {"loss_type": "grpo", "beta": 0.04},
    {"loss_type": "dapo", "beta": 0.04, "entropy_coef": 0.01},
    {"loss_type": "dr_grpo", "beta": 0.1, "kl_loss_type": "k1"},
    {"loss_type": "cispo", "beta": 0.0, "epsilon_high": 5.0},
    {"loss_type": "grpo", "level": "sequence", "beta": 0.04, "kl_loss_type": "low_var_kl", "entropy_coef": -0.02},
])
def test_the_parts_add_up_and_the_loss_is_unchanged(options):
    logps, old, ref, adv, mask, entropies = _batch()
    loss_fn = GRPOConfig(**options).loss(max_completion_length=6)
    plain = loss_fn(logps, old, ref, adv, mask, entropies=entropies)
    loss, parts = loss_fn(logps, old, ref, adv, mask, entropies=entropies, return_parts=True)
    assert torch.equal(loss, plain)  # asking for the parts computes the loss as before
    assert set(parts) == {"policy"} | ({"kl"} if options["beta"] else set()) | ({"entropy"} if options.get("entropy_coef") else set())
    assert sum(parts.values()) == pytest.approx(loss.item(), abs=1e-6)
    if options["beta"]:
        assert parts["kl"] > 0 if options.get("kl_loss_type", "k3") != "k1" else parts["kl"] != 0
        no_kl = GRPOConfig(**{**options, "beta": 0.0}).loss(6)(logps, old, None, adv, mask, entropies=entropies)
        assert parts["policy"] + parts.get("entropy", 0.0) == pytest.approx(no_kl.item(), abs=1e-6)
    if options.get("entropy_coef"):
        assert math.copysign(1, parts["entropy"]) == -math.copysign(1, options["entropy_coef"])


def test_reinforce_parts():
    logps, _, ref, adv, mask, _ = _batch(1)
    loss, parts = reinforce_loss(logps, adv, mask, ref, kl_coef=0.05, return_parts=True)
    assert torch.equal(loss, reinforce_loss(logps, adv, mask, ref, kl_coef=0.05))
    assert parts["policy"] + parts["kl"] == pytest.approx(loss.item(), abs=1e-6) and parts["kl"] > 0
    assert reinforce_loss(logps, adv, mask, return_parts=True)[1].keys() == {"policy"}


@pytest.fixture(scope="module")
def pizza():
    from tasks import make_task

    return make_task("pizza")


def _second_step(cls, task, **options):
    """The metrics of a second step (the first has the policy equal to its reference: every KL 0)."""
    torch.manual_seed(0)
    policy = task.load_policy(torch.device("cpu"))
    config = cls.Config(learning_rate=1e-2, **options)
    ref = copy.deepcopy(policy).requires_grad_(False) if cls.needs_reference(config) else None
    algo = cls(policy, ref, task, config, Sampling(max_new_tokens=task.generation.max_new_tokens), seed=0)
    prompts = task.train_prompts() * config.prompts_per_step
    algo.step(prompts)
    return algo.step(prompts)


def test_grpo_logs_its_parts_and_the_estimator_it_uses(pizza):
    m = _second_step(GRPO, pizza, beta=0.04, kl_loss_type="k1", entropy_coef=0.01)
    assert m["loss/policy"] + m["loss/kl"] + m["loss/entropy"] == pytest.approx(m["loss"], abs=1e-6)
    assert m["loss/entropy"] == pytest.approx(-0.01 * m["entropy"], rel=0.5)  # token-mean vs per-completion mean
    assert "kl" not in m and m["kl/k3"] > 0 and m["kl/k1"] != m["kl/k3"]
    # k1 averages to about k3 on-policy: both estimate the same KL, and neither is 0 after an update
    assert abs(m["kl/k1"]) < 10 * m["kl/k3"] + 1e-3


def test_grpo_at_its_defaults_logs_k3_once_and_no_kl_part_without_beta(pizza):
    m = _second_step(GRPO, pizza, beta=0.0)
    assert m["kl/k3"] == 0.0 and "loss/kl" not in m and "loss/entropy" not in m
    assert m["loss/policy"] == pytest.approx(m["loss"], abs=1e-7)
    m = _second_step(GRPO, pizza, beta=0.04)
    assert [k for k in m if k.startswith("kl/")] == ["kl/k3"] and m["loss/kl"] > 0


@pytest.mark.parametrize("cls, options, used, kl_part", [
    (RLOO, {"beta": 0.05}, "kl/k1", False),
    (REINFORCEPP, {"kl_coef": 0.05, "kl_estimator": "k2"}, "kl/k2", False),
    (REINFORCEPP, {"kl_coef": 0.05, "kl_in_loss": True, "kl_estimator": "k3"}, None, True),
    (REINFORCE, {"beta": 0.05}, None, True),
    (PPO, {"kl_coef": 0.05}, "kl/k1", False),
])
def test_every_algorithm_names_its_kl(pizza, cls, options, used, kl_part):
    m = _second_step(cls, pizza, **options)
    assert m["kl/k3"] > 0 and "kl" not in m
    assert sorted(k for k in m if k.startswith("kl/")) == sorted({"kl/k3"} | ({used} if used else set()))
    assert ("loss/kl" in m) == kl_part
    if kl_part:
        assert m["loss/kl"] > 0 and m["loss/policy"] + m["loss/kl"] == pytest.approx(m["loss"], abs=1e-6)


def test_kl_metric_is_the_named_estimator():
    logps, _, ref, _, mask, _ = _batch(2)
    from algorithms.base import Algorithm

    m = Algorithm.kl_metrics(logps.detach(), ref, mask, "k2")
    assert m["kl/k3"] == pytest.approx(masked_mean_per_sequence(k3_kl(logps.detach(), ref), mask).mean().item())
    assert m["kl/k2"] == pytest.approx(masked_mean_per_sequence(KL_PENALTIES["k2"](logps.detach(), ref), mask).mean().item())
    assert m["kl/k2"] != m["kl/k3"]
    assert Algorithm.kl_metrics(logps.detach(), None, mask, "k1") == {"kl/k3": 0.0, "kl/k1": 0.0}
