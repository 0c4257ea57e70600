"""TRL 1.16's newer GRPO loss types and options, RLOO, REINFORCE++, DAPO's dynamic sampling and
overlong shaping. Loss values are written out by hand (plain Python, no tensors) so a wrong
implementation fails; the algorithms survive degenerate batches; seeded pizza runs train."""

import copy
import dataclasses
import math

import pytest
import torch

from algorithms.base import Sampling
from algorithms.grpo import GRPO, GRPOConfig
from algorithms.kl import approx_kl
from algorithms.policy_losses import high_entropy_mask, sampling_importance_ratio, vespo_weights
from algorithms.losses import overlong_penalty, reinforce_pp_advantages, rloo_advantages, rloo_loss
from algorithms.reinforce_pp import REINFORCEPP, REINFORCEPPConfig
from algorithms.rloo import RLOO, RLOOConfig
from algorithms.rollout import Rollout, concat_rollouts, rollout_from_text

# Two completions of lengths 3 and 1 (ragged), T = 3; padding holds junk that must not matter.
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
LOGPS = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -9.0, -9.0]])
OLD = torch.tensor([[-1.0, -2.5, -0.2], [-1.0, -9.0, -9.0]])
ADV = torch.tensor([1.0, -2.0])
ACTIVE = [[0, 1, 2], [0]]


def ratios():
    return [[math.exp(LOGPS[i, t].item() - OLD[i, t].item()) for t in ACTIVE[i]] for i in range(2)]


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


# --- the new GRPO loss types, by hand -------------------------------------------------------------


def test_cispo_by_hand():
    # -min(r, eps_high) * A * logp per token (the weight has no gradient), summed over the 4 active tokens / 4.
    for eps_high, caps in ((5.0, None), (None, 0.2)):  # TRL: the cap is epsilon_high itself, default epsilon = 0.2
        cap = eps_high or caps
        terms = [-min(r, cap) * ADV[i].item() * LOGPS[i, t].item()
                 for i in range(2) for r, t in zip(ratios()[i], ACTIVE[i])]
        got = GRPOConfig(loss_type="cispo", epsilon_high=eps_high, beta=0.0).loss()(LOGPS, OLD, None, ADV, MASK)
        assert got.item() == pytest.approx(sum(terms) / 4, rel=1e-6)
    # its gradient is the weighted REINFORCE gradient: d/dlogp = -sg(w) A / 4, the ratio itself gets none
    logps = LOGPS.clone().requires_grad_(True)
    GRPOConfig(loss_type="cispo", epsilon_high=5.0, beta=0.0).loss()(logps, OLD, None, ADV, MASK).backward()
    assert logps.grad[0, 1].item() == pytest.approx(-min(math.exp(0.5), 5.0) * 1.0 / 4, rel=1e-6)


def test_sapo_by_hand():
    # f(r) = sigmoid(tau (r - 1)) * 4 / tau; tau = 1.0 for A = 1 > 0, 1.05 for A = -2; grpo aggregation.
    rows = []
    for i, tau in ((0, 1.0), (1, 1.05)):
        rows.append([-sigmoid(tau * (r - 1)) * 4 / tau * ADV[i].item() for r in ratios()[i]])
    expected = (sum(rows[0]) / 3 + sum(rows[1]) / 1) / 2
    sapo = GRPOConfig(loss_type="sapo", beta=0.0).loss()
    assert sapo(LOGPS, OLD, None, ADV, MASK).item() == pytest.approx(expected, rel=1e-6)
    # on-policy the gate's slope is exactly 1: the gradient is GRPO's
    a, b = LOGPS.clone().requires_grad_(True), LOGPS.clone().requires_grad_(True)
    sapo(a, None, None, ADV, MASK).backward()
    GRPOConfig(loss_type="grpo", beta=0.0).loss()(b, None, None, ADV, MASK).backward()
    torch.testing.assert_close(a.grad, b.grad)


def test_luspo_by_hand():
    # sequence ratio s_i = exp(mean log-ratio); clipped surrogate; sum over the completion's tokens; mean over B.
    s0 = math.exp((0.0 + 0.5 - 0.3) / 3)  # 1.0689, inside [0.8, 1.2]
    s1 = math.exp(-0.5)  # 0.6065 with A = -2: the clip binds, -min(-1.213, -1.6) = 1.6
    expected = (3 * -(s0 * 1.0) + 1 * -min(s1 * -2.0, 0.8 * -2.0)) / 2
    got = GRPOConfig(loss_type="luspo", level="sequence", beta=0.0).loss()(LOGPS, OLD, None, ADV, MASK)
    assert got.item() == pytest.approx(expected, rel=1e-6)


