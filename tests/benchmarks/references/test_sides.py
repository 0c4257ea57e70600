"""The per-algorithm part of every comparison with TRL (benchmarks/references/sides.py's ``PAIRINGS``): each
workload's settings in our names as its algorithm's config takes them, and the same-batch check and the default
workloads from one entry."""

import dataclasses

from algorithms import ALGORITHMS
from benchmarks.references import sides
from benchmarks.references.sides import PAIRINGS, WORKLOADS, default_workloads


def test_every_workload_has_its_algorithms_pairing_and_its_settings_are_the_configs_fields():
    assert {w.algo for w in WORKLOADS.values()} == set(PAIRINGS) == {"grpo", "rloo"}
    for w in WORKLOADS.values():
        fields = {f.name for f in dataclasses.fields(ALGORITHMS[w.algo].Config)}
        assert set(w.settings()) <= fields, (w.name, set(w.settings()) - fields)


def test_each_algorithm_names_its_settings_in_its_own_words():
    grpo, rloo = WORKLOADS["chain_sum-mu2"].settings(), WORKLOADS["pizza-rloo"].settings()
    assert grpo == {"group_size": 8, "prompts_per_step": 1, "mu": 2, "beta": 0.04, "learning_rate": None,
                    "epsilon": 0.2, "max_grad_norm": 1.0, "loss_type": "grpo", "scale_rewards": "group",
                    "kl_bias_correction": False}
    assert rloo == {"group_size": 8, "prompts_per_step": 1, "mu": 1, "beta": 0.05, "learning_rate": None,
                    "epsilon": 0.2, "max_grad_norm": 1.0}


def test_the_same_batch_check_and_the_default_workloads_come_from_the_pairing():
    assert PAIRINGS["grpo"].same_batch is sides.same_batch_check
    assert PAIRINGS["rloo"].same_batch is sides.same_batch_check_rloo
    assert default_workloads("rloo") == ["pizza-rloo"]  # its first
    assert default_workloads("grpo") == [name for name, w in WORKLOADS.items() if w.algo == "grpo"]  # all of them

