"""The advantage-estimator and policy-loss registries, and verl's estimators, losses and knobs.

Every expected number is worked out by hand in the comments (plain Python, no tensors), so a wrong
implementation fails; edge cases: tied rewards, one token, masked-out tokens; the registries refuse a
taken name, report an unknown one in one line with the choices, and take a plug-in at runtime.
"""

import json
import math

import pytest
import torch

from algorithms.estimators import ADVANTAGE_ESTIMATORS, advantage_estimator, advantages, register_advantage_estimator
from algorithms.grpo import GRPO, GRPOConfig
from algorithms.kl import KL_PENALTIES
from algorithms.losses import group_advantages, rloo_advantages
from algorithms.policy_losses import (
    LOSS_AGGREGATIONS, POLICY_LOSSES, entropy_bonus_loss, policy_loss, register_policy_loss,
)

# Two completions of lengths 3 and 1, T = 3; the padding holds junk (-9) that must not matter.
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
LOGPS = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -9.0, -9.0]])
OLD = torch.tensor([[-1.0, -2.5, -0.2], [-1.0, -9.0, -9.0]])  # log-ratios: [0, 0.5, -0.3], [-0.5]
ADV = torch.tensor([1.0, -2.0])


def est(name, rewards, group_size, **kw):
    return advantages(name, torch.tensor(rewards), group_size=group_size, **kw).tolist()


# --- advantage estimators, by hand ------------------------------------------------------------------------


def test_grpo_and_rloo_are_the_existing_functions_bit_for_bit():
    rewards = torch.tensor([0.3, 1.0, 0.0, 0.7, 0.2, 0.2, 0.2, 0.2])
    for scale in ("group", "batch", "none"):
        got = advantages("grpo", rewards, group_size=4, scale=scale, lengths=torch.ones(8))
        assert torch.equal(got, group_advantages(rewards, 4, scale))
    assert torch.equal(advantages("rloo", rewards, group_size=4, lengths=torch.ones(8)), rloo_advantages(rewards, 4))


def test_remax_subtracts_the_greedy_reward():
    # A_i = r_i - r_greedy: [1 - 0.5, 0 - 0.5, 0.5 - 0.5]
    assert est("remax", [1.0, 0.0, 0.5], 3, baseline_rewards=torch.tensor([0.5, 0.5, 0.5])) == pytest.approx([0.5, -0.5, 0.0])
    with pytest.raises(ValueError, match="baseline_rewards"):
        est("remax", [1.0], 1)


def test_gpg_scales_by_the_valid_sample_ratio():
    # B = 8, nonzero rewards: 1 + 4 = 5, alpha = 8 / 5 = 1.6. Group 1 mean 0.25: 1.6 * [0.75, -0.25, -0.25, -0.25]
    # = [1.2, -0.4, -0.4, -0.4]; group 2 ties (all 1): exactly 0.
    got = est("gpg", [1.0, 0, 0, 0, 1, 1, 1, 1], 4)
    assert got[:4] == pytest.approx([1.2, -0.4, -0.4, -0.4])
    assert got[4:] == [0.0] * 4
    # every reward 0: alpha = 8 / max(1, 0) = 8, but nothing to centre: all 0
    assert est("gpg", [0.0] * 8, 4) == [0.0] * 8


def test_opo_uses_the_length_weighted_baseline():
    # lengths [2, 4, 6], rewards [1, 0, 1]: b = (2*1 + 4*0 + 6*1) / 12 = 2/3 -> [1/3, -2/3, 1/3].
    # Second group ties at 0.3 (whatever the lengths): exactly 0.
    got = est("opo", [1.0, 0.0, 1.0, 0.3, 0.3, 0.3], 3, lengths=torch.tensor([2.0, 4.0, 6.0, 1.0, 2.0, 3.0]))
    assert got[:3] == pytest.approx([1 / 3, -2 / 3, 1 / 3])
    assert got[3:] == [0.0, 0.0, 0.0]
    # equal lengths: the plain group mean (0.5 for [1, 0])
    assert est("opo", [1.0, 0.0], 2, lengths=torch.tensor([5.0, 5.0])) == [0.5, -0.5]