def test_vespo_by_hand():
    # w_i = prod_t r_{i,t} = exp(sum of token log-ratios); phi = exp(lam + k log w - lam w); loss = -phi A logp, dapo.
    log_w = [0.0 + 0.5 - 0.3, -0.5]
    k, lam = [2.0, 3.0], [3.0, 2.0]  # A = 1 >= 0: (k_pos, lambda_pos); A = -2: (k_neg, lambda_neg)
    phi = [math.exp(lam[i] + k[i] * log_w[i] - lam[i] * math.exp(log_w[i])) for i in range(2)]
    terms = [-phi[i] * ADV[i].item() * LOGPS[i, t].item() for i in range(2) for t in ACTIVE[i]]
    vespo = GRPOConfig(loss_type="vespo", beta=0.0).loss()
    assert vespo(LOGPS, OLD, None, ADV, MASK).item() == pytest.approx(sum(terms) / 4, rel=1e-6)
    assert vespo_weights(LOGPS - LOGPS, MASK, ADV.unsqueeze(1)).flatten().tolist() == pytest.approx([1.0, 1.0])  # phi(1) = 1


def test_delta_caps_the_unclipped_ratio():
    # Token (0, 1): r = e^0.5 = 1.6487 with A = 1 -> min(r A, 1.2 A) = 1.2 either way. Make A negative to see delta:
    adv = torch.tensor([-1.0, -2.0])
    plain = [[-min(r * a, min(max(r, 0.8), 1.2) * a) for r in ratios()[i]] for i, a in enumerate((-1.0, -2.0))]
    capped = [[-min(min(r, 1.4) * a, min(max(r, 0.8), 1.2) * a) for r in ratios()[i]] for i, a in enumerate((-1.0, -2.0))]
    assert capped[0][1] == pytest.approx(1.4) and plain[0][1] == pytest.approx(math.exp(0.5))
    got = GRPOConfig(loss_type="bnpo", delta=1.4, beta=0.0).loss()(LOGPS, OLD, None, adv, MASK)
    assert got.item() == pytest.approx(sum(map(sum, capped)) / 4, rel=1e-6)


def test_top_entropy_quantile_keeps_the_top_share():
    entropies = torch.tensor([[0.1, 2.0, 0.5], [1.0, 99.0, 99.0]])  # active: 0.1, 2.0, 0.5, 1.0 (99: padding)
    # rho = 0.5: threshold = 50% quantile of (0.1, 0.5, 1.0, 2.0) = 0.75 -> keep 2.0 and 1.0
    assert high_entropy_mask(entropies, MASK, 0.5).tolist() == [[0, 1, 0], [1, 0, 0]]
    assert high_entropy_mask(entropies, MASK, 0.0).tolist() == [[0, 1, 0], [0, 0, 0]]  # only the maximum
    assert high_entropy_mask(entropies, MASK, 1.0).tolist() == MASK.tolist()
    terms = [[-min(r * a, min(max(r, 0.8), 1.2) * a) for r in ratios()[i]] for i, a in enumerate((1.0, -2.0))]
    expected = (terms[0][1] / 3 + terms[1][0] / 1) / 2  # grpo aggregation keeps the full |o_i| denominators (TRL)
    got = GRPOConfig(top_entropy_quantile=0.5, beta=0.0).loss()(LOGPS, OLD, None, ADV, MASK, entropies=entropies)
    assert got.item() == pytest.approx(expected, rel=1e-6)


def test_off_policy_mask_drops_negative_drifted_sequences():
    # mean(sampler - current) over completion 1 (A = -2): (-1.0 - -1.5) = 0.5 > 0.4 -> dropped; completion 0 has A > 0.
    terms = [-min(r * 1.0, min(max(r, 0.8), 1.2) * 1.0) for r in ratios()[0]]
    got = GRPOConfig(off_policy_mask_threshold=0.4, beta=0.0).loss()(LOGPS, OLD, None, ADV, MASK)
    assert got.item() == pytest.approx((sum(terms) / 3 + 0.0) / 2, rel=1e-6)
    kept = GRPOConfig(off_policy_mask_threshold=0.6, beta=0.0).loss()(LOGPS, OLD, None, ADV, MASK)
    assert kept.item() == pytest.approx(GRPOConfig(beta=0.0).loss()(LOGPS, OLD, None, ADV, MASK).item())


