"""Advantage estimators for outcome rewards: one advantage per completion (or per token), registered by name.

verl's pattern (``core_algos.register_adv_est``), in the policy losses' shape (algorithms/policy_losses.py): an
estimator is a small class with its name, what it needs declared as class properties, an ``Options`` dataclass of
its own knobs (settings of GRPO: flags grouped in --help under the estimator, config keys and matrix keys), and
``advantages``, a few lines over one ``EstimatorInputs``. ``@register_advantage_estimator`` at the definition
registers it; a different one under a taken name is refused; ``advantage_estimator`` with an unknown name raises
one ValueError listing the choices. An installed package adds one without editing this package, through the
entry-point group ``grpo_bench.advantage_estimators`` (the entry point names a class, or a plain function, which
registers as an estimator without options) or by calling ``register_advantage_estimator``. GRPO picks one with
its ``advantage_estimator`` setting (``--advantage-estimator``) and passes what its properties ask for.

Every estimator returns (B,) advantages, no gradient; one that ``needs_token_statistics`` (the optimal token
baseline) returns (B, T) per-token advantages, 0 on padding. A group whose rewards all tie gets 0 exactly (no
signal, as ``group_advantages`` guarantees; see algorithms/losses.py on why rounding must not leak into a step).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Callable, ClassVar, Optional

import torch

from algorithms.losses import ADVANTAGE_SCALES, group_advantages, reinforce_pp_advantages, rloo_advantages, tied_rows
from algorithms.registry import Configurable, lookup_named, register_function, register_member


@dataclass(frozen=True)
class EstimatorInputs:
    """What every estimator may read.

    rewards           (B,) one reward per completion, group by group (B = prompts x G)
    group_size        G
    lengths           (B,) completion lengths in tokens (the mask convention: up to and including the first EOS)
    scale             GRPO's ``scale_rewards``: "group", "batch" or "none"
    baseline_rewards  (B,) the reward of the greedy completion of each row's prompt (``needs_greedy_baseline``), or None
    mask, old_logps, sum_pi_squared
                      (B, T) each, for ``needs_token_statistics``, else None: the completion mask, the sampling
                      policy's log-probs of the sampled tokens and sum over the vocabulary of pi_old(v)^2 per position
    """

    rewards: torch.Tensor
    group_size: int
    lengths: torch.Tensor
    scale: str = "group"
    baseline_rewards: Optional[torch.Tensor] = None
    mask: Optional[torch.Tensor] = None
    old_logps: Optional[torch.Tensor] = None
    sum_pi_squared: Optional[torch.Tensor] = None


# Inputs a plain function is given only where present: GRPO reads them for an estimator that needs_token_statistics.
TOKEN_STATISTICS = ("mask", "old_logps", "sum_pi_squared")


class AdvantageEstimator(Configurable):
    """An advantage estimator (GRPO's ``advantage_estimator``). Subclasses set ``name``, declare what they need, and
    write ``advantages``; knobs of their own go in an ``Options`` dataclass (``Configurable``)."""

    selector: ClassVar[str] = "advantage_estimator"
    # reads baseline_rewards: GRPO samples one greedy completion per prompt
    needs_greedy_baseline: ClassVar[bool] = False
    # reads mask, old_logps and sum_pi_squared (GRPO: one more no-grad forward) and returns (B, T) advantages
    needs_token_statistics: ClassVar[bool] = False
    # A group's advantages read only that group's rows, unless scale is "batch": under data parallelism each rank
    # computes its own (otherwise every rank's rows are gathered, which is always right).
    group_local: ClassVar[bool] = False

    def advantages(self, x: EstimatorInputs) -> torch.Tensor:
        raise NotImplementedError


ADVANTAGE_ESTIMATORS: dict[str, type[AdvantageEstimator]] = {}


def _call_with_keywords(fn: Callable, x: EstimatorInputs) -> torch.Tensor:
    """A plain estimator function ``fn(rewards, *, group_size, lengths, scale, baseline_rewards, **_)`` on ``x``, with
    the token statistics where given (GRPO gives them to an estimator registered with ``needs_token_statistics``)."""
    given = {f.name: getattr(x, f.name) for f in fields(x) if f.name != "rewards"}
    return fn(x.rewards, **{k: v for k, v in given.items() if v is not None or k not in TOKEN_STATISTICS})


def register_advantage_estimator(estimator=None, *, name: Optional[str] = None,
                                 needs_greedy_baseline: Optional[bool] = None,
                                 needs_token_statistics: Optional[bool] = None):
    """Register an advantage estimator under its name. An AdvantageEstimator subclass: ``@register_advantage_estimator``
    at its definition. A plain function ``fn(rewards, *, group_size, lengths, scale, baseline_rewards, **_)`` (mask,
    old_logps and sum_pi_squared too with ``needs_token_statistics``) with no options:
    ``@register_advantage_estimator("name")`` or ``register_advantage_estimator(fn, name=...)``; the entry-point group
    ``grpo_bench.advantage_estimators`` names either, registered with the entry point's name. A different estimator under a taken name is refused, the same
    one again is a no-op, and an option another estimator declares must keep its default and type."""
    if estimator is None or isinstance(estimator, str):
        return lambda fn: register_advantage_estimator(fn, name=estimator or name,
                                                       needs_greedy_baseline=needs_greedy_baseline,
                                                       needs_token_statistics=needs_token_statistics)
    if isinstance(estimator, type) and issubclass(estimator, AdvantageEstimator):
        if name is not None and name != estimator.name:
            raise ValueError(f"advantage estimator {estimator.__qualname__} is named {estimator.name!r}, not {name!r}")
        return register_member(ADVANTAGE_ESTIMATORS, "advantage estimator", estimator)
    if not callable(estimator) or name is None:
        raise TypeError(f"{estimator!r}: register an AdvantageEstimator subclass, or a function with its name")
    return register_function(ADVANTAGE_ESTIMATORS, "advantage estimator", AdvantageEstimator, estimator, name,
                             "advantages", _call_with_keywords, needs_greedy_baseline=needs_greedy_baseline,
                             needs_token_statistics=needs_token_statistics)


def advantage_estimator(name: str) -> type[AdvantageEstimator]:
    """The registered estimator ``name``, or ValueError listing the choices."""
    return lookup_named(ADVANTAGE_ESTIMATORS, "advantage_estimator", name)


@torch.no_grad()
def advantages(name: str, rewards: torch.Tensor, *, group_size: int, lengths: Optional[torch.Tensor] = None,
               **inputs_and_options) -> torch.Tensor:
    """The estimator ``name`` on one batch: ``inputs_and_options`` are ``EstimatorInputs`` fields (scale,
    baseline_rewards, mask, old_logps, sum_pi_squared) and the estimator's own options (defaults for the rest);
    ``lengths`` defaults to 1 per completion."""
    inputs = {f.name for f in fields(EstimatorInputs)}
    estimator = advantage_estimator(name).with_options({k: v for k, v in inputs_and_options.items() if k not in inputs})
    lengths = torch.ones_like(rewards) if lengths is None else lengths
    return estimator.advantages(EstimatorInputs(rewards, group_size, lengths, **{
        k: v for k, v in inputs_and_options.items() if k in inputs}))


def _grouped(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if rewards.dim() != 1 or group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be (B,) with B a multiple of group_size={group_size}, got {tuple(rewards.shape)}")
    return rewards.view(-1, group_size)  # (n_prompts, G)


# --------------------------------------------------------------------------------------------
# The estimators the algorithms already compute, registered under verl's names
# --------------------------------------------------------------------------------------------


@register_advantage_estimator
class GRPOEstimator(AdvantageEstimator):
    """GRPO (Shao et al. 2024, DeepSeekMath Sec. 4.1.2):  A_i = (r_i - mean(r_group)) / (std + eps), the std of
    the group (``scale`` "group"), of the batch ("batch", TRL's scale_rewards="batch") or none ("none",
    Dr. GRPO). ``group_advantages`` itself: GRPO's default, bit for bit."""

    name, group_local = "grpo", True

    def advantages(self, x: EstimatorInputs) -> torch.Tensor:
        return group_advantages(x.rewards, x.group_size, x.scale)


@register_advantage_estimator
class RLOOEstimator(AdvantageEstimator):
    """RLOO (Ahmadian et al. 2024, Eq. 7):  A_i = r_i - 1/(G-1) sum_{j != i} r_j  (``rloo_advantages``, no KL)."""

    name = "rloo"

    def advantages(self, x: EstimatorInputs) -> torch.Tensor:
        return rloo_advantages(x.rewards, x.group_size)


def _reinforce_pp(rewards: torch.Tensor, group_size: int, lengths: torch.Tensor, group_baseline: bool) -> torch.Tensor:
    """OpenRLHF's REINFORCE++ token advantages of an outcome reward (no KL in the reward, gamma 1), read back per
    completion: every token of a completion carries the same whitened return."""
    width = max(int(lengths.max()), 1) if lengths.numel() else 1
    mask = (torch.arange(width, device=rewards.device) < lengths.unsqueeze(1)).to(rewards.dtype)  # (B, T)
    advantages, _ = reinforce_pp_advantages(rewards, torch.zeros_like(mask), mask, kl_coef=0.0, group_size=group_size,
                                            group_baseline=group_baseline)
    return advantages[:, 0]


@register_advantage_estimator
class ReinforcePP(AdvantageEstimator):
    """REINFORCE++ (Hu 2025, arXiv 2501.03262), outcome reward:  A_i = (clip(r_i) - mu) / sigma,  mu and sigma the
    token-weighted mean and std over the batch's active tokens (``reinforce_pp_advantages``)."""

    name = "reinforce_plus_plus"

    def advantages(self, x: EstimatorInputs) -> torch.Tensor:
        return _reinforce_pp(x.rewards, x.group_size, x.lengths, group_baseline=False)


@register_advantage_estimator
class ReinforcePPBaseline(AdvantageEstimator):
    """REINFORCE++-baseline (Hu 2025):  s_i = r_i - mean(r_group), then whitened over the batch's active tokens
    as ``reinforce_plus_plus``."""

    name = "reinforce_plus_plus_baseline"

    def advantages(self, x: EstimatorInputs) -> torch.Tensor:
        return _reinforce_pp(x.rewards, x.group_size, x.lengths, group_baseline=True)


# --------------------------------------------------------------------------------------------
# verl's other outcome estimators
# --------------------------------------------------------------------------------------------


@register_advantage_estimator
class ReMax(AdvantageEstimator):
    """ReMax (Li et al. 2023, "ReMax: A Simple, Effective, and Efficient RL Method for Aligning LLMs",
    arXiv 2310.10505, Algorithm 1):

        A_i = r(x, y_i) - r(x, y_greedy(x))

    the reward of the greedy completion of the same prompt as the baseline (``baseline_rewards``, (B,))."""

    name, needs_greedy_baseline = "remax", True

    def advantages(self, x: EstimatorInputs) -> torch.Tensor:
        if x.baseline_rewards is None or x.baseline_rewards.shape != x.rewards.shape:
            raise ValueError("advantage_estimator 'remax' needs baseline_rewards: the greedy completion's reward, one per row")
        return x.rewards - x.baseline_rewards


@register_advantage_estimator
class GPG(AdvantageEstimator):
    """GPG (Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning",
    arXiv 2504.02546), as verl computes it:

        A_i = alpha * (r_i - mean(r_group)),   alpha = B / M,   M = max(1, #{i : r_i != 0})

    no std; alpha corrects the gradient's scale for the samples that carry none (verl counts the nonzero rewards
    as the valid samples)."""

    name = "gpg"

    def advantages(self, x: EstimatorInputs) -> torch.Tensor:
        grouped = _grouped(x.rewards, x.group_size)
        alpha = x.rewards.numel() / torch.count_nonzero(x.rewards).clamp(min=1).to(x.rewards.dtype)
        centred = (grouped - grouped.mean(dim=1, keepdim=True)).masked_fill(tied_rows(grouped), 0.0)
        return (alpha * centred).view(-1)


@register_advantage_estimator
class OPO(AdvantageEstimator):
    """OPO (Hao et al. 2025, "On-Policy RL with Optimal Reward Baseline", arXiv 2505.23585), as verl:

        A_i = r_i - b,   b = sum_j |o_j| r_j / sum_j |o_j|   over the group

    the optimal baseline under the assumption that a completion's gradient norm grows with its length."""

    name = "opo"

    def advantages(self, x: EstimatorInputs) -> torch.Tensor:
        grouped = _grouped(x.rewards, x.group_size)
        weights = x.lengths.to(x.rewards.dtype).view_as(grouped)
        baseline = (weights * grouped).sum(1, keepdim=True) / weights.sum(1, keepdim=True).clamp(min=1.0)
        return (grouped - baseline).masked_fill(tied_rows(grouped), 0.0).view(-1)


@register_advantage_estimator
class GRPOPassK(AdvantageEstimator):
    """Pass@k training (arXiv 2503.19595, the paper verl cites), verl's "grpo_passk": only the best completion of a
    group is pushed up, by how far it beats the runner-up,

        A_best = (r_(1) - r_(2)) / (std + eps),   A_i = 0 for every other i

    (r_(1) >= r_(2) the group's two largest rewards; the std of the group, of the batch or none as ``scale``;
    verl's norm_adv_by_std_in_grpo is "group" vs "none"). Tied best rewards give 0."""

    name = "grpo_passk"
    eps: ClassVar[float] = 1e-6  # verl's epsilon

    def advantages(self, x: EstimatorInputs) -> torch.Tensor:
        if x.scale not in ADVANTAGE_SCALES:
            raise ValueError(f"unknown advantage scale {x.scale!r}; choose from {', '.join(ADVANTAGE_SCALES)}")
        grouped = _grouped(x.rewards, x.group_size)
        if x.group_size < 2:
            raise ValueError(f"grpo_passk needs group_size >= 2, got {x.group_size}")
        top, index = grouped.topk(2, dim=1)  # (n, 2)
        margin = top[:, :1] - top[:, 1:]  # (n, 1)
        if x.scale == "group":
            margin = margin / (grouped.std(dim=1, keepdim=True) + self.eps)
        elif x.scale == "batch":
            margin = margin / (x.rewards.std() + self.eps)
        return torch.zeros_like(grouped).scatter(1, index[:, :1], margin).view(-1)


@register_advantage_estimator
class OptimalTokenBaseline(AdvantageEstimator):
    """The optimal token baseline (verl 0.9.1's "optimal_token_baseline"): one baseline per position t of each
    group, the variance-minimising baseline of the score-function gradient, weighted by each path's accumulated
    score norm,

        w_{i,j} = ||grad_z log pi(o_{i,j})||^2 = 1 - 2 pi_old(o_{i,j}) + sum_v pi_old(v)^2   (z: the logits at j)
        W_{i,t} = sum_{j <= t} w_{i,j}                                 (cumulative path variance)
        B_t     = sum_i G_{i,t} W_{i,t} / (sum_i W_{i,t} + eps),  over the group's completions active at t
        A_{i,t} = G_{i,t} - B_t

    with G_{i,t} the reward-to-go, r_i on every token for an outcome reward (gamma 1). ``handle_zero_tail`` (verl's
    default): where a group's single longest completion runs past the second longest, its baseline is 0 (alone
    there, it would be its own baseline and learn nothing). A group whose rewards all tie gets 0 (this module's
    rule; verl leaves r_i on such a tail). Reads ``mask``, ``old_logps``, ``sum_pi_squared`` (B, T); returns (B, T)."""

    name, needs_token_statistics, group_local = "optimal_token_baseline", True, True
    eps: ClassVar[float] = 1e-8  # verl's epsilon

    @dataclass
    class Options(Configurable.Options):
        handle_zero_tail: bool = field(default=True, metadata={
            "help": "baseline 0 for a group's single longest completion past the second longest (verl: on)"})

    def advantages(self, x: EstimatorInputs) -> torch.Tensor:
        grouped = _grouped(x.rewards, x.group_size)
        mask = x.mask.to(x.rewards.dtype)
        n, width, group_size = grouped.size(0), mask.size(1), x.group_size
        returns = (x.rewards.unsqueeze(1) * mask).view(n, group_size, width)  # (n, G, T)
        path = ((1 - 2 * torch.exp(x.old_logps) + x.sum_pi_squared).to(x.rewards.dtype) * mask).cumsum(-1)
        path, active = path.view(n, group_size, width), mask.view(n, group_size, width)
        if group_size < 2:
            return returns.view(-1, width)
        baseline = (returns * path * active).sum(1, keepdim=True) / ((path * active).sum(1, keepdim=True) + self.eps)
        baseline = baseline.expand(n, group_size, width)
        if self.options.handle_zero_tail:
            baseline = baseline.masked_fill(_alone_in_the_tail(active), 0.0)
        advantages = (returns - baseline) * active
        return advantages.masked_fill(tied_rows(grouped).unsqueeze(-1), 0.0).view(-1, width)


def _alone_in_the_tail(active: torch.Tensor) -> torch.Tensor:
    """(n, G, T) True at the positions of each group's single longest completion past the second longest."""
    lengths = active.sum(-1)  # (n, G)
    ordered = lengths.sort(dim=1).values
    longest, second = ordered[:, -1:], ordered[:, -2:-1]  # (n, 1)
    alone = (lengths == longest) & ((lengths == longest).sum(1, keepdim=True) == 1) & (longest > second)
    tail = torch.arange(active.size(-1), device=active.device).view(1, 1, -1) >= second.unsqueeze(-1)  # (n, 1, T)
    return alone.unsqueeze(-1) & tail


# --------------------------------------------------------------------------------------------
# The 2026 outcome estimators: MaxRL (SkyRL) and FlashREINFORCE (OpenRLHF)
# --------------------------------------------------------------------------------------------


@register_advantage_estimator
class MaxRL(AdvantageEstimator):
    """MaxRL (arXiv 2602.02710; SkyRL 0.4.0's "maxrl", ``compute_maxrl_advantage``): the group-relative advantage
    normalised by the group's mean reward instead of its std,

        A_i = (r_i - mean(r_group)) / (mean(r_group) + eps),   eps = 1e-6 (SkyRL's)
        A_i = r_i                                               G = 1 (SkyRL: a lone completion's mean is 0)

    For binary rewards, mean(r_group) is the group's pass rate p and a success gets (1 - p) / p: rare successes
    weigh most (maximum likelihood of the pass@k objective). A group of all failures has mean 0 and gets 0; a
    tied group gets 0 exactly (this module's rule). As in SkyRL, nothing guards a non-binary reward whose group
    mean is near 0 or negative: there the advantage is huge or flips sign (use binary rewards)."""

    name, group_local = "maxrl", True
    eps: ClassVar[float] = 1e-6  # SkyRL's epsilon

    def advantages(self, x: EstimatorInputs) -> torch.Tensor:
        grouped = _grouped(x.rewards, x.group_size)
        if x.group_size == 1:
            return x.rewards.clone()
        mean = grouped.mean(dim=1, keepdim=True)
        return ((grouped - mean) / (mean + self.eps)).masked_fill(tied_rows(grouped), 0.0).view(-1)


def batch_mean_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """FlashREINFORCE's advantage: A_i = r_i - mean_j r_j over the whole batch (B,), no group, no whitening;
    0 exactly when every reward ties (a float32 mean of equal values can be off by an ulp)."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be (B,), got {tuple(rewards.shape)}")
    if rewards.numel() == 0 or bool(tied_rows(rewards.view(1, -1))):
        return torch.zeros_like(rewards)
    return rewards - rewards.mean()


@register_advantage_estimator
class FlashREINFORCE(AdvantageEstimator):
    """FlashREINFORCE (OpenRLHF 0.11.2's advantage estimator "flash_reinforce", critic-free single-rollout RL):
    the batch's mean reward as the baseline, no group and no whitening,

        A_i = r_i - 1/B sum_j r_j          (``batch_mean_advantages``; OpenRLHF: rewards - rewards.mean())

    meant for one completion per prompt (OpenRLHF's n_samples_per_prompt 1: REINFORCE's ``baseline`` batch_mean
    here); under GRPO the groups are ignored. Batch-wide: under data parallelism every rank's rows are gathered."""

    name = "flash_reinforce"

    def advantages(self, x: EstimatorInputs) -> torch.Tensor:
        return batch_mean_advantages(x.rewards)


# verl's "tir_optimal_token_baseline" (the multi-turn variant, tool-call tokens masked out of the path) is not here:
# this suite's rollouts are single-turn.


# --------------------------------------------------------------------------------------------
# RGRA's ablation (arXiv 2603.18756): positive advantages only
# --------------------------------------------------------------------------------------------


@register_advantage_estimator
class RGRAPositive(AdvantageEstimator):
    """GRPO's advantage with every negative one set to 0, the ablation of Carrino et al. 2026 (arXiv 2603.18756,
    "training solely on actions above a baseline"):

        A_i = max(0, (r_i - mean(r_group)) / (std + eps))

    scaled as ``grpo`` (``scale``: the group's std, the batch's, or none). A completion at or below its group's
    mean gets no gradient, so the policy hears no negative feedback; a tied group gets 0, as with ``grpo``.
    Not declared ``group_local`` (gathering every rank's rows is always right)."""

    name = "rgra_positive"

    def advantages(self, x: EstimatorInputs) -> torch.Tensor:
        return group_advantages(x.rewards, x.group_size, x.scale).clamp(min=0.0)