def test_grpo_passk_rewards_only_the_best_by_its_margin():
    rewards = [0.2, 0.9, 0.5, 0.1]
    # unscaled: best is index 1, margin 0.9 - 0.5 = 0.4; every other completion 0
    assert est("grpo_passk", rewards, 4, scale="none") == pytest.approx([0, 0.4, 0, 0])
    # group std (unbiased): mean 0.425, squared deviations 0.050625 + 0.225625 + 0.005625 + 0.105625 = 0.3875,
    # / 3 -> std = sqrt(0.129166...) = 0.35940; 0.4 / (0.35940 + 1e-6) = 1.11296
    std = math.sqrt(0.3875 / 3)
    assert est("grpo_passk", rewards, 4, scale="group") == pytest.approx([0, 0.4 / (std + 1e-6), 0, 0], rel=1e-5)
    # the two best tie: margin 0, nobody is pushed; a fully tied group likewise
    assert est("grpo_passk", [1.0, 1.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5], 4) == [0.0] * 8


def test_reinforce_pp_estimators_whiten_over_tokens():
    # rewards [1, 0], lengths [3, 1]: token-weighted mean (3*1 + 1*0) / 4 = 0.75, biased variance
    # (3 * 0.25^2 + 0.75^2) / 4 = 0.1875 -> A = [0.25, -0.75] / sqrt(0.1875) = [0.57735, -1.73205]
    expected = [0.25 / math.sqrt(0.1875), -0.75 / math.sqrt(0.1875)]
    assert est("reinforce_plus_plus", [1.0, 0.0], 1, lengths=torch.tensor([3.0, 1.0])) == pytest.approx(expected, rel=1e-5)
    # -baseline with G = 2: centred [0.5, -0.5], token mean (1.5 - 0.5) / 4 = 0.25, deviations [0.25, -0.75]: the same
    assert est("reinforce_plus_plus_baseline", [1.0, 0.0], 2, lengths=torch.tensor([3.0, 1.0])) == pytest.approx(expected, rel=1e-5)
    assert est("reinforce_plus_plus_baseline", [0.4, 0.4], 2, lengths=torch.tensor([3.0, 1.0])) == [0.0, 0.0]


def test_optimal_token_baseline_weights_each_path_by_its_score_norm():
    # G = 2, rewards [1, 0], lengths 3 and 1. Row 0: pi_old = 0.5, sum pi^2 = 0.5 -> w = 1 - 1 + 0.5 = 0.5 per token,
    # W = [0.5, 1.0, 1.5]; row 1: pi_old = 0.25, sum pi^2 = 0.25 -> w = 1 - 0.5 + 0.25 = 0.75, W = [0.75].
    # B_0 = (1 * 0.5 + 0 * 0.75) / 1.25 = 0.4 (an unweighted mean would say 0.5); B_1 = B_2 = 1 (row 0 alone).
    # handle_zero_tail: row 0 is the single longest, past the second longest (1): baseline 0 from t = 1.
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    old = torch.log(torch.tensor([[0.5, 0.5, 0.5], [0.25, 0.9, 0.9]]))
    spp = torch.tensor([[0.5, 0.5, 0.5], [0.25, 0.9, 0.9]])
    run = lambda rewards, **kw: advantages(  # noqa: E731
        "optimal_token_baseline", torch.tensor(rewards), group_size=2, mask=mask, old_logps=old, sum_pi_squared=spp, **kw)
    assert run([1.0, 0.0]).flatten().tolist() == pytest.approx([0.6, 1.0, 1.0, -0.4, 0.0, 0.0], abs=1e-6)
    assert run([1.0, 0.0], handle_zero_tail=False).flatten().tolist() == pytest.approx([0.6, 0.0, 0.0, -0.4, 0.0, 0.0], abs=1e-6)
    assert torch.equal(run([0.5, 0.5]), torch.zeros(2, 3))  # a tied group: no signal
    assert advantage_estimator("optimal_token_baseline").needs_token_statistics
    with pytest.raises(ValueError, match="one advantage per completion"):
        GRPOConfig(learning_rate=1e-3, advantage_estimator="optimal_token_baseline", loss_type="gmpo").validate()


