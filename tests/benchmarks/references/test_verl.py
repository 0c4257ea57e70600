"""verl 0.9.1's rollout correction against hand-computed values: Geo-RS bands the reciprocal ratio, bypass mode
takes the rollout's log-probs as the old ones."""

import pytest

from benchmarks.references import verl
from tests.benchmarks.references.conftest import t


def test_verl_geo_rs_bands_the_reciprocal_ratio(frameworks, ratios):
    old, sampling, mask = ratios
    kept = verl.rollout_rejection_mask(old, sampling, mask, "seq_mean_k1", "0.99_1.01")
    assert kept.sum(-1).tolist() == [2.0, 0.0, 1.0]
    # pi_rollout / pi_old in [0.97, 0.99]: row 1 (1/1.02 = 0.980) kept, row 2 (1/1.005) rejected
    reciprocal = verl.rollout_rejection_mask(old, sampling, mask, "seq_mean_k1", "0.97_0.99")
    assert reciprocal.sum(-1).tolist() == [0.0, 2.0, 0.0]


def test_verl_bypass_takes_the_rollout_as_the_old_policy(frameworks, ratios):
    old, sampling, mask = ratios
    logps, adv = old + 0.1, t([1.0, -1.0, 2.0])
    bypass = verl.bypass_loss(logps, sampling, adv, mask)
    assert bypass.item() == pytest.approx(verl.policy_loss("vanilla", logps, sampling, adv, mask).item(), abs=1e-15)
    assert bypass.item() != pytest.approx(verl.policy_loss("vanilla", logps, old, adv, mask).item())
