"""ms-swift 4.6.0's REAL and FIPO policy losses, by hand.

The expected numbers are plain-Python arithmetic on the paper's equations (math.exp, math.log), so a wrong
score (a sum instead of the mean log-ratio), a wrong normaliser (the valid groups instead of all of them), a
wrong discount direction (past instead of future tokens) or a padding leak fails.
"""

import dataclasses
import math

import pytest
import torch

from algorithms.grpo import GRPOConfig
from algorithms.policy_losses import fipo_influence_weights, real_group_losses


def softplus(x):
    return math.log(1 + math.exp(x))


# --- REAL ---------------------------------------------------------------------------------------------------
# Two groups of G = 2. Group 1: row 1 has log-ratios [0.1, 0.3] (S = 0.2, the mean, not the sum 0.4), A = +1;
# row 2 has [-0.4] and junk padding (S = -0.4), A = -1. Group 2 ties (A = 0, 0): no pair, L = 0.
MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
OLD = torch.tensor([[-1.0, -2.0], [-1.0, -7.0], [-0.5, -0.5], [-0.7, -0.2]])
LOG_RATIO = torch.tensor([[0.1, 0.3], [-0.4, 5.0], [0.2, -0.1], [0.0, 0.3]])
ADV = torch.tensor([1.0, -1.0, 0.0, 0.0])
# tau 0.5: L_1 = log(1 + e^{S_neg / tau}) + log(1 + e^{-S_pos / tau}) = softplus(-0.8) + softplus(-0.4)
L1 = softplus(-0.8) + softplus(-0.4)  # 0.884116


def test_real_group_losses_by_hand():
    got = real_group_losses(torch.tensor([0.2, -0.4, 0.1, 0.0]), ADV, 2, 0.5)
    assert got.tolist() == pytest.approx([L1, 0.0], rel=1e-6)
    # two positives and one negative: log(1 + e^{0.3/0.5}) + log(1 + e^{-0.1/0.5} + e^{-0.5/0.5})
    got = real_group_losses(torch.tensor([0.1, 0.5, 0.3]), torch.tensor([2.0, 1.0, -3.0]), 3, 0.5)
    assert got.item() == pytest.approx(softplus(0.6) + math.log(1 + math.exp(-0.2) + math.exp(-1.0)), rel=1e-6)


def test_real_loss_averages_over_all_groups_with_the_bounded_gradient():
    logps = (OLD + LOG_RATIO).requires_grad_(True)
    loss = GRPOConfig(loss_type="real", beta=0.0, group_size=2).loss()(logps, OLD, None, ADV, MASK)
    assert loss.item() == pytest.approx(L1 / 2, rel=1e-6)  # over both groups (the tied one counts 0), not L1
    loss.backward()
    # dL/dS_pos = -(1/tau) sigmoid(-S_pos / tau) = -2 sigmoid(-0.4); dS/dlogp = 1/2 per token; 1/2 for n = 2 groups
    d_pos = -2 / (1 + math.exp(0.4)) / 2 / 2
    # dL/dS_neg = (1/tau) sigmoid(S_neg / tau) = 2 sigmoid(-0.8), one token, 1/2 for n = 2 groups
    d_neg = 2 / (1 + math.exp(0.8)) / 2
    assert logps.grad[0].tolist() == pytest.approx([d_pos, d_pos], rel=1e-5)
    assert logps.grad[1].tolist() == pytest.approx([d_neg, 0.0], rel=1e-5)  # padding: no gradient
    assert logps.grad[2:].abs().max().item() == 0.0  # the tied group has no pair: no gradient


def test_real_tau_and_on_policy_value():
    logps = OLD + LOG_RATIO
    at_1 = GRPOConfig(loss_type="real", beta=0.0, group_size=2, real_tau=1.0).loss()(logps, OLD, None, ADV, MASK)
    assert at_1.item() == pytest.approx((softplus(-0.4) + softplus(-0.2)) / 2, rel=1e-6)
    # mu = 1: S = 0 in value, L_g = 2 log 2 per valid group
    on_policy = GRPOConfig(loss_type="real", beta=0.0, group_size=2).loss()(logps, None, None, ADV, MASK)
    assert on_policy.item() == pytest.approx(2 * math.log(2) / 2, rel=1e-6)
    with pytest.raises(ValueError, match="group_size"):  # a loss built without it (GRPO's always has it)
        dataclasses.replace(GRPOConfig(loss_type="real", beta=0.0).loss(), group_size=None)(logps, OLD, None, ADV, MASK)


# --- FIPO ---------------------------------------------------------------------------------------------------
# decay_rate 1: gamma = 2^-1 = 0.5. Row 1 (A = +1) log-ratios [0.1, 0.2, -0.05]; row 2 (A = -1) [1.5, 0.3] and
# padding holding 5.0, which must not count.
F_MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
F_LOG_RATIO = torch.tensor([[0.1, 0.2, -0.05], [1.5, 0.3, 5.0]])
F_ADV = torch.tensor([[1.0], [-1.0]])
# future KL, discounting LATER tokens: row 1 [0.1 + 0.5*0.2 + 0.25*(-0.05), 0.2 + 0.5*(-0.05), -0.05]
FKL_1 = [0.1875, 0.175, -0.05]
FKL_2 = [1.5 + 0.5 * 0.3, 0.3, 0.0]  # [1.65, 0.3], padding 0