# --- policy losses, by hand -------------------------------------------------------------------------------


def test_dual_clip_floors_negative_advantages():
    # one token per row, r = 5: A = -1: max(-rA, -clip(r)A) = max(5, 1.2) = 5, floored at -cA = 3 -> 3 (no gradient);
    # A = +1: max(-5, -1.2) = -1.2 (clipped, no gradient). token-mean over 2 tokens: (3 - 1.2) / 2 = 0.9
    logps = torch.full((2, 1), math.log(5.0), requires_grad=True)
    dual_clip = GRPOConfig(loss_type="dual_clip", clip_ratio_c=3.0, beta=0.0).loss()
    loss = dual_clip(logps, torch.zeros(2, 1), None, torch.tensor([-1.0, 1.0]), torch.ones(2, 1))
    assert loss.item() == pytest.approx(0.9, rel=1e-6)
    loss.backward()
    assert logps.grad.tolist() == [[0.0], [0.0]]
    # r = 2, A = -1: max(2, 1.2) = 2 < 3, unfloored: d(-A r)/dlogp = r = 2, / 2 tokens = 1
    logps = torch.full((2, 1), math.log(2.0), requires_grad=True)
    dual_clip(logps, torch.zeros(2, 1), None, torch.tensor([-1.0, 1.0]), torch.ones(2, 1)).backward()
    assert logps.grad[0, 0].item() == pytest.approx(1.0, rel=1e-6)
    # below the floor it is PPO's clip with token-mean: bnpo's loss exactly (every ratio here is < 3)
    assert dual_clip(LOGPS, OLD, None, ADV, MASK).item() == pytest.approx(
        GRPOConfig(loss_type="bnpo", beta=0.0).loss()(LOGPS, OLD, None, ADV, MASK).item(), rel=1e-7)


def test_gmpo_geometric_mean_of_log_clipped_ratios():
    # eps = 0.2 in log space. Row 0, A = 1 (sign +): min(lr, clip(lr)) = [0, 0.2, -0.3], mean -0.1/3,
    # l = -1 * exp(-1/30). Row 1 (one token; padding ignored), A = -2 (sign -): lr = -0.5, clip -0.2;
    # -min(0.5, 0.2) = -0.2, l = 2 * exp(-0.2). Mean over the two completions.
    expected = (-math.exp(-0.1 / 3) + 2 * math.exp(-0.2)) / 2
    gmpo = GRPOConfig(loss_type="gmpo", beta=0.0).loss()
    assert gmpo(LOGPS, OLD, None, ADV, MASK).item() == pytest.approx(expected, rel=1e-6)
    # on-policy every ratio is 1: l_i = -A_i, mean = (-1 + 2) / 2
    assert gmpo(LOGPS, None, None, ADV, MASK).item() == pytest.approx(0.5, rel=1e-6)


# Covariance layout: A = [2, -2] per row, on-policy logps [[-1, -3], [-5, -7]] (token means: A 0, logp -4),
# Cov = A' * logp' = [[2*3, 2*1], [-2*-1, -2*-3]] = [[6, 2], [2, 6]]; a third, masked column with a huge
# covariance must never be picked.
COV_LOGPS = torch.tensor([[-1.0, -3.0, 50.0], [-5.0, -7.0, -50.0]])
COV_MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
COV_ADV = torch.tensor([2.0, -2.0])


