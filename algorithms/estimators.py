"""Advantage estimators for outcome rewards: one advantage per completion, registered by name.

verl's pattern (``core_algos.register_adv_est``): ``@register_advantage_estimator("name")`` at the definition
registers a pure function; a second, different function under a taken name is refused; ``advantage_estimator``
with an unknown name raises one ValueError listing the choices. An installed package adds one without editing
this package, through the entry-point group ``grpo_bench.advantage_estimators`` (the entry point loads the
decorated function) or by calling ``register_advantage_estimator(name)(fn)``. GRPO picks one with its
``advantage_estimator`` setting (``--advantage-estimator``).

Every estimator takes the same keyword arguments and reads what it needs:

    rewards           (B,) one reward per completion, group by group (B = prompts x G)
    group_size        G
    lengths           (B,) completion lengths in tokens (the mask convention: up to and including the first EOS)
    scale             GRPO's ``scale_rewards``: "group", "batch" or "none"
    baseline_rewards  (B,) the reward of the greedy completion of each row's prompt, or None; estimators
                      registered with ``needs_greedy_baseline=True`` (ReMax) get it

and returns (B,) advantages, no gradient. Estimators registered with ``needs_token_statistics=True`` (the optimal
token baseline) also get ``mask`` (B, T), ``old_logps`` (B, T) (the sampling policy's log-probs of the sampled
tokens) and ``sum_pi_squared`` (B, T) (sum over the vocabulary of pi_old(v)^2 at each position), and return (B, T)
per-token advantages, 0 on padding. A group whose rewards all tie gets 0 exactly (no signal, as
``group_advantages`` guarantees; see algorithms/losses.py on why rounding must not leak into a step).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from algorithms.losses import ADVANTAGE_SCALES, group_advantages, reinforce_pp_advantages, rloo_advantages, tied_rows
from algorithms.registry import lookup_named, register_named

ADVANTAGE_ESTIMATORS: dict[str, Callable] = {}
# Estimators whose baseline is the reward of a greedy completion of the same prompt: GRPO samples one per prompt.
GREEDY_BASELINE_ESTIMATORS: set[str] = set()
# Estimators of per-token advantages from the sampling policy's token statistics (old log-probs, sum of pi^2).
TOKEN_STATISTICS_ESTIMATORS: set[str] = set()


def register_advantage_estimator(fn_or_name=None, *, name: Optional[str] = None, needs_greedy_baseline: bool = False,
                                 needs_token_statistics: bool = False):
    """Register an advantage estimator: ``ADVANTAGE_ESTIMATORS[name] = fn``. As a decorator at the definition,
    ``@register_advantage_estimator("name")``; as a call, ``register_advantage_estimator(fn, name=...)`` (the
    shape of ``register_algorithm``, which the entry-point group ``grpo_bench.advantage_estimators`` uses).
    ``needs_greedy_baseline``: GRPO passes ``baseline_rewards``, a greedy completion's reward per prompt;
    ``needs_token_statistics``: GRPO passes ``mask``, ``old_logps`` and ``sum_pi_squared`` and takes (B, T)
    advantages back. A second, different function under ``name`` is refused; the same one again is a no-op."""
    if callable(fn_or_name):
        if name is None:
            raise TypeError("register_advantage_estimator(fn, name=...) needs the name")
        return register_advantage_estimator(name, needs_greedy_baseline=needs_greedy_baseline,
                                            needs_token_statistics=needs_token_statistics)(fn_or_name)
    name = fn_or_name or name

    def register(fn: Callable) -> Callable:
        register_named(ADVANTAGE_ESTIMATORS, "advantage estimator", name, fn)
        if needs_greedy_baseline:
            GREEDY_BASELINE_ESTIMATORS.add(name)
        if needs_token_statistics:
            TOKEN_STATISTICS_ESTIMATORS.add(name)
        return fn

    return register


def advantage_estimator(name: str) -> Callable:
    """The registered estimator ``name``, or ValueError listing the choices."""
    return lookup_named(ADVANTAGE_ESTIMATORS, "advantage_estimator", name)


def _grouped(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if rewards.dim() != 1 or group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be (B,) with B a multiple of group_size={group_size}, got {tuple(rewards.shape)}")
    return rewards.view(-1, group_size)  # (n_prompts, G)


# --------------------------------------------------------------------------------------------
# The estimators the algorithms already compute, registered under verl's names
# --------------------------------------------------------------------------------------------


@register_advantage_estimator("grpo")
@torch.no_grad()
def grpo_estimator(rewards: torch.Tensor, *, group_size: int, scale: str = "group", **_) -> torch.Tensor:
    """GRPO (Shao et al. 2024, DeepSeekMath Sec. 4.1.2):  A_i = (r_i - mean(r_group)) / (std + eps), the std of
    the group (``scale`` "group"), of the batch ("batch", TRL's scale_rewards="batch") or none ("none",
    Dr. GRPO). ``group_advantages`` itself: GRPO's default, bit for bit."""
    return group_advantages(rewards, group_size, scale)