def test_sampling_importance_ratio_by_hand():
    sampler = torch.tensor([[-1.5, -2.0, -0.1], [0.0, -3.0, -3.0]])  # vs OLD: diffs 0.5, -0.5, -0.1 | -1.0
    tok = sampling_importance_ratio(OLD, sampler, MASK, "token_truncate", 0.9, 1.5)
    assert tok.flatten().tolist() == pytest.approx([1.5, 0.9, math.exp(-0.1), 0.9, 1.0, 1.0], rel=1e-6)
    tok_mask = sampling_importance_ratio(OLD, sampler, MASK, "token_mask", 0.9, 1.5)
    assert tok_mask.flatten().tolist() == pytest.approx([0.0, 0.0, math.exp(-0.1), 0.0, 1.0, 1.0], rel=1e-6)
    seq = sampling_importance_ratio(OLD, sampler, MASK, "sequence_truncate", None, 3.0)
    assert seq.flatten().tolist() == pytest.approx([math.exp(-0.1), math.exp(-1.0)], rel=1e-6)
    seq_mask = sampling_importance_ratio(OLD, sampler, MASK, "sequence_mask", 0.5, 3.0)
    assert seq_mask.flatten().tolist() == pytest.approx([math.exp(-0.1), 0.0], rel=1e-6)
    # the loss is weighted token by token (old = current here, so the surrogate is -A per token)
    got = GRPOConfig(loss_type="bnpo", beta=0.0, importance_sampling_mode="token_truncate",
                     importance_sampling_clip_min=0.9, importance_sampling_clip_max=1.5).loss()(
        LOGPS, None, None, ADV, MASK, sampling_logps=sampler)
    rho = sampling_importance_ratio(LOGPS, sampler, MASK, "token_truncate", 0.9, 1.5)
    expected = sum(-ADV[i].item() * rho[i, t].item() for i in range(2) for t in ACTIVE[i]) / 4
    assert got.item() == pytest.approx(expected, rel=1e-6)
    off = GRPOConfig(loss_type="bnpo", importance_sampling_correction=False, beta=0.0).loss()(
        LOGPS, None, None, ADV, MASK, sampling_logps=sampler)
    assert off.item() == pytest.approx(GRPOConfig(loss_type="bnpo", beta=0.0).loss()(LOGPS, None, None, ADV, MASK).item())


def test_overlong_penalty_by_hand():
    # L_max = 20, L_cache = 4: free up to 16 tokens, then -(|y| - 16) / 4, -1 at the limit; times the factor.
    got = overlong_penalty(torch.tensor([3, 16, 17, 18, 20, 25]), 20, 4, penalty_factor=0.5)
    assert got.tolist() == pytest.approx([0.0, 0.0, -0.125, -0.25, -0.5, -0.5])


# --- RLOO and REINFORCE++, by hand ------------------------------------------------------------------


def test_rloo_advantages_by_hand():
    rewards = torch.tensor([1.0, 2.0, 6.0, 5.0, 5.0, 5.0])  # G = 3
    # leave-one-out: 1 - (2+6)/2 = -3, 2 - 3.5 = -1.5, 6 - 1.5 = 4.5; the tied group: 0
    assert rloo_advantages(rewards, 3).tolist() == pytest.approx([-3.0, -1.5, 4.5, 0.0, 0.0, 0.0])
    # KL in the reward (beta * summed k1), then reward clipping first: clip(6 -> 4)
    kl = torch.tensor([1.0, 0.0, 2.0, 0.0, 0.0, 0.0])
    r = [1 - 0.5, 2.0, 4 - 1.0]  # clip then -beta KL with beta 0.5
    expected = [r[0] - (r[1] + r[2]) / 2, r[1] - (r[0] + r[2]) / 2, r[2] - (r[0] + r[1]) / 2, 0.0, 0.0, 0.0]
    got = rloo_advantages(rewards, 3, kl=kl, kl_coef=0.5, reward_clip_max=4.0)
    assert got.tolist() == pytest.approx(expected)
    normed = rloo_advantages(rewards, 3, normalize=True)
    raw = torch.tensor([-3.0, -1.5, 4.5, 0.0, 0.0, 0.0])
    assert normed.tolist() == pytest.approx(((raw - raw.mean()) / (raw.std() + 1e-4)).tolist(), rel=1e-6)