def test_clip_cov_cuts_the_gradient_of_covariance_window_tokens():
    # window (1, 5): candidates (0,1) and (1,0), both Cov 2. ratio 1.0 -> max(1, floor(1.0 * 4)) = 4, capped at 2:
    # both cut. Per token -A r = [[-2, -2], [2, 2]] -> [[-2, 0], [0, 2]], token-mean 0; gradient -A / 4 where kept.
    logps = COV_LOGPS.clone().requires_grad_(True)
    loss = GRPOConfig(loss_type="clip_cov", clip_cov_ratio=1.0, beta=0.0).loss()(logps, None, None, COV_ADV, COV_MASK)
    assert loss.item() == pytest.approx(0.0, abs=1e-7)
    loss.backward()
    assert logps.grad.tolist() == [[-0.5, 0.0, 0.0], [0.0, 0.5, 0.0]]
    # ratio 0.25 -> one of the two candidates, at random (seeded): exactly one of them loses its gradient
    picks = set()
    for seed in range(8):
        logps = COV_LOGPS.clone().requires_grad_(True)
        GRPOConfig(loss_type="clip_cov", clip_cov_ratio=0.25, beta=0.0).loss()(
            logps, None, None, COV_ADV, COV_MASK, generator=torch.Generator().manual_seed(seed)).backward()
        g = logps.grad
        assert g[0, 0].item() == -0.5 and g[1, 1].item() == 0.5  # outside the window: kept
        assert (g[0, 1].item(), g[1, 0].item()) in ((0.0, 0.5), (-0.5, 0.0))
        picks.add(g[0, 1].item() == 0.0)
    assert picks == {True, False}  # both candidates get drawn over the seeds


def test_kl_cov_penalises_the_top_covariance_tokens():
    # logps [[-1, -3], [-5, -8]] (token means: A 0, logp -4.25): Cov = [[2*3.25, 2*1.25], [-2*-0.75, -2*-3.75]]
    # = [[6.5, 2.5], [1.5, 7.5]]. kl_cov_ratio 0.25 -> max(1, floor(0.25 * 4)) = 1 token: (1,1).
    # log r = [[0.1, 0.2], [0.3, -0.4]]; l = -A r, plus 1.0 * |log r| on (1,1):
    # [-2 e^0.1, -2 e^0.2, 2 e^0.3, 2 e^-0.4 + 0.4], token-mean over 4.
    logps = torch.tensor([[-1.0, -3.0, 9.0], [-5.0, -8.0, 9.0]])
    old = logps - torch.tensor([[0.1, 0.2, 0.0], [0.3, -0.4, 0.0]])
    expected = (-2 * math.exp(0.1) - 2 * math.exp(0.2) + 2 * math.exp(0.3) + 2 * math.exp(-0.4) + 0.4) / 4
    got = GRPOConfig(loss_type="kl_cov", kl_cov_ratio=0.25, beta=0.0).loss()(logps, old, None, COV_ADV, COV_MASK)
    assert got.item() == pytest.approx(expected, rel=1e-5)  # float32 log-ratios
    # ratio 0.5 -> 2 tokens: (1,1) and (0,0), adding |0.1| too
    got = GRPOConfig(loss_type="kl_cov", kl_cov_ratio=0.5, beta=0.0).loss()(logps, old, None, COV_ADV, COV_MASK)
    assert got.item() == pytest.approx(expected + 0.1 / 4, rel=1e-5)


def test_one_token_and_fully_masked_rows():
    # a row with no active token adds nothing to any new loss (and no NaN)
    mask = torch.tensor([[1.0], [0.0]])
    logps, old, adv = torch.tensor([[-1.0], [-2.0]]), torch.tensor([[-1.2], [-9.0]]), torch.tensor([1.0, -1.0])
    for loss_type in ("dual_clip", "gmpo", "clip_cov", "kl_cov"):
        got = GRPOConfig(loss_type=loss_type, beta=0.0).loss()(logps, old, None, adv, mask)
        assert math.isfinite(got.item()), loss_type
    # dual_clip, one active token: r = e^0.2 = 1.2214 > 1.2, A = 1 -> -1.2, token-mean over 1 token
    loss = GRPOConfig(loss_type="dual_clip", beta=0.0).loss()
    assert loss(logps, old, None, adv, mask).item() == pytest.approx(-1.2, rel=1e-6)
    # gmpo: row 0, clipped log-ratio 0.2 -> -e^0.2; row 1 has no tokens -> exp(0) * -A = 1, but grpo's
    # aggregation gives an empty row 0: (-e^0.2 + 0) / 2
    loss = GRPOConfig(loss_type="gmpo", beta=0.0).loss()
    assert loss(logps, old, None, adv, mask).item() == pytest.approx(-math.exp(0.2) / 2, rel=1e-6)
    assert GRPOConfig(loss_type="kl_cov", beta=0.0).loss()(logps, old, None, adv, torch.zeros(2, 1)).item() == 0.0