@register_advantage_estimator("rloo")
@torch.no_grad()
def rloo_estimator(rewards: torch.Tensor, *, group_size: int, **_) -> torch.Tensor:
    """RLOO (Ahmadian et al. 2024, Eq. 7):  A_i = r_i - 1/(G-1) sum_{j != i} r_j  (``rloo_advantages``, no KL)."""
    return rloo_advantages(rewards, group_size)


def _reinforce_pp(rewards: torch.Tensor, group_size: int, lengths: torch.Tensor, group_baseline: bool) -> torch.Tensor:
    """OpenRLHF's REINFORCE++ token advantages of an outcome reward (no KL in the reward, gamma 1), read back per
    completion: every token of a completion carries the same whitened return."""
    width = max(int(lengths.max()), 1) if lengths.numel() else 1
    mask = (torch.arange(width, device=rewards.device) < lengths.unsqueeze(1)).to(rewards.dtype)  # (B, T)
    advantages, _ = reinforce_pp_advantages(rewards, torch.zeros_like(mask), mask, kl_coef=0.0, group_size=group_size,
                                            group_baseline=group_baseline)
    return advantages[:, 0]


@register_advantage_estimator("reinforce_plus_plus")
@torch.no_grad()
def reinforce_pp_estimator(rewards: torch.Tensor, *, group_size: int, lengths: torch.Tensor, **_) -> torch.Tensor:
    """REINFORCE++ (Hu 2025, arXiv 2501.03262), outcome reward:  A_i = (clip(r_i) - mu) / sigma,  mu and sigma the
    token-weighted mean and std over the batch's active tokens (``reinforce_pp_advantages``)."""
    return _reinforce_pp(rewards, group_size, lengths, group_baseline=False)


@register_advantage_estimator("reinforce_plus_plus_baseline")
@torch.no_grad()
def reinforce_pp_baseline_estimator(rewards: torch.Tensor, *, group_size: int, lengths: torch.Tensor, **_) -> torch.Tensor:
    """REINFORCE++-baseline (Hu 2025):  s_i = r_i - mean(r_group), then whitened over the batch's active tokens
    as ``reinforce_plus_plus``."""
    return _reinforce_pp(rewards, group_size, lengths, group_baseline=True)


# --------------------------------------------------------------------------------------------
# verl's other outcome estimators
# --------------------------------------------------------------------------------------------


@register_advantage_estimator("remax", needs_greedy_baseline=True)
@torch.no_grad()
def remax_advantages(rewards: torch.Tensor, *, baseline_rewards: Optional[torch.Tensor] = None, **_) -> torch.Tensor:
    """ReMax (Li et al. 2023, "ReMax: A Simple, Effective, and Efficient RL Method for Aligning LLMs",
    arXiv 2310.10505, Algorithm 1):

        A_i = r(x, y_i) - r(x, y_greedy(x))

    the reward of the greedy completion of the same prompt as the baseline (``baseline_rewards``, (B,))."""
    if baseline_rewards is None or baseline_rewards.shape != rewards.shape:
        raise ValueError("advantage_estimator 'remax' needs baseline_rewards: the greedy completion's reward, one per row")
    return rewards - baseline_rewards


@register_advantage_estimator("gpg")
@torch.no_grad()
def gpg_advantages(rewards: torch.Tensor, *, group_size: int, **_) -> torch.Tensor:
    """GPG (Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning",
    arXiv 2504.02546), as verl computes it:

        A_i = alpha * (r_i - mean(r_group)),   alpha = B / M,   M = max(1, #{i : r_i != 0})

    no std; alpha corrects the gradient's scale for the samples that carry none (verl counts the nonzero rewards
    as the valid samples)."""
    grouped = _grouped(rewards, group_size)
    alpha = rewards.numel() / torch.count_nonzero(rewards).clamp(min=1).to(rewards.dtype)
    centred = (grouped - grouped.mean(dim=1, keepdim=True)).masked_fill(tied_rows(grouped), 0.0)
    return (alpha * centred).view(-1)