def test_rloo_loss_is_sequence_level_clip():
    # sequence ratios: exp(sum) = exp(-3.5 - -3.7) = e^0.2 = 1.2214 (A = 1: clipped to 1.2); exp(-0.5) (A = -2: 0.8)
    got = rloo_loss(LOGPS, OLD, ADV, MASK)
    assert got.item() == pytest.approx(-(1.2 * 1.0 + 0.8 * -2.0) / 2, rel=1e-6)
    logps = LOGPS.clone().requires_grad_(True)
    rloo_loss(logps, None, ADV, MASK).backward()  # on-policy: REINFORCE, -A_i / B on every active token
    torch.testing.assert_close(logps.grad, -ADV.unsqueeze(1) * MASK / 2)


def test_reinforce_pp_by_hand():
    scores = torch.tensor([3.0, 1.0])
    logps = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -9.0, -9.0]])
    ref = torch.tensor([[-1.2, -1.5, -0.5], [-1.0, -9.0, -9.0]])
    kl = approx_kl(logps, ref, "k1")  # log pi - log pi_ref: [0.2, -0.5, 0] | [-0.5]
    assert kl[MASK.bool()].tolist() == pytest.approx([0.2, -0.5, 0.0, -0.5])
    # token rewards with kl_coef 0.1: [-0.02, 0.05, 3.0] | [1.0 + 0.05]; returns (gamma 1): [3.03, 3.05, 3.0] | [1.05]
    returns = [3.03, 3.05, 3.0, 1.05]
    mean = sum(returns) / 4
    std = math.sqrt(sum((x - mean) ** 2 for x in returns) / 4)  # biased, as OpenRLHF
    adv, ret = reinforce_pp_advantages(scores, kl, MASK, kl_coef=0.1)
    assert ret[MASK.bool()].tolist() == pytest.approx(returns, rel=1e-6)
    assert adv[MASK.bool()].tolist() == pytest.approx([(x - mean) / std for x in returns], rel=1e-5)
    assert adv[~MASK.bool()].abs().sum() == 0
    # REINFORCE++-baseline (G = 2): scores minus the group mean (3, 1 -> 1, -1) before the KL shaping
    base_returns = [1.03, 1.05, 1.0, -0.95]
    m = sum(base_returns) / 4
    s = math.sqrt(sum((x - m) ** 2 for x in base_returns) / 4)
    adv, _ = reinforce_pp_advantages(scores, kl, MASK, kl_coef=0.1, group_size=2, group_baseline=True)
    assert adv[MASK.bool()].tolist() == pytest.approx([(x - m) / s for x in base_returns], rel=1e-5)
    # gamma < 1 discounts the reward-to-go; clipping bounds the score; std_norm=False only centres
    adv, ret = reinforce_pp_advantages(scores, kl * 0, MASK, kl_coef=0.1, gamma=0.5, reward_clip_max=2.0, std_norm=False)
    assert ret[MASK.bool()].tolist() == pytest.approx([0.5, 1.0, 2.0, 1.0])
    assert adv[MASK.bool()].tolist() == pytest.approx([0.5 - 1.125, 1.0 - 1.125, 2.0 - 1.125, 1.0 - 1.125])
    assert approx_kl(logps, ref, "k2")[0].tolist() == pytest.approx([0.02, 0.125, 0.0], rel=1e-5)
    assert approx_kl(logps, ref, "k3")[0, 0].item() == pytest.approx(math.exp(-0.2) - 1 + 0.2, rel=1e-5)


# --- validate() refusals ----------------------------------------------------------------------------