# --- knobs: aggregations, KL estimators, entropy bonus ---------------------------------------------------


def test_verl_aggregation_modes():
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 7.0, 7.0], [5.0, 5.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # the third row is fully masked
    agg = {name: LOSS_AGGREGATIONS[name](per_token, mask, 4, None).item() for name in LOSS_AGGREGATIONS}
    assert agg["token-mean"] == pytest.approx((1 + 2 + 3 + 4) / 4)  # 2.5
    assert agg["seq-mean-token-mean"] == pytest.approx((2 + 4) / 2)  # empty row left out; grpo: (2 + 4 + 0) / 3
    assert agg["grpo"] == pytest.approx(2.0)
    assert agg["seq-mean-token-sum"] == pytest.approx((6 + 4) / 2)  # luspo: 10 / 3
    assert agg["luspo"] == pytest.approx(10 / 3)
    # verl 0.9.1: / (non-empty rows x max_completion_length); dr_grpo counts the empty row: / (3 * 4)
    assert agg["seq-mean-token-sum-norm"] == pytest.approx(10 / (2 * 4))
    assert agg["dr_grpo"] == pytest.approx(10 / 12)
    assert LOSS_AGGREGATIONS["seq-mean-token-sum-norm"](per_token, mask, None, None).item() == pytest.approx(10 / (2 * 3))  # / T
    # where every row has a token they coincide with the project's own
    full = torch.ones(2, 3)
    for verl, ours in (("seq-mean-token-mean", "grpo"), ("seq-mean-token-sum", "luspo"), ("token-mean", "bnpo"),
                       ("seq-mean-token-sum-norm", "dr_grpo")):
        assert LOSS_AGGREGATIONS[verl](per_token[:2], full, 4, None).item() == LOSS_AGGREGATIONS[ours](per_token[:2], full, 4, None).item()
    # a loss type with another aggregation: dual_clip aggregated per sequence equals grpo's loss (ratios < 3)
    per_sequence = GRPOConfig(loss_type="dual_clip", loss_aggregation="seq-mean-token-mean", beta=0.0).loss()
    assert per_sequence(LOGPS, OLD, None, ADV, MASK).item() == \
        pytest.approx(GRPOConfig(loss_type="grpo", beta=0.0).loss()(LOGPS, OLD, None, ADV, MASK).item(), rel=1e-7)


def test_kl_estimators_and_straight_through():
    # log r = logp - ref = 0.5
    logps, ref = torch.tensor([[0.0]]), torch.tensor([[-0.5]])
    values = {name: KL_PENALTIES[name](logps, ref).item() for name in KL_PENALTIES}
    assert values["k1"] == pytest.approx(0.5)
    assert values["abs"] == pytest.approx(0.5)
    assert values["k2"] == pytest.approx(0.125)  # 0.5^2 / 2
    assert values["k3"] == pytest.approx(math.exp(-0.5) - 1 + 0.5)  # 0.10653
    assert values["low_var_kl"] == pytest.approx(values["k3"])
    # verl clamps: -log r = 30 -> 20, e^20 - 21 -> 10; the paper's k3 does not
    far = KL_PENALTIES["low_var_kl"](torch.tensor([0.0]), torch.tensor([30.0])).item()
    assert far == 10.0 and KL_PENALTIES["k3"](torch.tensor([0.0]), torch.tensor([30.0])).item() > 1e12
    for name in ("k1", "k3", "low_var_kl", "abs", "k2"):
        x = logps.clone().requires_grad_(True)
        kl = KL_PENALTIES[name + "+"](x, ref)
        assert kl.item() == pytest.approx(values[name])  # the value of kN
        kl.backward()
        assert x.grad.item() == pytest.approx(0.5)  # the gradient of k2: log r
    # the loss's default is the paper's k3, exactly
    ref = LOGPS - 0.25
    assert torch.equal(GRPOConfig(beta=0.04).loss()(LOGPS, None, ref, ADV, MASK),
                       GRPOConfig(beta=0.04, kl_loss_type="k3").loss()(LOGPS, None, ref, ADV, MASK))
    # k1 = 0.25 on every token. On-policy the surrogate is -A_i per token (r = 1): per-row means -1 and 2, mean 0.5;
    # plus 0.1 * 0.25 -> 0.525
    k1 = GRPOConfig(beta=0.1, kl_loss_type="k1").loss()
    assert k1(LOGPS, None, ref, ADV, MASK).item() == pytest.approx(0.525, rel=1e-6)


def test_entropy_bonus_loss():
    # token-mean of the active entropies: (1 + 2 + 3) / 3 = 2 -> -0.01 * 2
    entropies, mask = torch.tensor([[1.0, 2.0], [3.0, 8.0]]), torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    assert entropy_bonus_loss(entropies, mask, 0.01).item() == pytest.approx(-0.02)
    # seq-mean-token-mean: (1.5 + 3) / 2 = 2.25
    assert entropy_bonus_loss(entropies, mask, 0.01, "seq-mean-token-mean").item() == pytest.approx(-0.0225)


def test_dppo_tv_keeps_tokens_inside_the_total_variation_bound():
    # Row 0: p 0.5 -> 0.6 (moved +0.1 <= eps_high 0.2), A = +1: kept, weight sg(min(1.2, 3)) = 1.2,
    # l = -1 * 1.2 * log 0.6. Row 1: p 0.5 -> 0.2 (moved -0.3 < -eps), A = -1: dropped. token-mean over 2 tokens.
    logps = torch.log(torch.tensor([[0.6], [0.2]])).requires_grad_()
    old = torch.log(torch.tensor([[0.5], [0.5]]))
    loss = GRPOConfig(loss_type="dppo_tv", beta=0.0).loss()(logps, old, None, torch.tensor([1.0, -1.0]),
                                                            torch.ones(2, 1))
    assert loss.item() == pytest.approx(-1.2 * math.log(0.6) / 2, rel=1e-5)
    loss.backward()
    assert logps.grad.flatten().tolist() == pytest.approx([-0.6, 0.0], abs=1e-6)  # d(-A w log p)/d log p = -A w / 2
    # the IS weight is truncated at clip_ratio_c: C = 1.1 -> weight 1.1
    capped = GRPOConfig(loss_type="dppo_tv", clip_ratio_c=1.1, beta=0.0).loss()(
        logps, old, None, torch.tensor([1.0, -1.0]), torch.ones(2, 1))
    assert capped.item() == pytest.approx(-1.1 * math.log(0.6) / 2, rel=1e-5)


def test_dppo_kl_bounds_only_the_move_the_advantage_pushes():
    # A = +1 on both rows, eps = eps_high = 0.01. Row 0: p 0.5 -> 0.6, binary KL 0.5 log(0.5/0.6) + 0.5 log(0.5/0.4)
    # = 0.0204 > 0.01 and p went up: dropped. Row 1: p 0.5 -> 0.2 went down, which A > 0 does not bound: kept,
    # weight 0.4, l = -0.4 log 0.2. token-mean over 2 tokens.
    logps = torch.log(torch.tensor([[0.6], [0.2]])).requires_grad_()
    old = torch.log(torch.tensor([[0.5], [0.5]]))
    loss = GRPOConfig(loss_type="dppo_kl", epsilon=0.01, beta=0.0).loss()(
        logps, old, None, torch.tensor([1.0, 1.0]), torch.ones(2, 1))
    assert loss.item() == pytest.approx(-0.4 * math.log(0.2) / 2, rel=1e-5)
    loss.backward()
    assert logps.grad.flatten().tolist() == pytest.approx([0.0, -0.2], abs=1e-6)
    # a looser bound keeps row 0 too
    loose = GRPOConfig(loss_type="dppo_kl", epsilon=0.05, beta=0.0).loss()(
        logps, old, None, torch.tensor([1.0, 1.0]), torch.ones(2, 1))
    assert loose.item() == pytest.approx((-1.2 * math.log(0.6) - 0.4 * math.log(0.2)) / 2, rel=1e-5)


def test_entropy_coef_subtracts_the_token_mean_entropy_with_its_gradient():
    # On-policy grpo: per-row means of -A: -1 and 2, mean 0.5. Entropy token-mean over the 4 active tokens:
    # (1 + 2 + 3 + 4) / 4 = 2.5 -> -0.1 * 2.5 = -0.25; total 0.25. d/dH = -0.1 / 4 on active tokens, 0 on padding.
    entropies = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]], requires_grad=True)
    loss = GRPOConfig(entropy_coef=0.1, beta=0.0).loss()(LOGPS, None, None, ADV, MASK, entropies=entropies)
    assert loss.item() == pytest.approx(0.25, rel=1e-6)
    loss.backward()
    assert entropies.grad.flatten().tolist() == pytest.approx([-0.025, -0.025, -0.025, -0.025, 0.0, 0.0])
    with pytest.raises(ValueError, match="entropy_coef"):
        GRPOConfig(entropy_coef=0.1, beta=0.0).loss()(LOGPS, None, None, ADV, MASK)