@register_advantage_estimator("opo")
@torch.no_grad()
def opo_advantages(rewards: torch.Tensor, *, group_size: int, lengths: torch.Tensor, **_) -> torch.Tensor:
    """OPO (Hao et al. 2025, "On-Policy RL with Optimal Reward Baseline", arXiv 2505.23585), as verl:

        A_i = r_i - b,   b = sum_j |o_j| r_j / sum_j |o_j|   over the group

    the optimal baseline under the assumption that a completion's gradient norm grows with its length."""
    grouped = _grouped(rewards, group_size)
    weights = lengths.to(rewards.dtype).view_as(grouped)
    baseline = (weights * grouped).sum(1, keepdim=True) / weights.sum(1, keepdim=True).clamp(min=1.0)
    return (grouped - baseline).masked_fill(tied_rows(grouped), 0.0).view(-1)


@register_advantage_estimator("grpo_passk")
@torch.no_grad()
def grpo_passk_advantages(rewards: torch.Tensor, *, group_size: int, scale: str = "group", eps: float = 1e-6,
                          **_) -> torch.Tensor:
    """Pass@k training (arXiv 2503.19595, the paper verl cites), verl's "grpo_passk": only the best completion of a
    group is pushed up, by how far it beats the runner-up,

        A_best = (r_(1) - r_(2)) / (std + eps),   A_i = 0 for every other i

    (r_(1) >= r_(2) the group's two largest rewards; the std of the group, of the batch or none as ``scale``;
    verl's norm_adv_by_std_in_grpo is "group" vs "none"). Tied best rewards give 0."""
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"unknown advantage scale {scale!r}; choose from {', '.join(ADVANTAGE_SCALES)}")
    grouped = _grouped(rewards, group_size)
    if group_size < 2:
        raise ValueError(f"grpo_passk needs group_size >= 2, got {group_size}")
    top, index = grouped.topk(2, dim=1)  # (n, 2)
    margin = top[:, :1] - top[:, 1:]  # (n, 1)
    if scale == "group":
        margin = margin / (grouped.std(dim=1, keepdim=True) + eps)
    elif scale == "batch":
        margin = margin / (rewards.std() + eps)
    return torch.zeros_like(grouped).scatter(1, index[:, :1], margin).view(-1)


@register_advantage_estimator("optimal_token_baseline", needs_token_statistics=True)
@torch.no_grad()
def optimal_token_baseline_advantages(rewards: torch.Tensor, *, group_size: int, mask: torch.Tensor,
                                      old_logps: torch.Tensor, sum_pi_squared: torch.Tensor,
                                      handle_zero_tail: bool = True, eps: float = 1e-8, **_) -> torch.Tensor:
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
    rule; verl leaves r_i on such a tail). ``mask``, ``old_logps``, ``sum_pi_squared`` (B, T). Returns (B, T)."""
    grouped = _grouped(rewards, group_size)
    mask = mask.to(rewards.dtype)
    n, width = grouped.size(0), mask.size(1)
    returns = (rewards.unsqueeze(1) * mask).view(n, group_size, width)  # (n, G, T)
    path = ((1 - 2 * torch.exp(old_logps) + sum_pi_squared).to(rewards.dtype) * mask).cumsum(-1)
    path, active = path.view(n, group_size, width), mask.view(n, group_size, width)
    if group_size < 2:
        return returns.view(-1, width)
    baseline = (returns * path * active).sum(1, keepdim=True) / ((path * active).sum(1, keepdim=True) + eps)
    baseline = baseline.expand(n, group_size, width)
    if handle_zero_tail:
        lengths = active.sum(-1)  # (n, G)
        ordered = lengths.sort(dim=1).values
        longest, second = ordered[:, -1:], ordered[:, -2:-1]  # (n, 1)
        alone = (lengths == longest) & ((lengths == longest).sum(1, keepdim=True) == 1) & (longest > second)
        tail = torch.arange(width, device=mask.device).view(1, 1, -1) >= second.unsqueeze(-1)  # (n, 1, T)
        baseline = baseline.masked_fill(alone.unsqueeze(-1) & tail, 0.0)
    advantages = (returns - baseline) * active
    return advantages.masked_fill(tied_rows(grouped).unsqueeze(-1), 0.0).view(-1, width)


# verl's "tir_optimal_token_baseline" (the multi-turn variant, tool-call tokens masked out of the path) is not here:
# this suite's rollouts are single-turn.