def weights(**kw):
    options = dict(decay_rate=1.0, clip_range=None, clip_high_only=True, safety_threshold=None)
    options.update(kw)
    return fipo_influence_weights(F_LOG_RATIO, torch.exp(F_LOG_RATIO), F_ADV, F_MASK, **options)


def test_fipo_influence_weight_is_the_discounted_future_kl():
    raw = weights()
    assert raw[0].tolist() == pytest.approx([math.exp(v) for v in FKL_1], rel=1e-6)
    assert raw[1].tolist() == pytest.approx([math.exp(1.65), math.exp(0.3), 1.0], rel=1e-6)
    # ms-swift's defaults: clipped to [1, 1.2]
    assert weights(clip_range=0.2)[0].tolist() == pytest.approx([1.2, math.exp(0.175), 1.0], rel=1e-6)
    assert weights(clip_range=0.2, clip_high_only=False)[0].tolist() == pytest.approx(
        [1.2, math.exp(0.175), math.exp(-0.05)], rel=1e-6)
    # safety: row 2's first token has A < 0 and ratio e^1.5 = 4.48 > 4: its weight capped into [0.8, 1]; the second
    # token's ratio e^0.3 is under 4 and keeps e^0.3; row 1 has A > 0, untouched
    safe = weights(safety_threshold=4.0)
    assert safe[1].tolist() == pytest.approx([1.0, math.exp(0.3), 1.0], rel=1e-6) and torch.equal(safe[0], raw[0])
    assert torch.equal(weights(safety_threshold=0.0), raw)  # 0: off, as None
    # delta 1.3: tokens whose ratio exceeds it add nothing (row 2's both: e^1.5 and e^0.3 = 1.35)
    capped = weights(delta=1.3)
    assert capped[1].tolist() == pytest.approx([1.0, 1.0, 1.0]) and torch.equal(capped[0], raw[0])
    assert math.isclose(2.0 ** (-1 / 32), 0.978572, rel_tol=1e-6)  # the default half-life of 32 tokens


def test_fipo_loss_is_dapo_weighted_and_dapo_on_policy():
    old = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]])
    logps = old + F_LOG_RATIO
    fipo = GRPOConfig(loss_type="fipo", beta=0.0, fipo_decay_rate=1.0).loss()(logps, old, None, F_ADV.view(-1), F_MASK)
    # row 1 (A = 1): -min(r, clip(r, 0.8, 1.2)) = -[e^0.1, 1.2, e^-0.05] times w = [1.2, e^0.175, 1]
    row1 = [-math.exp(0.1) * 1.2, -1.2 * math.exp(0.175), -math.exp(-0.05)]
    # row 2 (A = -1): -min(-r, -clip(r)) = max(r, clip(r)) = [e^1.5, e^0.3] times w = [safety: 1.0, 1.2 (clip of e^0.3)]
    row2 = [math.exp(1.5) * 1.0, math.exp(0.3) * 1.2]
    assert fipo.item() == pytest.approx(sum(row1 + row2) / 5, rel=1e-6)  # token mean over 5 active tokens
    dapo = GRPOConfig(loss_type="dapo", beta=0.0).loss()(logps, old, None, F_ADV.view(-1), F_MASK)
    assert not math.isclose(fipo.item(), dapo.item(), rel_tol=1e-3)
    on_policy = [GRPOConfig(loss_type=t, beta=0.0).loss()(logps, None, None, F_ADV.view(-1), F_MASK)
                 for t in ("fipo", "dapo")]
    assert torch.equal(on_policy[0], on_policy[1])


# --- the options are GRPO settings --------------------------------------------------------------------------


@pytest.mark.parametrize("member, option, value, refused", [
    ("real", "real_tau", 0.25, (0.0, "real_tau must be > 0")),
    ("fipo", "fipo_decay_rate", 8.0, (-1.0, "fipo_decay_rate must be > 0")),
    ("fipo", "fipo_clip_range", 0.1, (1.5, r"fipo_clip_range must be in \[0, 1\)")),
])
def test_real_and_fipo_options_are_settings(grpo_member_option, member, option, value, refused):
    config = grpo_member_option("loss_type", member, option, value, refused)
    assert getattr(config.policy_loss().options, option) == value


def help_section(run_cli, capsys, heading):
    """The lines of ``run --algo grpo --help`` under ``heading``, up to the next option group."""
    with pytest.raises(SystemExit):
        run_cli("run", "--algo", "grpo", "--help")
    out = capsys.readouterr().out
    start = out.index(heading)
    end = out.find("\n\n", start)
    return out[start:end if end > 0 else None]


def test_run_help_lists_each_option_under_its_loss(run_cli, capsys):
    assert "--real-tau" in help_section(run_cli, capsys, "grpo options of loss_type real:")
    fipo = help_section(run_cli, capsys, "grpo options of loss_type fipo:")
    for flag in ("--fipo-decay-rate", "--fipo-clip-range", "--fipo-clip-high-only", "--fipo-safety-threshold"):
        assert flag in fipo