@pytest.mark.parametrize("cls, options, message", [
    (GRPOConfig, {"importance_sampling_clip_min": 2.0, "importance_sampling_clip_max": 2.0}, "importance_sampling_clip_min"),
    (GRPOConfig, {"importance_sampling_mode": "token_truncate", "importance_sampling_clip_max": None}, "importance_sampling_clip_min or importance_sampling_clip_max"),
    (GRPOConfig, {"loss_type": "vespo", "sampling_precision": "bf16"}, "loss_type 'vespo' with importance_sampling_correction"),
    (GRPOConfig, {"loss_type": "sapo", "delta": 2.0}, "delta"),
    (GRPOConfig, {"top_entropy_quantile": 1.5}, "top_entropy_quantile"),
    (GRPOConfig, {"sapo_temperature_neg": 0.0}, "sapo_temperature_neg"),
    (GRPOConfig, {"loss_type": "gspo"}, "loss_type"),
    (GRPOConfig, {"importance_sampling_mode": "token"}, "importance_sampling_mode"),
    (GRPOConfig, {"dynamic_sampling_max_rounds": 0}, "dynamic_sampling_max_rounds"),
    (GRPOConfig, {"overlong_buffer_len": -1}, "overlong_buffer_len"),
    (RLOOConfig, {"group_size": 1}, "group_size"),
    (RLOOConfig, {"reward_clip_min": 2.0, "reward_clip_max": 1.0}, "reward_clip_min"),
    (REINFORCEPPConfig, {"group_baseline": True, "samples_per_prompt": 1}, "group_baseline needs samples_per_prompt"),
    (REINFORCEPPConfig, {"group_baseline": True, "gamma": 0.9}, "gamma"),
    (REINFORCEPPConfig, {"kl_estimator": "k4"}, "kl_estimator"),
])
def test_validate_refuses_with_one_line_naming_the_fields(cls, options, message):
    with pytest.raises(ValueError, match=message) as info:
        cls(learning_rate=1e-3, **options).validate()
    assert "\n" not in str(info.value)


def test_accepted_combinations():
    GRPOConfig(learning_rate=1e-3, loss_type="vespo", sampling_precision="bf16", importance_sampling_mode="token_mask").validate()
    GRPOConfig(learning_rate=1e-3, loss_type="vespo").validate()  # no sampler log-probs: no IS correction to refuse
    GRPOConfig(learning_rate=1e-3, loss_type="luspo", level="sequence", delta=1.5).validate()


# --- the algorithms on pizza: dynamic sampling, degenerate batches, seeded smoke runs -------------------


@pytest.fixture(scope="module")
def pizza():
    from tasks import make_task

    return make_task("pizza")


def build(cls, task, seed=0, **options):
    torch.manual_seed(seed)
    policy = task.load_policy(torch.device("cpu"))
    config = cls.Config(learning_rate=task.recommended_learning_rate, **options)
    ref = copy.deepcopy(policy).requires_grad_(False) if cls.needs_reference(config) else None
    return cls(policy, ref, task, config, Sampling(max_new_tokens=task.generation.max_new_tokens), seed=seed)


class TwoPromptTask:
    """Pizza's model and tokenizer with two prompts: "ravin likes " always scores 1 (its groups tie),
    "alice likes " scores 0/1 alternately within each group (never ties)."""

    TIED, MIXED = "ravin likes ", "alice likes "

    def __init__(self, pizza, mixed_share=1):
        self.tokenizer, self.pizza, self.calls = pizza.tokenizer, pizza, []
        self.prompts = [self.TIED] + [self.MIXED] * mixed_share

    def load_policy(self, device):
        return self.pizza.load_policy(device)

    recommended_learning_rate = 5e-5
    generation = property(lambda self: self.pizza.generation)

    def train_prompts(self):
        return self.prompts

    @classmethod
    def rule(cls, prompts):
        return [1.0 if p == cls.TIED else float(i % 2) for i, p in enumerate(prompts)]

    def score(self, prompts, completions):
        self.calls.append(list(prompts))
        return self.rule(prompts)


def test_dynamic_sampling_resamples_counts_and_reports(pizza):
    task = TwoPromptTask(pizza)
    algo = build(GRPO, task, group_size=4, prompts_per_step=2, dynamic_sampling=True, beta=0.0)
    trained = []
    real_logps = algo.logps
    algo.logps = lambda model, rollout, **kw: (trained.append(list(rollout.prompts)), real_logps(model, rollout, **kw))[1]
    metrics = algo.step([task.TIED, task.MIXED])  # the tied group is dropped, fresh prompts are sampled
    rounds = int(metrics["dynamic_sampling/rounds"])
    generated = sum(len(c) for c in task.calls)
    assert rounds >= 2 and len(task.calls) == rounds
    assert metrics["completions"] == generated == rounds * 2 * 4  # every completion counts, discarded included
    groups = generated // 4
    tied = sum(p[0] == task.TIED for call in task.calls for p in [call[i:i + 4] for i in range(0, len(call), 4)])
    assert metrics["dynamic_sampling/tied_groups"] == tied >= 1
    assert metrics["dynamic_sampling/discarded_groups"] == groups - 2
    assert trained[0] == [task.MIXED] * 8  # the update saw only informative groups, prompts_per_step of them
    assert metrics["advantage/std"] > 0 and math.isfinite(metrics["loss"])
    every_score = [s for call in task.calls for s in TwoPromptTask.rule(call)]  # reward/mean: all generated
    assert metrics["reward/mean"] == pytest.approx(sum(every_score) / generated)


