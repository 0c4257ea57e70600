"""GRPO's loss (``GRPOConfig.loss()``) and group_advantages against values computed by hand on small ragged tensors."""

import math

import pytest
import torch

from algorithms.grpo import GRPOConfig
from algorithms.policy_losses import clip_fraction

from algorithms.losses import group_advantages

# Two completions of lengths 3 and 1 (ragged), T = 3.
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
LOGPS = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -9.0, -9.0]])
OLD = torch.tensor([[-1.0, -2.5, -0.2], [-1.0, -9.0, -9.0]])
REF = torch.tensor([[-1.2, -2.0, -0.7], [-1.5, -9.0, -9.0]])
ADV = torch.tensor([1.0, -2.0])


def by_hand_per_token(eps=0.2, eps_high=None, level="token"):
    """The clipped surrogate of every active token, written out without tensors."""
    eps_high = eps if eps_high is None else eps_high
    rows = []
    for i in range(2):
        active = [t for t in range(3) if MASK[i, t] == 1]
        log_ratios = [float(LOGPS[i, t] - OLD[i, t]) for t in active]
        if level == "sequence":
            ratios = [math.exp(sum(log_ratios) / len(log_ratios))] * len(active)
        else:
            ratios = [math.exp(x) for x in log_ratios]
        a = float(ADV[i])
        rows.append([-min(r * a, min(max(r, 1 - eps), 1 + eps_high) * a) for r in ratios])
    return rows


def by_hand_kl():
    rows = []
    for i in range(2):
        row = []
        for t in range(3):
            if MASK[i, t] == 1:
                d = float(REF[i, t] - LOGPS[i, t])
                row.append(math.exp(d) - d - 1)
        rows.append(row)
    return rows


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_grpo_loss_matches_hand_computation(level, loss_type, beta):
    surrogate = by_hand_per_token(level=level)
    kl = by_hand_kl()
    per_token = [[s + beta * k for s, k in zip(srow, krow)] for srow, krow in zip(surrogate, kl)]
    if loss_type == "grpo":
        expected = sum(sum(row) / len(row) for row in per_token) / 2
    elif loss_type in ("bnpo", "dapo"):
        expected = sum(sum(row) for row in per_token) / 4  # 4 active tokens
    else:  # dr_grpo: B * max_completion_length = 2 * 5
        expected = sum(sum(row) for row in per_token) / 10
    got = GRPOConfig(level=level, loss_type=loss_type, beta=beta).loss(5)(LOGPS, OLD, REF, ADV, MASK)
    assert got.item() == pytest.approx(expected, abs=1e-6)


def test_first_completion_worked_example():
    # Token ratios exp(0)=1, exp(0.5)=1.6487 -> clipped to 1.2 (A>0), exp(-0.3)=0.7408 (unclipped since A>0 takes min).
    # Completion 1 (A=1): -(1 + 1.2 + 0.7408) / 3 = -0.98027; completion 2 (A=-2, ratio exp(-0.5)=0.6065):
    # min(0.6065*-2, 0.8*-2) = -1.6 -> +1.6. grpo mean = (-0.98027 + 1.6) / 2 = 0.309863.
    got = GRPOConfig(beta=0.0).loss()(LOGPS, OLD, None, ADV, MASK)
    assert got.item() == pytest.approx(((-(1 + 1.2 + math.exp(-0.3)) / 3) + 1.6) / 2, abs=1e-6)


def test_epsilon_high_widens_upper_clip():
    got = GRPOConfig(epsilon_high=0.28, loss_type="bnpo", beta=0.0).loss()(LOGPS, OLD, None, ADV, MASK)
    expected = sum(sum(r) for r in by_hand_per_token(eps_high=0.28)) / 4
    assert got.item() == pytest.approx(expected, abs=1e-6)
    bnpo = GRPOConfig(loss_type="bnpo", beta=0.0).loss()
    assert got.item() != pytest.approx(bnpo(LOGPS, OLD, None, ADV, MASK).item(), abs=1e-4)


