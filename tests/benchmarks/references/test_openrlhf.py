"""OpenRLHF 0.11.2's new functions against hand-computed values: the is_correction gate (token and sequence,
ratio and binary_kl) and FlashREINFORCE's batch-mean baseline."""

import pytest
import torch

from benchmarks.references import openrlhf
from tests.benchmarks.references.conftest import t


def test_openrlhf_gate_drops_out_of_band_tokens_and_keeps_the_others_is_weight(frameworks, ratios):
    old, sampling, mask = ratios
    logps, adv = old.clone(), t([1.0, 1.0, 1.0])
    plain = openrlhf.policy_loss(logps, old, adv, mask)
    gated = openrlhf.policy_loss(logps, old, adv, mask, rollout_logps=sampling, level="token", mode="mask",
                                 gating="ratio", threshold=(0.99, 1.01))
    assert plain.item() == pytest.approx(-1.0)
    # only row 2's first token (1.005) survives, weighted by its ratio; the token mean is over 5 tokens
    assert gated.item() == pytest.approx(-1.005 / 5)
    seq = openrlhf.policy_loss(logps, old, adv, mask, rollout_logps=sampling, level="seq", mode="mask",
                               gating="ratio", threshold=(0.99, 1.01))
    assert seq.item() == pytest.approx(-(1.02 + 0.98 + 1.005) / 5)  # rows 0 and 2 kept whole, at their IS weights
    nothing = openrlhf.policy_loss(logps, old, adv, mask, rollout_logps=sampling, level="seq", mode="mask",
                                   gating="binary_kl", threshold=(0.0, 0.0))
    assert nothing.item() == 0.0


def test_openrlhf_flash_reinforce_subtracts_the_batch_mean(frameworks):
    rewards, mask = t([0.0, 1.0, 1.0, 1.0]), torch.ones(4, 2, dtype=torch.float64)
    adv, _ = openrlhf.advantages("flash_reinforce", rewards, mask, group_size=2)
    assert torch.allclose(adv[:, 0], t([-0.75, 0.25, 0.25, 0.25]))  # a group mean would give -0.5, 0.5, 0, 0