def test_dynamic_sampling_gives_up_after_max_rounds(pizza):
    task = TwoPromptTask(pizza, mixed_share=0)  # every group ties
    algo = build(GRPO, task, group_size=2, prompts_per_step=2, dynamic_sampling=True, dynamic_sampling_max_rounds=3)
    metrics = algo.step([task.TIED, task.TIED])
    assert metrics["dynamic_sampling/rounds"] == 3 and metrics["completions"] == 3 * 2 * 2
    assert metrics["dynamic_sampling/tied_groups"] == 6 and metrics["dynamic_sampling/discarded_groups"] == 4
    assert metrics["advantage/std"] == 0 and math.isfinite(metrics["loss"])  # trained on the last round: only the KL term


def test_dynamic_sampling_refills_stop_at_the_sample_budget(pizza):
    # Every group ties, so uncapped it would run all 5 rounds (40 completions). With 20 allowed: the first
    # round (8), one full refill (8), then a last round of the one whole group the budget leaves (4): exactly 20.
    task = TwoPromptTask(pizza, mixed_share=0)
    algo = build(GRPO, task, group_size=4, prompts_per_step=2, dynamic_sampling=True, dynamic_sampling_max_rounds=5)
    algo.completions_allowed = 20
    metrics = algo.step([task.TIED, task.TIED])
    assert [len(call) for call in task.calls] == [8, 8, 4]
    assert metrics["completions"] == 20 and metrics["dynamic_sampling/rounds"] == 3
    task.calls.clear()
    algo.completions_allowed = 3  # less than the first round: the step's first round still runs, no refill
    assert algo.step([task.TIED, task.TIED])["completions"] == 8 and [len(c) for c in task.calls] == [8]
    task.calls.clear()
    algo.completions_allowed = None  # no budget: every round runs in full
    assert algo.step([task.TIED, task.TIED])["completions"] == 40


def test_concat_rollouts_repads_and_keeps_sampler_logps():
    a = Rollout(["p"] * 2, ["x", "y"], torch.tensor([[5], [5]]), torch.ones(2, 1, dtype=torch.long),
                torch.tensor([[1, 2], [3, 0]]), torch.tensor([[1, 1], [1, 0]]), torch.tensor([True, False]), 2,
                torch.tensor([[-0.5, -0.25], [-1.0, 0.0]]))
    b = dataclasses.replace(a, prompt_ids=torch.tensor([[6, 7], [6, 7]]), prompt_mask=torch.ones(2, 2, dtype=torch.long),
                            completion_ids=torch.tensor([[4], [4]]), completion_mask=torch.ones(2, 1, dtype=torch.long),
                            sampling_logps=torch.tensor([[-2.0], [-3.0]]))
    c = concat_rollouts([a, b])
    assert c.prompt_mask.tolist() == [[0, 1], [0, 1], [1, 1], [1, 1]]
    assert c.prompt_ids[:, -1].tolist() == [5, 5, 7, 7]
    assert c.completion_mask.tolist() == [[1, 1], [1, 0], [1, 0], [1, 0]]
    assert c.sampling_logps.tolist() == [[-0.5, -0.25], [-1.0, 0.0], [-2.0, 0.0], [-3.0, 0.0]]
    assert c.select(torch.tensor([2])).sampling_logps.tolist() == [[-2.0, 0.0]]


