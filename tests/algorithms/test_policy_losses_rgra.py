"""RGRA's policy loss (arXiv 2603.18756): ``rgra``, GRPO's objective without the importance ratio and its clip, by
hand.

The expected numbers are worked out in the comments, so a loss that kept the ratio or the clip, dropped the KL
term or aggregated otherwise than GRPO fails.
"""

import math

import pytest
import torch

from algorithms.grpo import GRPOConfig

# Two completions: row 1 has 2 active tokens (the third is padding with junk), row 2 has 3.
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
LOGPS = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -1.5, -1.0]])
ADV = torch.tensor([2.0, -1.0])


def _loss_and_grad(loss_type, old_logps, **kw):
    logps = LOGPS.clone().requires_grad_(True)
    loss = GRPOConfig(loss_type=loss_type, beta=0.0, **kw).loss()(logps, old_logps, None, ADV, MASK)
    loss.backward()
    return loss.item(), logps.grad


def test_rgra_is_minus_a_log_pi_with_grpo_s_aggregation():
    # row 1: mean over its 2 tokens of -2 * logp = -2 * (-1 - 2) / 2 = 3; row 2: -(-1) * (-0.5 - 1.5 - 1) / 3 = -1;
    # the mean over completions: (3 - 1) / 2 = 1 (a token mean over the batch would give (6 - 3) / 5 = 0.6)
    value, grad = _loss_and_grad("rgra", None)
    assert value == pytest.approx(1.0)
    # d/dlogp = -A_i / |o_i| / B: row 1 -2 / 2 / 2 = -0.5 per active token, row 2 1 / 3 / 2 = 1/6; padding 0
    assert grad.flatten().tolist() == pytest.approx([-0.5, -0.5, 0.0, 1 / 6, 1 / 6, 1 / 6])


def test_rgra_has_grpo_s_gradient_on_policy_and_no_ratio_or_clip_off_policy():
    # mu = 1: GRPO's ratio is 1 in value and never clipped, so the two gradients are one, bit for bit (the values
    # are not: GRPO's is -mean(A) = -0.5 here, RGRA's carries log pi)
    rgra_value, rgra = _loss_and_grad("rgra", None)
    grpo_value, grpo = _loss_and_grad("grpo", None)
    assert torch.equal(rgra, grpo) and (rgra_value, grpo_value) == pytest.approx((1.0, -0.5))
    # a later update: the policy has moved by +0.5 on every token (ratio e^0.5 = 1.65, beyond 1 + 0.2)
    old = LOGPS - 0.5
    _, rgra = _loss_and_grad("rgra", old)
    _, grpo = _loss_and_grad("grpo", old)
    # RGRA does not see pi_old: the same gradient as on policy
    assert rgra.flatten().tolist() == pytest.approx([-0.5, -0.5, 0.0, 1 / 6, 1 / 6, 1 / 6])
    # GRPO: row 1 (A > 0) is clipped at 1.2 A, no gradient; row 2 (A < 0) takes the unclipped -r A, whose
    # gradient is weighted by r = e^0.5: e^0.5 / 6
    assert grpo[0].abs().max().item() == 0.0
    assert grpo[1].tolist() == pytest.approx([math.exp(0.5) / 6] * 3, rel=1e-6)


def test_rgra_keeps_the_kl_term():
    ref = LOGPS - 0.3  # k3 per token: e^{-0.3} + 0.3 - 1 = 0.040818...; its row means are the same 0.040818
    logps = LOGPS.clone().requires_grad_(True)
    with_kl = GRPOConfig(loss_type="rgra", beta=0.04).loss()(logps, None, ref, ADV, MASK)
    k3 = math.exp(-0.3) + 0.3 - 1
    assert with_kl.item() == pytest.approx(1.0 + 0.04 * k3, rel=1e-6)


def test_grpo_takes_rgra_and_rgra_positive_by_name():
    config = GRPOConfig(learning_rate=1e-4, loss_type="rgra", advantage_estimator="rgra_positive", mu=2)
    config.validate()
    assert config.policy_loss().name == "rgra" and config.estimator().name == "rgra_positive"
