"""SkyRL 0.4.0's adapter against hand-computed values: maxrl (the group mean, not the std), the sequence masks
(geometric, product, outlier tokens; padding left out) and ppo_policy_loss with a mask applied."""

import pytest
import torch

from benchmarks.references import skyrl
from tests.benchmarks.references.conftest import t


def test_skyrl_maxrl_divides_by_the_group_mean(frameworks):
    rewards, mask = t([0.0, 1.0, 1.0, 0.5]), torch.ones(4, 3, dtype=torch.float64)
    adv = skyrl.advantages("maxrl", rewards, mask, group_size=2)
    expected = t([-0.5 / (0.5 + 1e-6), 0.5 / (0.5 + 1e-6), 0.25 / (0.75 + 1e-6), -0.25 / (0.75 + 1e-6)])
    assert torch.allclose(adv, expected.unsqueeze(-1).expand(4, 3), atol=1e-12)  # the std would give +-0.707
    assert torch.equal(skyrl.advantages("maxrl", rewards, mask, group_size=1)[:, 0], rewards)  # a lone completion
    assert "maxrl" in skyrl.registered()["estimators"]


def test_skyrl_sequence_masks_band_the_geometric_mean_the_product_and_each_token(frameworks, ratios):
    old, sampling, mask = ratios
    geometric = skyrl.sequence_mask(old, sampling, mask, "geometric", geo_mask_low=0.99, geo_mask_high=1.01)
    assert geometric.view(-1).tolist() == [1.0, 0.0, 1.0]  # padding does not count: row 2 is kept
    product = skyrl.sequence_mask(old, sampling, mask, "product", product_mask_low=0.99, product_mask_high=1.03)
    assert product.view(-1).tolist() == [1.0, 0.0, 1.0]  # row 1's product 1.0404 is out, its geometric mean too
    outlier = skyrl.outlier_token_mask(old, sampling, mask, low=0.99, high=1.01)
    assert outlier.view(-1).tolist() == [0.0, 0.0, 1.0]  # row 0's mean is fine, its tokens are not
    assert skyrl.outlier_token_mask(old, sampling, mask, high=1.01).view(-1).tolist() == [0.0, 0.0, 1.0]
    assert skyrl.outlier_token_mask(old, sampling, mask, low=0.99).view(-1).tolist() == [0.0, 1.0, 1.0]


def test_skyrl_policy_loss_applies_the_mask_after_scaling_by_every_token(frameworks, ratios):
    old, sampling, mask = ratios
    adv = t([1.0, 1.0, 1.0])
    plain = skyrl.policy_loss(old, old, sampling, adv, mask)
    masked = skyrl.policy_loss(old, old, sampling, adv, mask, sequence_mask_metric="geometric")
    assert plain.item() == pytest.approx(-1.0)  # ratio 1: the token mean of -A
    assert masked.item() == pytest.approx(-3 / 5)  # row 1's two tokens dropped, still divided by 5 tokens


def test_skyrl_reward_kl_penalty_is_the_trainers_own_shaping(frameworks):
    logps, ref = torch.zeros(2, 2, dtype=torch.float64), t([[-0.1, 0.2], [0.3, 9.0]])
    mask = t([[1, 1], [1, 0]])
    shaped = skyrl.reward_kl_penalty(t([1.0, 0.5]), logps, ref, mask, kl_coef=0.5)
    # k1 = log pi - log pi_ref per active token; the score on the last active one; padding untouched
    assert torch.allclose(shaped, t([[-0.05, 1.0 + 0.1], [0.5 + 0.15, 0.0]]), atol=1e-12)
    k3 = skyrl.approx_kl(t([[0.0]]), t([[30.0]]), "k3")
    assert k3.item() == 10.0  # clamped, as verl's low_var_kl (the log-ratio to 20 first)