# --- the registries ---------------------------------------------------------------------------------------


@pytest.fixture
def clean_registries():
    """Restore every registry after a test that registers into it."""
    saved = [(table, dict(table)) for table in (ADVANTAGE_ESTIMATORS, POLICY_LOSSES)]
    yield
    for table, content in saved:
        table.clear()
        table.update(content)


def test_a_taken_name_is_refused(clean_registries):
    def other(rewards, **_):
        return rewards

    with pytest.raises(ValueError, match="advantage estimator name 'grpo' is taken by algorithms.estimators.GRPOEstimator"):
        register_advantage_estimator("grpo")(other)
    register_advantage_estimator("grpo")(ADVANTAGE_ESTIMATORS["grpo"])  # the same class again: a no-op
    with pytest.raises(ValueError, match="policy loss name 'gmpo' is taken"):
        register_policy_loss("gmpo")(other)
    with pytest.raises(ValueError, match="policy loss GRPOClip is named 'grpo', not 'bnpo'"):  # a class keeps its name
        register_policy_loss(POLICY_LOSSES["grpo"], name="bnpo")
    register_policy_loss(POLICY_LOSSES["grpo"])  # the same class again: a no-op
    with pytest.raises(ValueError, match="unknown loss aggregation 'mean-ish'; choose from"):
        register_policy_loss("mine", aggregation="mean-ish")
    with pytest.raises(TypeError):
        register_advantage_estimator("not_a_function")(3)
    with pytest.raises(ValueError, match="advantage estimator name 'gpg' is taken"):  # the call form too
        register_advantage_estimator(other, name="gpg")


