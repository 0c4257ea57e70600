"""Pure loss functions: tensors in, scalar tensor out. No models, no optimizers, no state.

Shapes used throughout:
    B  completions in the batch (prompts x group size, ordered group by group)
    T  completion length (right-padded); ``mask`` is 1 on completion tokens up to and including
       the first EOS and 0 after it (the mask convention, stated once: algorithms/rollout.py).

Here: group-relative advantages and the signal test, the masked means, and the losses of the other algorithms
(DPO, REINFORCE, PPO with its critic, RLOO, REINFORCE++) and their reward shaping. GRPO's policy losses, their
registry and ``GRPOLoss`` live in algorithms/policy_losses.py; the KL estimators in algorithms/kl.py; the advantage
estimators' registry in algorithms/estimators.py.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from algorithms.kl import k3_kl
from algorithms.policy_losses import aggregate_token_mean

ADVANTAGE_SCALES = ("group", "batch", "none")


# --------------------------------------------------------------------------------------------
# Ties and signal: a constant has nothing to centre. A float32 mean of G equal rewards is not always
# the reward itself (eight 0.3s: off by 3e-8), and a scale (1 / std, whitening) would blow that rounding
# up into advantages of ~1e-4 -- and AdamW, which normalises the gradient, into a full-size step.
# --------------------------------------------------------------------------------------------


def tied_rows(grouped: torch.Tensor) -> torch.Tensor:
    """(n, G) -> (n, 1) bool: every value of the row is equal (a group whose rewards tie)."""
    return (grouped == grouped[:, :1]).all(dim=1, keepdim=True)


ROUNDING_ULPS = 64  # how far apart, in float eps of their magnitude, two numbers may be and still count as one


def _active_values_differ(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """0-dim bool: the active entries of ``values`` differ by more than rounding, their spread above ROUNDING_ULPS
    float eps of the largest magnitude among them (no sync with the host). One number computed in two rows of a
    batch need not come out equal bit for bit: a critic's value of the same state in two rows differed by 1 ulp on
    an AVX2 EPYC, and whitening would make that rounding a unit-size advantage."""
    active = mask.bool()
    high = values.masked_fill(~active, -math.inf).amax()
    low = values.masked_fill(~active, math.inf).amin()
    return high - low > ROUNDING_ULPS * torch.finfo(values.dtype).eps * torch.maximum(high.abs(), low.abs())


def carries_signal(advantages: torch.Tensor, mask: torch.Tensor) -> bool:
    """Whether some active token has a nonzero advantage. ``advantages`` (B,) per completion or (B, T)
    per token, ``mask`` (B, T). Without one (and without a KL term in the loss) the policy gradient is 0,
    and an optimizer step would still move the weights by AdamW's momentum and weight decay."""
    active = mask.bool()
    if advantages.dim() == 1:
        return bool(((advantages != 0) & active.any(dim=1)).any())
    return bool(((advantages != 0) & active).any())


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
    centred = (grouped - grouped.mean(dim=1, keepdim=True)).masked_fill(tied_rows(grouped), 0.0).view(-1)  # (B,)
    if scale == "none":
        return centred
    if scale == "group":
        std = grouped.std(dim=1, keepdim=True).expand_as(grouped).reshape(-1)
    else:
        std = rewards.std().expand_as(rewards)
    return centred / (std + eps)



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
    kl_coef: float = 0.0,
    return_parts: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, dict[str, float]]:
    """REINFORCE with a baseline (Williams 1992; Ahmadian et al. 2024 for LLMs), to be minimised:

        L = -1/B sum_i (r_i - b) * log pi(o_i|q_i)  +  kl_coef * 1/B sum_i sum_t KL_k3[pi || pi_ref]_{i,t}

    with log pi(o_i|q_i) the *sequence* log-prob (sum over the completion's active tokens) and
    ``advantages`` = r_i - b already computed (b: a moving average of rewards, or 0).

    Args:
        logps: (B, T) per-token log-probs under the current policy (carries the gradient).
        advantages: (B,) r_i - b, no gradient.
        mask: (B, T) the mask convention.
        ref_logps: (B, T) reference log-probs; needed when kl_coef > 0.
        kl_coef: weight of the k3 KL penalty, summed over each completion's tokens like the log-prob.
        return_parts: also return {"policy": the first term, "kl": the second (when kl_coef > 0)}.
    Returns:
        scalar loss tensor; with ``return_parts``, (loss, {part: value}).
    """
    if kl_coef < 0:
        raise ValueError("kl_coef must be >= 0")
    policy = -(advantages * sequence_logps(logps, mask)).mean()
    loss, kl = policy, None
    if kl_coef != 0.0:
        if ref_logps is None:
            raise ValueError("kl_coef > 0 needs ref_logps")
        kl = kl_coef * sequence_logps(k3_kl(logps, ref_logps), mask).mean()
        loss = loss + kl
    if not return_parts:
        return loss
    return loss, {"policy": policy.item(), **({"kl": kl.item()} if kl is not None else {})}


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
    centred = (values - mean) * _active_values_differ(values, mask)  # a constant (to rounding) whitens to exactly 0
    return centred * torch.rsqrt(var + eps) * mask


