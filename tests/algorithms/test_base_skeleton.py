"""The step skeleton's shared pieces (algorithms/base.py): one metric bookkeeping (``StepLog``), one name per concept
inside the code (``group_size``, ``kl_coef``) while the settings keep the names runs recorded, one loss mask."""

from __future__ import annotations

import copy

import pytest
import torch

from algorithms import ALGORITHMS, Algorithm
from algorithms.base import Sampling, StepLog
from algorithms.dpo import DPOConfig
from algorithms.ppo import PPOConfig
from algorithms.reinforce import REINFORCEConfig
from algorithms.reinforce_pp import REINFORCEPPConfig
from algorithms.rloo import RLOOConfig

# Values whose float sums depend on the order they are added in: a bookkeeping that summed otherwise would show.
POLICY = [0.1, 1e16, -1e16, 0.3]
KL = [0.7, 1e-17, 0.2, -0.9]


def test_step_log_means_are_the_sums_each_step_kept_bit_for_bit():
    log = StepLog()
    for policy, kl in zip(POLICY, KL):
        log.add_update({"loss/policy": policy, "loss/kl": kl, "skipped_update": 0.0})
    log.add({"return/mean": 2.5})
    sums = {"loss/policy": 0.0, "loss/kl": 0.0}  # REINFORCE++'s and PPO's running sums, divided by the updates
    for policy, kl in zip(POLICY, KL):
        sums["loss/policy"] += policy
        sums["loss/kl"] += kl
    means = {k: v / len(POLICY) for k, v in sums.items()}
    assert log.metrics() == {**means, "skipped_update": 0.0, "loss": means["loss/policy"] + means["loss/kl"],
                             "return/mean": 2.5}
    assert means["loss/policy"] != sum(sorted(POLICY)) / len(POLICY)  # the order shows in the bits


def test_step_log_per_update_names_are_the_iterations_and_a_recorded_loss_is_kept():
    log = StepLog(per_update=("loss", "grad_norm"))
    for i, policy in enumerate(POLICY):
        log.add_update({"loss": policy, "loss/policy": policy, "grad_norm": float(i), "clipfrac": 0.5})
    metrics = log.metrics()
    # GRPO's and RLOO's per-iteration names, their mean as mean_over_updates took it
    replaced = {f"loss/iter{i}": v for i, v in enumerate(POLICY, 1)}
    replaced.update({f"grad_norm/iter{i}": float(i - 1) for i in range(1, 5)})
    Algorithm.mean_over_updates(replaced, len(POLICY), names=("loss", "grad_norm"))
    assert {k: metrics[k] for k in replaced} == replaced
    assert metrics["loss"] == sum(POLICY) / len(POLICY) and "clipfrac/iter1" not in metrics
    assert set(metrics) == {*replaced, "loss/policy", "clipfrac"}


def test_one_name_inside_for_the_group_size_and_the_kl_coefficient_the_settings_keep_theirs():
    configs = {
        "rloo": RLOOConfig(group_size=3, beta=0.2), "reinforce": REINFORCEConfig(samples_per_prompt=3, beta=0.2),
        "reinforce_pp": REINFORCEPPConfig(samples_per_prompt=3, kl_coef=0.2),
        "ppo": PPOConfig(samples_per_prompt=3, kl_coef=0.2, minibatches=1),
    }
    recorded = {"rloo": {"group_size", "beta"}, "reinforce": {"samples_per_prompt", "beta"},
                "reinforce_pp": {"samples_per_prompt", "kl_coef"}, "ppo": {"samples_per_prompt", "kl_coef"}}
    for name, config in configs.items():
        assert (config.group_size, config.kl_coef) == (3, 0.2), name
        settings = config.settings()  # what a run records, a flag sets and a matrix cell names: unchanged
        internal_only = {"group_size", "kl_coef"} - recorded[name]
        assert recorded[name] <= set(settings) and not internal_only & set(settings)
        assert ALGORITHMS[name].needs_reference(config)
        zero = type(config)(**{**settings, "beta" if "beta" in settings else "kl_coef": 0.0})
        assert zero.kl_coef == 0.0 and not ALGORITHMS[name].needs_reference(zero)
    assert ALGORITHMS["dpo"].needs_reference(DPOConfig())  # DPO's beta is its loss's own scale, not a KL weight


@pytest.fixture(scope="module")
def pizza():
    from tasks import make_task

    return make_task("pizza")


@pytest.mark.parametrize("name, options", [("rloo", {"mask_truncated": True}), ("rloo", {}), ("reinforce_pp", {}),
                                           ("reinforce", {}), ("ppo", {"minibatches": 1})])
def test_one_loss_mask_a_float_of_the_mask_convention_less_truncated_rows_where_asked(pizza, name, options):
    cls = ALGORITHMS[name]
    torch.manual_seed(0)
    policy = pizza.load_policy(torch.device("cpu"))
    config = cls.Config(learning_rate=1e-3, prompts_per_step=2, **options)
    ref = copy.deepcopy(policy).requires_grad_(False) if cls.needs_reference(config) else None
    algo = cls(policy, ref, pizza, config, Sampling(max_new_tokens=6), seed=0)  # 6 tokens: some rows truncated
    batch = algo.collect(pizza.train_prompts() * 2)
    rollout = batch.rollout
    assert batch.mask.dtype == torch.float32 and rollout.num_completions == 2 * config.group_size
    assert rollout.truncated.any() and not rollout.truncated.all()
    kept = ~rollout.truncated if options.get("mask_truncated") else torch.ones_like(rollout.truncated)
    assert torch.equal(batch.mask, rollout.completion_mask.float() * kept.unsqueeze(1))