def test_an_unknown_name_is_one_line_listing_the_choices():
    for lookup, kind in ((advantage_estimator, "advantage_estimator"), (policy_loss, "loss_type")):
        with pytest.raises(ValueError) as info:
            lookup("nope")
        message = str(info.value)
        assert message.startswith(f"unknown {kind} 'nope'; choose from ") and "\n" not in message
    assert "gpg, grpo, grpo_passk, maxrl, opo, optimal_token_baseline, reinforce_plus_plus" in str(pytest.raises(ValueError, advantage_estimator, "x").value)
    assert "clip_cov" in str(pytest.raises(ValueError, GRPOConfig(loss_type="x").loss).value)
    for field, value in (("advantage_estimator", "nope"), ("loss_type", "nope"), ("kl_loss_type", "k9"), ("loss_aggregation", "sum")):
        with pytest.raises(ValueError, match=f"unknown {field} '{value}'; choose from "):
            GRPOConfig(learning_rate=1e-3, **{field: value}).validate()
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        GRPOConfig(learning_rate=1e-3, clip_ratio_c=1.0).validate()


def _pizza_grpo(**options):
    from algorithms import Sampling
    from benchmarks.harness.loop import make_evaluated_task

    torch.manual_seed(0)
    task = make_evaluated_task("pizza", eval_samples=16)
    policy = task.load_policy(torch.device("cpu"))
    config = GRPOConfig(learning_rate=1e-3, prompts_per_step=2, group_size=4, beta=0.0, **options)
    sampling = Sampling(max_new_tokens=task.generation.max_new_tokens, temperature=task.generation.temperature)
    return GRPO(policy, None, task, config, sampling, seed=0)


