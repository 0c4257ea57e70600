"""Pure loss functions: tensors in, scalar tensor out. No models, no optimizers, no state.

Shapes used throughout:
    B  completions in the batch (prompts x group size, ordered group by group)
    T  completion length (right-padded); ``mask`` is 1 on completion tokens up to and including
       the first EOS and 0 after it (the mask convention, stated once: algorithms/rollout.py).

Each variant of GRPO's aggregation is a small named function in ``LOSS_AGGREGATIONS`` rather than
a branch inside the loss, so reading one variant means reading four lines.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F

GRPO_LEVELS = ("token", "sequence")
ADVANTAGE_SCALES = ("group", "batch", "none")


# --------------------------------------------------------------------------------------------
# GRPO (DeepSeekMath, Shao et al. 2024, Eq. 21) and its aggregation variants
# --------------------------------------------------------------------------------------------


def group_advantages(
    rewards: torch.Tensor, group_size: int, scale: str = "group", eps: float = 1e-4
) -> torch.Tensor:
    """Group-relative advantages (DeepSeekMath Sec. 4.1.2, "outcome supervision").

        A_i = (r_i - mean(r_group)) / (std(r_group) + eps)     scale="group"   (GRPO)
        A_i = (r_i - mean(r_group)) / (std(r_batch) + eps)     scale="batch"   (Hu et al., REINFORCE++)
        A_i =  r_i - mean(r_group)                             scale="none"    (Dr. GRPO, Liu et al. 2025)

    ``rewards`` is (B,) ordered group by group (B = n_prompts * group_size). The standard deviation
    is the unbiased one (Bessel's correction), as TRL uses. A group whose rewards are all equal gets
    advantage 0 exactly: the numerator is 0 and eps keeps the denominator positive.
    Returns (B,).
    """
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"unknown advantage scale {scale!r}; expected one of {ADVANTAGE_SCALES}")
    if rewards.dim() != 1 or rewards.numel() % group_size != 0:
        raise ValueError(f"rewards must be (B,) with B a multiple of group_size={group_size}, got {tuple(rewards.shape)}")
    grouped = rewards.view(-1, group_size)  # (n_prompts, G)
    centred = (grouped - grouped.mean(dim=1, keepdim=True)).view(-1)  # (B,)
    if scale == "none":
        return centred
    if scale == "group":
        std = grouped.std(dim=1, keepdim=True).expand_as(grouped).reshape(-1)
    else:
        std = rewards.std().expand_as(rewards)
    return centred / (std + eps)


def k3_kl(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """Per-token unbiased KL estimator k3 (Schulman 2020), DeepSeekMath Eq. 4:

        KL[pi || pi_ref] ~= pi_ref/pi - log(pi_ref/pi) - 1 = exp(ref - logp) - (ref - logp) - 1  (>= 0)
    """
    delta = ref_logps - logps
    return torch.exp(delta) - delta - 1


def _masked_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum()


def _aggregate_grpo(per_token: torch.Tensor, mask: torch.Tensor, max_len: Optional[int], n_items) -> torch.Tensor:
    """Mean over each completion's own tokens, then over completions (DeepSeekMath Eq. 21's 1/|o_i|)."""
    return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()


def _aggregate_bnpo(per_token: torch.Tensor, mask: torch.Tensor, max_len: Optional[int], n_items) -> torch.Tensor:
    """Mean over all active tokens of the batch: long completions weigh more (batch-normalised PO)."""
    return _masked_sum(per_token, mask) / mask.sum().clamp(min=1.0)


def _aggregate_dr_grpo(per_token: torch.Tensor, mask: torch.Tensor, max_len: Optional[int], n_items) -> torch.Tensor:
    """Dr. GRPO (Liu et al. 2025): a constant normaliser B * max_completion_length removes length bias."""
    if max_len is None:
        raise ValueError("loss_type='dr_grpo' needs max_completion_length")
    return _masked_sum(per_token, mask) / (per_token.size(0) * max_len)


def _aggregate_dapo(per_token: torch.Tensor, mask: torch.Tensor, max_len: Optional[int], n_items) -> torch.Tensor:
    """DAPO (Yu et al. 2025) token-level mean over the *whole generation batch*.

    Equals bnpo when the loss sees the whole generation batch at once; when it is called on a
    micro-batch, ``num_items_in_batch`` carries the generation batch's active-token count.
    """
    normaliser = mask.sum() if n_items is None else torch.as_tensor(n_items, dtype=per_token.dtype)
    return _masked_sum(per_token, mask) / normaliser.clamp(min=1.0)


LOSS_AGGREGATIONS: dict[str, Callable] = {
    "grpo": _aggregate_grpo,
    "bnpo": _aggregate_bnpo,
    "dr_grpo": _aggregate_dr_grpo,
    "dapo": _aggregate_dapo,
}
GRPO_LOSS_TYPES = tuple(LOSS_AGGREGATIONS)


def importance_ratio(logps: torch.Tensor, old_logps: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """pi_theta / pi_theta_old, per token (B, T) or per completion (B, 1).

    token:    r_{i,t} = exp(logp_{i,t} - old_{i,t})                              (PPO, GRPO)
    sequence: s_i     = exp( (1/|o_i|) sum_t (logp_{i,t} - old_{i,t}) )          (GSPO, Zheng et al. 2025)
    """
    log_ratio = logps - old_logps
    if level == "token":
        return torch.exp(log_ratio)
    if level == "sequence":
        mean_log_ratio = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        return torch.exp(mean_log_ratio).unsqueeze(-1)
    raise ValueError(f"unknown importance-ratio level {level!r}; expected one of {GRPO_LEVELS}")


def grpo_loss(
    logps: torch.Tensor,
    old_logps: Optional[torch.Tensor],
    ref_logps: Optional[torch.Tensor],
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    level: str = "token",
    loss_type: str = "grpo",
    epsilon: float = 0.2,
    epsilon_high: Optional[float] = None,
    beta: float = 0.0,
    max_completion_length: Optional[int] = None,
    kl_bias_correction: bool = False,
    num_items_in_batch: Optional[float] = None,
) -> torch.Tensor:
    """GRPO surrogate loss (DeepSeekMath, Shao et al. 2024, Eq. 21), to be minimised:

        J(theta) = 1/G sum_i 1/|o_i| sum_t { min( r_{i,t} A_i, clip(r_{i,t}, 1-eps, 1+eps_high) A_i )
                                             - beta * KL_k3[pi_theta || pi_ref]_{i,t} }
        loss = -J(theta)

    with r_{i,t} = pi_theta(o_{i,t}|q,o_{i,<t}) / pi_theta_old(o_{i,t}|q,o_{i,<t}) (``level="token"``)
    or one ratio per completion, exp of its mean token log-ratio (``level="sequence"``, GSPO).

    Args:
        logps: (B, T) per-token log-probs under the current policy (carries the gradient).
        old_logps: (B, T) log-probs of the sampling policy, or None for on-policy (mu = 1): then the
            ratio is exp(logps - logps.detach()) = 1 in value with the policy gradient as its gradient,
            which is why the loss *value* is 0 at mu = 1 and beta = 0 with loss_type "grpo".
        ref_logps: (B, T) reference-policy log-probs; may be None when beta == 0.
        advantages: (B,) one advantage per completion (``group_advantages``).
        mask: (B, T) 1 on completion tokens up to and including the first EOS.
        level: "token" or "sequence".
        loss_type: how per-token terms are averaged (``LOSS_AGGREGATIONS``): "grpo" (the paper),
            "bnpo", "dr_grpo" (needs max_completion_length) or "dapo".
        epsilon, epsilon_high: clip range [1 - epsilon, 1 + epsilon_high]; epsilon_high defaults to
            epsilon (DAPO's clip-higher uses 0.28).
        beta: weight of the k3 KL penalty to the reference (DeepSeekMath uses 0.04).
        kl_bias_correction: multiply the KL term by the importance ratio, as TRL's
            ``use_bias_correction_kl``; off in the paper.
        num_items_in_batch: for "dapo" on a micro-batch, the active-token count of the generation batch.
    Returns:
        scalar loss tensor.
    """
    if loss_type not in LOSS_AGGREGATIONS:
        raise ValueError(f"unknown loss_type {loss_type!r}; expected one of {GRPO_LOSS_TYPES}")
    if epsilon < 0 or (epsilon_high is not None and epsilon_high < 0) or beta < 0:
        raise ValueError("epsilon, epsilon_high and beta must be >= 0")
    mask = mask.to(logps.dtype)
    old_logps = logps.detach() if old_logps is None else old_logps
    ratio = importance_ratio(logps, old_logps, mask, level)  # (B, T) or (B, 1)
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + (epsilon if epsilon_high is None else epsilon_high))
    adv = advantages.unsqueeze(-1)  # (B, 1)
    per_token = -torch.min(ratio * adv, clipped * adv)
    if beta != 0.0:
        if ref_logps is None:
            raise ValueError("beta > 0 needs ref_logps")
        kl = k3_kl(logps, ref_logps)
        per_token = per_token + beta * (kl * ratio if kl_bias_correction else kl)
    per_token = per_token.expand_as(logps)  # sequence level with beta = 0 is still (B, 1)
    return LOSS_AGGREGATIONS[loss_type](per_token, mask, max_completion_length, num_items_in_batch)


def clip_fraction(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    level: str = "token",
    epsilon: float = 0.2,
    epsilon_high: Optional[float] = None,
) -> torch.Tensor:
    """Share of active tokens whose ratio left the clip range on the side where clipping binds
    (r < 1-eps with A < 0, or r > 1+eps_high with A > 0), as TRL's ``clip_ratio/region_mean``."""
    mask = mask.to(logps.dtype)
    ratio = importance_ratio(logps.detach(), old_logps, mask, level).expand_as(logps)
    adv = advantages.unsqueeze(-1)
    high = 1 + (epsilon if epsilon_high is None else epsilon_high)
    clipped = ((ratio < 1 - epsilon) & (adv < 0)) | ((ratio > high) & (adv > 0))
    return (clipped.to(mask.dtype) * mask).sum() / mask.sum().clamp(min=1.0)


def masked_mean_per_sequence(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) -> (B,): mean over each completion's active tokens."""
    mask = mask.to(values.dtype)
    return (values * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


# --------------------------------------------------------------------------------------------
# DPO (Rafailov et al. 2023, Eq. 7)
# --------------------------------------------------------------------------------------------


def dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float = 0.1,
) -> torch.Tensor:
    """DPO sigmoid loss (Rafailov et al. 2023, Eq. 7), mean over pairs:

        L = -log sigma( beta * [ (log pi(y_w|x) - log pi_ref(y_w|x)) - (log pi(y_l|x) - log pi_ref(y_l|x)) ] )

    All inputs are (B,) *sequence* log-probs (sums over completion tokens). Returns a scalar.
    """
    logits = (policy_chosen_logps - ref_chosen_logps) - (policy_rejected_logps - ref_rejected_logps)  # (B,)
    return -F.logsigmoid(beta * logits).mean()


# --------------------------------------------------------------------------------------------
# REINFORCE (Williams 1992) with a baseline
# --------------------------------------------------------------------------------------------


def sequence_logps(logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) per-token log-probs -> (B,) log pi(o|q) = sum_t log pi(o_t | q, o_<t) over active tokens."""
    return (logps * mask.to(logps.dtype)).sum(-1)


def reinforce_loss(
    logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ref_logps: Optional[torch.Tensor] = None,
    beta: float = 0.0,
) -> torch.Tensor:
    """REINFORCE with a baseline (Williams 1992; Ahmadian et al. 2024 for LLMs), to be minimised:

        L = -1/B sum_i (r_i - b) * log pi(o_i|q_i)  +  beta * 1/B sum_i sum_t KL_k3[pi || pi_ref]_{i,t}

    with log pi(o_i|q_i) the *sequence* log-prob (sum over the completion's active tokens) and
    ``advantages`` = r_i - b already computed (b: a moving average of rewards, or 0).

    Args:
        logps: (B, T) per-token log-probs under the current policy (carries the gradient).
        advantages: (B,) r_i - b, no gradient.
        mask: (B, T) the mask convention.
        ref_logps: (B, T) reference log-probs; needed when beta > 0.
        beta: weight of the k3 KL penalty, summed over each completion's tokens like the log-prob.
    Returns:
        scalar loss tensor.
    """
    if beta < 0:
        raise ValueError("beta must be >= 0")
    loss = -(advantages * sequence_logps(logps, mask)).mean()
    if beta != 0.0:
        if ref_logps is None:
            raise ValueError("beta > 0 needs ref_logps")
        loss = loss + beta * sequence_logps(k3_kl(logps, ref_logps), mask).mean()
    return loss


# --------------------------------------------------------------------------------------------
# PPO with a critic (Schulman et al. 2017; the RLHF recipe of Ziegler et al. 2019, Ouyang et al. 2022)
# --------------------------------------------------------------------------------------------


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over all active tokens of the batch."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over the active tokens (PPO's advantage whitening); 0 on padding.

    The variance is the unbiased one over active tokens, as TRL's ``masked_whiten``.
    """
    mask = mask.to(values.dtype)
    mean = masked_mean(values, mask)
    n = mask.sum()
    var = (((values - mean) ** 2) * mask).sum() / (n - 1).clamp(min=1.0)
    return (values - mean) * torch.rsqrt(var + eps) * mask


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 0.95
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016, Eq. 16) over completion tokens:

        delta_t = r_t + gamma * V(s_{t+1}) - V(s_t)          V(s_{T_i}) = 0 after the last active token
        A_t     = sum_{l >= 0} (gamma * lam)^l * delta_{t+l}  (computed backwards: A_t = delta_t + gamma lam A_{t+1})
        R_t     = A_t + V(s_t)                                 the value targets ("returns")

    Args:
        rewards: (B, T) per-token rewards (the RLHF recipe: -kl_coef * KL_t, plus the score on the last token).
        values: (B, T) V(s_t), the critic's value of the state before token t.
        mask: (B, T) the mask convention; both outputs are 0 on padding.
    Returns:
        (advantages, returns), each (B, T), no gradient.
    """
    mask = mask.to(values.dtype)
    rewards, values = (rewards * mask).detach(), (values * mask).detach()
    advantages = torch.zeros_like(values)
    running = torch.zeros_like(values[:, 0])  # (B,)
    T = values.size(1)
    for t in reversed(range(T)):
        next_value = values[:, t + 1] if t + 1 < T else torch.zeros_like(running)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = delta + gamma * lam * running
        advantages[:, t] = running
    advantages = advantages * mask  # padding past the end carries nothing back: rewards and values are 0 there
    return advantages, (advantages + values) * mask


def ppo_policy_loss(
    logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, epsilon: float = 0.2
) -> torch.Tensor:
    """PPO's clipped surrogate (Schulman et al. 2017, Eq. 7), per token, to be minimised:

        L = mean_{active i,t} max( -A_{i,t} r_{i,t},  -A_{i,t} clip(r_{i,t}, 1-eps, 1+eps) ),
        r_{i,t} = exp(log pi(o_t) - log pi_old(o_t))

    ``advantages`` is (B, T), one per token (GAE), unlike GRPO's one per completion.
    """
    ratio = torch.exp(logps - old_logps)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - epsilon, 1 + epsilon)
    return masked_mean(torch.max(unclipped, clipped), mask)


def ppo_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, clip: float = 0.2
) -> torch.Tensor:
    """PPO's clipped value loss (as in OpenAI baselines and TRL's PPOTrainer), to be minimised:

        V_clip = V_old + clip(V - V_old, -c, c)
        L_V    = 1/2 * mean_{active i,t} max( (V - R)^2, (V_clip - R)^2 )
    """
    clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    return 0.5 * masked_mean(torch.max((values - returns) ** 2, (clipped - returns) ** 2), mask)


def ppo_clip_fraction(logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, epsilon: float = 0.2) -> torch.Tensor:
    """Share of active tokens where the clipped term is the one ``ppo_policy_loss`` keeps (TRL's pg_clipfrac)."""
    ratio = torch.exp(logps.detach() - old_logps)
    clipped = -advantages * torch.clamp(ratio, 1 - epsilon, 1 + epsilon) > -advantages * ratio
    return masked_mean(clipped.to(logps.dtype), mask)