def gae(
    token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 0.95
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016, Eq. 16) over completion tokens:

        delta_t = r_t + gamma * V(s_{t+1}) - V(s_t)          V(s_{T_i}) = 0 after the last active token
        A_t     = sum_{l >= 0} (gamma * lam)^l * delta_{t+l}  (computed backwards: A_t = delta_t + gamma lam A_{t+1})
        R_t     = A_t + V(s_t)                                 the value targets ("returns")

    Args:
        token_rewards: (B, T) per-token rewards (the RLHF recipe: -kl_coef * KL_t, plus the reward on the last token).
        values: (B, T) V(s_t), the critic's value of the state before token t.
        mask: (B, T) the mask convention; both outputs are 0 on padding.
    Returns:
        (advantages, returns), each (B, T), no gradient.
    """
    mask = mask.to(values.dtype)
    token_rewards, values = (token_rewards * mask).detach(), (values * mask).detach()
    advantages = torch.zeros_like(values)
    running = torch.zeros_like(values[:, 0])  # (B,)
    T = values.size(1)
    for t in reversed(range(T)):
        next_value = values[:, t + 1] if t + 1 < T else torch.zeros_like(running)
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        running = delta + gamma * lam * running
        advantages[:, t] = running
    advantages = advantages * mask  # padding past the end carries nothing back: its rewards and values are 0
    return advantages, (advantages + values) * mask


def ppo_policy_loss(
    logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, epsilon: float = 0.2,
    epsilon_high: Optional[float] = None, num_tokens: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """PPO's clipped surrogate (Schulman et al. 2017, Eq. 7), per token, to be minimised:

        L = mean_{active i,t} max( -A_{i,t} r_{i,t},  -A_{i,t} clip(r_{i,t}, 1-eps, 1+eps_high) ),
        r_{i,t} = exp(log pi(o_t) - log pi_old(o_t))

    ``advantages`` is (B, T), one per token (GAE), unlike GRPO's one per completion; ``epsilon_high``
    defaults to ``epsilon``. ``num_tokens`` replaces the mean's denominator (the active tokens of ``mask``),
    as TRL's ``num_items_in_batch``: a data-parallel rank passes the global count over the world size.
    """
    ratio = torch.exp(logps - old_logps)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - epsilon, 1 + (epsilon if epsilon_high is None else epsilon_high))
    return aggregate_token_mean(torch.max(unclipped, clipped), mask.to(logps.dtype), None, num_tokens)


def ppo_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, clip: float = 0.2,
    num_tokens: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """PPO's clipped value loss (as in OpenAI baselines and TRL's PPOTrainer), to be minimised:

        V_clip = V_old + clip(V - V_old, -c, c)
        L_V    = 1/2 * mean_{active i,t} max( (V - R)^2, (V_clip - R)^2 )

    ``num_tokens`` as in ``ppo_policy_loss``.
    """
    clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    return 0.5 * aggregate_token_mean(torch.max((values - returns) ** 2, (clipped - returns) ** 2), mask.to(values.dtype), None,
                                 num_tokens)


def ppo_clip_fraction(logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                      epsilon: float = 0.2, epsilon_high: Optional[float] = None) -> torch.Tensor:
    """Share of active tokens where the clipped term is the one ``ppo_policy_loss`` keeps (TRL's pg_clipfrac)."""
    ratio = torch.exp(logps.detach() - old_logps)
    high = 1 + (epsilon if epsilon_high is None else epsilon_high)
    clipped = -advantages * torch.clamp(ratio, 1 - epsilon, high) > -advantages * ratio
    return masked_mean(clipped.to(logps.dtype), mask)


# --------------------------------------------------------------------------------------------
# DAPO's overlong reward shaping (Yu et al. 2025, Sec. 3.4)
# --------------------------------------------------------------------------------------------


def overlong_penalty(lengths: torch.Tensor, max_length: int, buffer_len: int, penalty_factor: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment (Eq. 13), added to the task's reward, as verl's DAPO recipe applies it:

        R_length(y) = 0                                      |y| <= L_max - L_cache
                    = ((L_max - L_cache) - |y|) / L_cache     L_max - L_cache < |y| <= L_max
                    = -1                                      L_max < |y|
        times ``penalty_factor``;  L_max = ``max_length`` (the generation limit), L_cache = ``buffer_len``.

    ``lengths`` (B,) completion lengths in tokens, EOS included (the mask's sum). Returns (B,) <= 0.
    """
    exceed = lengths.to(torch.float32) - (max_length - buffer_len)
    return torch.clamp(-exceed / buffer_len, min=-1.0, max=0.0) * penalty_factor


# --------------------------------------------------------------------------------------------
# RLOO (Ahmadian et al. 2024, "Back to Basics"; Kool et al. 2019), as TRL 1.16's RLOOTrainer
# --------------------------------------------------------------------------------------------


def rloo_advantages(
    rewards: torch.Tensor,
    group_size: int,
    *,
    kl: Optional[torch.Tensor] = None,
    kl_coef: float = 0.0,
    normalize: bool = False,
    reward_clip_min: Optional[float] = None,
    reward_clip_max: Optional[float] = None,
) -> torch.Tensor:
    """REINFORCE leave-one-out advantages (Ahmadian et al. 2024, Eq. 7):

        r_i  <- clip(r_i, lo, hi) - kl_coef * KL_i             KL_i = sum_t (log pi_old - log pi_ref)_{i,t}
        A_i   = r_i - 1/(G-1) sum_{j != i, same group} r_j    = G/(G-1) (r_i - mean(r_group))
        A    <- (A - mean(A)) / (std(A) + 1e-4)               over the batch, with ``normalize``

    The KL is TRL's: the k1 estimate summed over each completion's tokens, folded into the reward
    (it can be negative per token, unlike GRPO's k3 in the loss). ``rewards`` (B,) group by group;
    ``kl`` (B,) or None. A group whose rewards tie gets advantage 0. Returns (B,), no gradient.
    """
    if group_size < 2 or rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be (B,) with B a multiple of group_size={group_size} >= 2, got {tuple(rewards.shape)}")
    if reward_clip_min is not None or reward_clip_max is not None:
        rewards = torch.clamp(rewards, min=reward_clip_min, max=reward_clip_max)
    if kl_coef != 0.0:
        rewards = rewards - kl_coef * kl
    grouped = rewards.view(-1, group_size)  # (n_prompts, G)
    baseline = (grouped.sum(1, keepdim=True) - grouped) / (group_size - 1)
    advantages = (grouped - baseline).masked_fill(tied_rows(grouped), 0.0).reshape(-1)
    if normalize:
        std = advantages.std() if advantages.numel() > 1 else advantages.new_zeros(())
        advantages = (advantages - advantages.mean()) / (std + 1e-4)
    return advantages.detach()


def rloo_loss(
    logps: torch.Tensor,
    old_logps: Optional[torch.Tensor],
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    epsilon: float = 0.2,
    epsilon_high: Optional[float] = None,
) -> torch.Tensor:
    """RLOO's policy loss as TRL 1.16 writes it: PPO's clip on the *sequence* ratio, mean over completions,

        s_i  = exp( log pi(o_i|q) - log pi_old(o_i|q) )        (sums of token log-probs, not a mean)
        loss = -1/B sum_i min( s_i A_i, clip(s_i, 1-eps, 1+eps_high) A_i )

    ``old_logps`` None means on-policy (mu = 1): s_i = 1 in value and the gradient is REINFORCE's,
    -1/B sum_i A_i grad log pi(o_i|q). Shapes: logps, old_logps, mask (B, T); advantages (B,).
    """
    seq = sequence_logps(logps, mask)  # (B,)
    old_seq = seq.detach() if old_logps is None else sequence_logps(old_logps, mask)
    ratio = torch.exp(seq - old_seq)
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + (epsilon if epsilon_high is None else epsilon_high))
    return -torch.min(ratio * advantages, clipped * advantages).mean()


def rloo_clip_fraction(logps, old_logps, advantages, mask, *, epsilon=0.2, epsilon_high=None) -> torch.Tensor:
    """Share of completions whose sequence ratio left the clip range on the binding side (TRL's region_mean)."""
    ratio = torch.exp(sequence_logps(logps.detach(), mask) - sequence_logps(old_logps, mask))
    high = 1 + (epsilon if epsilon_high is None else epsilon_high)
    return (((ratio < 1 - epsilon) & (advantages < 0)) | ((ratio > high) & (advantages > 0))).float().mean()


# --------------------------------------------------------------------------------------------
# REINFORCE++ (Hu 2025), as OpenRLHF's experience maker computes it
# --------------------------------------------------------------------------------------------


def kl_penalised_rewards(
    rewards: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, kl_coef: float,
    clip_min: Optional[float] = None, clip_max: Optional[float] = None,
) -> torch.Tensor:
    """Per-token rewards (OpenRLHF's ``compute_reward``): every token pays -kl_coef * KL_t, the last
    active token also gets the (clipped) reward:  r_{i,t} = -kl_coef KL_{i,t} + [t = last_i] clip(r_i, lo, hi).

    ``rewards`` (B,), ``kl`` and ``mask`` (B, T). Returns (B, T), 0 on padding."""
    mask = mask.to(kl.dtype)
    if clip_min is not None or clip_max is not None:
        rewards = torch.clamp(rewards, min=clip_min, max=clip_max)
    last = (mask.size(1) - 1 - mask.long().flip(1).argmax(1)).unsqueeze(1)  # (B, 1); an all-padding row: T - 1
    token_rewards = torch.zeros_like(kl).scatter_(1, last, rewards.to(kl.dtype).unsqueeze(1))
    return (token_rewards - kl_coef * kl) * mask


def cumulative_returns(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """Discounted reward-to-go per token (OpenRLHF's ``get_cumulative_returns``, REINFORCE's return):

        G_{i,t} = sum_{t' >= t} gamma^(t' - t) r_{i,t'}       (B, T), over active tokens only
    """
    token_rewards = token_rewards * mask.to(token_rewards.dtype)
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(token_rewards.size(1))):
        running = token_rewards[:, t] + gamma * running
        returns[:, t] = running
    return returns


def batch_whiten(values: torch.Tensor, mask: torch.Tensor, std_norm: bool = True) -> torch.Tensor:
    """REINFORCE++'s global advantage normalisation over every active token of the batch, as OpenRLHF:

        A <- (A - mean) * rsqrt(max(var, 1e-8))       mean and (biased) var over active tokens

    ``std_norm=False`` only centres (OpenRLHF's ``no_std_norm``). 0 on padding."""
    mask = mask.to(values.dtype)
    n = mask.sum().clamp(min=1.0)
    mean = (values * mask).sum() / n
    centred = (values - mean) * _active_values_differ(values, mask)  # a constant (to rounding) centres to exactly 0
    if std_norm:
        centred = centred * torch.rsqrt((centred.pow(2) * mask).sum().div(n).clamp(min=1e-8))
    return centred * mask


def reinforce_pp_advantages(
    rewards: torch.Tensor,
    kl: torch.Tensor,
    mask: torch.Tensor,
    *,
    kl_coef: float,
    group_size: int = 1,
    group_baseline: bool = False,
    gamma: float = 1.0,
    reward_clip_min: Optional[float] = -10.0,
    reward_clip_max: Optional[float] = 10.0,
    std_norm: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ token advantages (Hu 2025; OpenRLHF ``compute_advantages_and_returns``):

        r_i     <- r_i - mean_{group}(r)                  REINFORCE++-baseline only (``group_baseline``)
        r_{i,t}  = -kl_coef KL_{i,t} + [t = last_i] clip(r_i, lo, hi)           (``kl_penalised_rewards``)
        G_{i,t}  = sum_{t' >= t} gamma^(t'-t) r_{i,t'}                          (``cumulative_returns``)
        A        = whiten(G) over all active tokens of the batch                (``batch_whiten``)

    ``rewards`` (B,) group by group; ``kl`` (B, T) the per-token KL of the old policy to the reference
    (zeros when the KL is in the loss instead). Returns (advantages, returns), each (B, T), no gradient.
    """
    if group_baseline:
        if group_size < 2 or rewards.numel() % group_size:
            raise ValueError(f"group_baseline needs B a multiple of group_size >= 2, got B={rewards.numel()}, "
                             f"G={group_size}")
        grouped = rewards.view(-1, group_size)
        rewards = (grouped - grouped.mean(1, keepdim=True)).masked_fill(tied_rows(grouped), 0.0).reshape(-1)
    token_rewards = kl_penalised_rewards(rewards, kl.detach(), mask, kl_coef, reward_clip_min, reward_clip_max)
    returns = cumulative_returns(token_rewards, mask, gamma)
    return batch_whiten(returns, mask, std_norm).detach(), returns.detach()