def test_kl_bias_correction_weights_kl_by_ratio():
    ratio = torch.exp(LOGPS - OLD)
    d = REF - LOGPS
    kl = (torch.exp(d) - d - 1) * ratio
    surrogate = torch.tensor([[v for v in row] + [0.0] * (3 - len(row)) for row in by_hand_per_token()])
    expected = ((surrogate + 0.1 * kl) * MASK).sum() / MASK.sum()
    got = GRPOConfig(beta=0.1, loss_type="bnpo", kl_bias_correction=True).loss()(LOGPS, OLD, REF, ADV, MASK)
    assert got.item() == pytest.approx(expected.item(), abs=1e-6)


def test_mu1_loss_is_zero_but_gradient_is_not():
    logps = LOGPS.clone().requires_grad_(True)
    adv = group_advantages(torch.tensor([4.0, 0.0, 0.0, 4.0]), group_size=2)[:2]  # (+0.707, -0.707)
    loss = GRPOConfig(beta=0.0, loss_type="grpo").loss()(logps, None, None, adv, MASK)
    assert abs(loss.item()) <= 1e-7
    loss.backward()
    # d loss / d logp_{i,t} = -A_i / (B |o_i|) on active tokens: the REINFORCE gradient, per-token averaged.
    expected = -adv.unsqueeze(1) * MASK / MASK.sum(1, keepdim=True) / 2
    torch.testing.assert_close(logps.grad, expected, rtol=1e-6, atol=1e-7)
    assert logps.grad.abs().sum() > 0


def test_group_advantages_by_hand():
    rewards = torch.tensor([1.0, 2.0, 3.0, 0.0, 0.0, 4.0])
    got = group_advantages(rewards, group_size=3)
    # group 1: mean 2, unbiased std 1 -> (-1, 0, 1)/(1+1e-4); group 2: mean 4/3, std sqrt(16/3)
    s2 = math.sqrt(((4 / 3) ** 2 * 2 + (8 / 3) ** 2) / 2)
    expected = [-1 / 1.0001, 0.0, 1 / 1.0001, -(4 / 3) / (s2 + 1e-4), -(4 / 3) / (s2 + 1e-4), (8 / 3) / (s2 + 1e-4)]
    assert got.tolist() == pytest.approx(expected, abs=1e-6)
    assert group_advantages(rewards, 3, scale="none").tolist() == pytest.approx([-1, 0, 1, -4 / 3, -4 / 3, 8 / 3], abs=1e-6)
    batch_std = rewards.std().item()
    assert group_advantages(rewards, 3, scale="batch").tolist() == pytest.approx(
        [v / (batch_std + 1e-4) for v in [-1, 0, 1, -4 / 3, -4 / 3, 8 / 3]], abs=1e-6)


def test_equal_rewards_give_zero_advantages_never_nan():
    for scale in ("group", "batch", "none"):
        adv = group_advantages(torch.full((8,), 4.0), group_size=4, scale=scale)
        assert torch.equal(adv, torch.zeros(8))


def test_clip_fraction_counts_binding_side_only():
    # token ratios: [1, 1.6487, 0.7408 | 0.6065]; A = [1, -2]: binding are 1.6487 (>1.2, A>0) and 0.6065 (<0.8, A<0)
    assert clip_fraction(LOGPS, OLD, ADV, MASK).item() == pytest.approx(2 / 4)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="loss_type"):
        GRPOConfig(loss_type="ppo").loss()
    with pytest.raises(ValueError, match="level"):
        GRPOConfig(level="word", beta=0.0).loss()(LOGPS, OLD, None, ADV, MASK)
    with pytest.raises(ValueError, match="ref_logps"):
        GRPOConfig(beta=0.1).loss()(LOGPS, OLD, None, ADV, MASK)
    with pytest.raises(ValueError, match="max_completion_length"):
        GRPOConfig(loss_type="dr_grpo", beta=0.0).loss()(LOGPS, OLD, None, ADV, MASK)