def test_a_plugin_registered_at_runtime_is_usable_through_the_config(clean_registries):
    seen = {}

    @register_advantage_estimator("always_plus_one")
    def plus_one(rewards, *, group_size, lengths, **_):
        seen["lengths"] = lengths.tolist()
        return torch.ones_like(rewards)

    @register_policy_loss("halved_reinforce", aggregation="token-mean")
    def halved(*, logps, adv, **_):
        seen["loss"] = True
        return -0.5 * adv * logps

    # what plug-in loading does with an entry point (register(fn, name=entry point's name)): the module's own
    # decorator ran on import, so this is a no-op that keeps its aggregation
    register_advantage_estimator(plus_one, name="always_plus_one")
    register_policy_loss(halved, name="halved_reinforce")
    assert policy_loss("halved_reinforce").function is halved and policy_loss("halved_reinforce").aggregation == "token-mean"
    with pytest.raises(ValueError, match="another aggregation needs another name"):
        register_policy_loss(halved, name="halved_reinforce", aggregation="grpo")

    algo = _pizza_grpo(advantage_estimator="always_plus_one", loss_type="halved_reinforce")
    metrics = algo.step(["ravin likes "] * 2)
    assert seen["loss"] and len(seen["lengths"]) == 8 and min(seen["lengths"]) >= 1
    assert metrics["advantage/mean"] == 1.0 and metrics["skipped_update"] == 0.0
    assert math.isfinite(metrics["loss"])


@pytest.mark.parametrize("options", [{"advantage_estimator": "remax"}, {"advantage_estimator": "gpg", "loss_type": "gmpo"},
                                     {"advantage_estimator": "opo", "loss_type": "clip_cov", "mu": 2},
                                     {"advantage_estimator": "grpo_passk", "loss_type": "kl_cov", "mu": 2},
                                     {"loss_type": "dual_clip", "loss_aggregation": "seq-mean-token-sum-norm"},
                                     {"advantage_estimator": "optimal_token_baseline", "mu": 2},
                                     {"loss_type": "dppo_tv", "mu": 2}, {"loss_type": "dppo_kl", "mu": 2},
                                     {"entropy_coef": 0.01, "top_entropy_quantile": 0.5}])
def test_grpo_steps_with_the_new_variants(options):
    metrics = _pizza_grpo(**options).step(["ravin likes "] * 2)
    assert all(math.isfinite(v) for v in metrics.values())


def test_remax_baseline_is_the_greedy_completion_reward():
    algo = _pizza_grpo(advantage_estimator="remax")
    rollout = algo.generate(["ravin likes ", "ravin likes "], 4)
    baseline = algo.greedy_rewards(rollout)
    assert baseline.shape == (8,) and torch.equal(baseline[:4], baseline[4:])  # one greedy completion per prompt


def test_command_line_selects_the_variants(run_cli, tmp_path):
    code, out, err = run_cli("run", "--task", "pizza", "--algo", "grpo", "--steps", "1", "--eval-every", "0",
                             "--checkpoint-every", "0", "--group-size", "4", "--advantage-estimator", "remax",
                             "--loss-type", "dual_clip", "--kl-loss-type", "low_var_kl+", "--out", tmp_path / "run")
    assert code == 0, err
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    found = json.dumps(config)
    assert '"advantage_estimator": "remax"' in found and '"loss_type": "dual_clip"' in found and "low_var_kl+" in found
    code, _, err = run_cli("run", "--task", "pizza", "--algo", "grpo", "--steps", "1", "--advantage-estimator", "nope",
                           "--out", tmp_path / "bad")
    assert code == 2 and "nope" in err and "remax" in err