def degenerate_rollout(task, kind: str, group_size: int) -> Rollout:
    """2 prompts x G completions, every reward tied (0): all empty (one token, EOS), or all one token
    without EOS (truncated: with mask_truncated no token is left in the loss)."""
    n = 2 * group_size
    texts = [""] * n if kind == "empty" else ["p"] * n
    rollout = dataclasses.replace(rollout_from_text(task.tokenizer, ["ravin likes "] * n, texts, torch.device("cpu")),
                                  group_size=group_size)
    if kind == "one_token_truncated":  # cut the EOS
        rollout = dataclasses.replace(rollout, completion_ids=rollout.completion_ids[:, :-1],
                                      completion_mask=rollout.completion_mask[:, :-1],
                                      truncated=torch.ones(n, dtype=torch.bool))
    return rollout


DEGENERATE_VARIANTS = [
    (GRPO, {"loss_type": loss_type, "mu": 2, "mask_truncated": True}) for loss_type in ("cispo", "sapo", "luspo", "vespo")
] + [
    (GRPO, {"delta": 1.5, "top_entropy_quantile": 0.2, "off_policy_mask_threshold": 0.1, "dynamic_sampling": True,
            "overlong_buffer_len": 4, "mask_truncated": True}),
    (GRPO, {"sampling_precision": "fp32", "importance_sampling_mode": "token_mask", "mu": 2}),
    (RLOO, {"mu": 2, "normalize_advantages": True, "mask_truncated": True}),
    (REINFORCEPP, {"mu": 2}),
    (REINFORCEPP, {"group_baseline": True, "kl_in_loss": True, "kl_estimator": "k3"}),
]


@pytest.mark.parametrize("kind", ["empty", "one_token_truncated"])
@pytest.mark.parametrize("cls, options", DEGENERATE_VARIANTS, ids=lambda v: getattr(v, "name", None) or str(v))
def test_degenerate_batches_give_finite_metrics(pizza, cls, options, kind):
    group = "samples_per_prompt" if cls is REINFORCEPP else "group_size"
    algo = build(cls, pizza, **{group: 2, "prompts_per_step": 2, **options})
    rollout = degenerate_rollout(pizza, kind, 2)
    if cls is GRPO and algo.config.records_sampling_logps():
        rollout = dataclasses.replace(rollout, sampling_logps=torch.zeros(rollout.completion_ids.shape))
    algo.generate = lambda prompts, group_size=None: rollout
    metrics = algo.step(["ravin likes "] * 2)
    bad = {k: v for k, v in metrics.items() if not math.isfinite(v)}
    assert not bad, bad
    assert all(torch.isfinite(p).all() for p in algo.policy.parameters())


def test_group_of_two_with_real_sampling(pizza):
    for cls, options in ((GRPO, {"loss_type": "sapo"}), (RLOO, {}), (REINFORCEPP, {"group_baseline": True})):
        group = "samples_per_prompt" if cls is REINFORCEPP else "group_size"
        metrics = build(cls, pizza, **{group: 2, "prompts_per_step": 1}).step(pizza.train_prompts())
        assert all(math.isfinite(v) for v in metrics.values()), (cls.name, metrics)


def test_bf16_sampling_records_and_reports_the_mismatch(pizza):
    algo = build(GRPO, pizza, sampling_precision="bf16", importance_sampling_mode="token_truncate", group_size=4)
    metrics = algo.step(pizza.train_prompts() * 2)
    assert 0 < metrics["mismatch/mean"] <= metrics["mismatch/max"] < 1  # bf16 logits vs the fp32 update's
    assert metrics["mismatch/is_ratio_min"] <= 1 <= metrics["mismatch/is_ratio_max"] <= 3.0
    same = build(GRPO, pizza, sampling_precision="fp32", group_size=4).step(pizza.train_prompts() * 2)
    assert same["mismatch/max"] < 1e-4  # the same precision: only the KV-cache vs packed-forward order differs


@pytest.mark.parametrize("cls, options", [(RLOO, {}), (RLOO, {"mu": 2}), (REINFORCEPP, {}),
                                          (REINFORCEPP, {"group_baseline": True})])
def test_seeded_smoke_training_on_pizza(pizza, cls, options):
    runs = []
    for _ in range(2):
        algo = build(cls, pizza, seed=3, **options)
        rows = [algo.step(pizza.train_prompts() * algo.config.prompts_per_step) for _ in range(4)]
        runs.append([{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows])
    assert runs[0] == runs[1]  # seeded: repeats exactly
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in runs[0])
    assert {"reward/mean", "loss", "loss/policy", "kl/k3", "clipfrac", "entropy", "grad_norm", "advantage/mean",
            "completions"} <= set(runs[0][0])
