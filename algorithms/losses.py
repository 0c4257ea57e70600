"""Pure loss functions: tensors in, scalar tensor out. No models, no optimizers, no state.

Shapes used throughout:
    B  completions in the batch (prompts x group size, ordered group by group)
    T  completion length (right-padded); ``mask`` is 1 on completion tokens up to and including
       the first EOS and 0 after it (the mask convention, stated once: algorithms/rollout.py).

Each GRPO loss type (a "policy loss", verl's word) is a pair of small named functions, a per-token
objective (``POLICY_OBJECTIVES``) and an aggregation (``LOSS_AGGREGATIONS``), paired in ``LOSS_TYPES``,
rather than a branch inside the loss, so reading one variant means reading a few lines. Objectives are
registered by name at their definition with ``@register_policy_loss`` (verl's ``register_policy_loss``);
an installed package adds one the same way (entry-point group ``grpo_bench.policy_losses``). Advantage
estimators have the same kind of registry in algorithms/estimators.py.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from algorithms.registry import lookup_named, register_named

GRPO_LEVELS = ("token", "sequence")
ADVANTAGE_SCALES = ("group", "batch", "none")


# --------------------------------------------------------------------------------------------
# Registries of named functions (policy losses here, advantage estimators in algorithms/estimators.py),
# the shape of ``register_algorithm``: a name taken by a different function is refused, an unknown name is
# one ValueError listing the choices.
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Ties and signal: a constant has nothing to centre. A float32 mean of G equal rewards is not always
# the reward itself (eight 0.3s: off by 3e-8), and a scale (1 / std, whitening) would blow that rounding
# up into advantages of ~1e-4 -- and AdamW, which normalises the gradient, into a full-size step.
# --------------------------------------------------------------------------------------------


def tied_rows(grouped: torch.Tensor) -> torch.Tensor:
    """(n, G) -> (n, 1) bool: every value of the row is equal (a group whose rewards tie)."""
    return (grouped == grouped[:, :1]).all(dim=1, keepdim=True)


def _active_values_differ(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """0-dim bool: the active entries of ``values`` are not all equal (no sync with the host)."""
    active = mask.bool()
    return values.masked_fill(~active, -math.inf).amax() > values.masked_fill(~active, math.inf).amin()


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


def k3_kl(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """Per-token unbiased KL estimator k3 (Schulman 2020), DeepSeekMath Eq. 4:

        KL[pi || pi_ref] ~= pi_ref/pi - log(pi_ref/pi) - 1 = exp(ref - logp) - (ref - logp) - 1  (>= 0)
    """
    delta = ref_logps - logps
    return torch.exp(delta) - delta - 1


# The KL term's estimators (Schulman 2020, "Approximating KL divergence"), per token, as verl's
# ``kl_penalty`` names them (its actor's kl_loss_type); log r = log pi - log pi_ref. "k3" is DeepSeekMath's
# and TRL's as written (``k3_kl``, the GRPO default); "low_var_kl" is verl's k3, clamped for stability.


def kl_k1(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """k1 = log r: unbiased in value, high variance, can be negative."""
    return logps - ref_logps


def kl_abs(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """|log r| (verl's "abs")."""
    return (logps - ref_logps).abs()


def kl_k2(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """k2 = (log r)^2 / 2 (verl's "mse"): biased in value, but its gradient is the KL's gradient in expectation."""
    return 0.5 * (logps - ref_logps).square()


def kl_low_var(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """verl's "low_var_kl": k3 = exp(-log r) + log r - 1 with -log r clamped to [-20, 20] and k3 to [-10, 10]."""
    delta = torch.clamp(ref_logps - logps, min=-20.0, max=20.0)
    return torch.clamp(torch.exp(delta) - delta - 1, min=-10.0, max=10.0)


def straight_through_k2(estimator: Callable) -> Callable:
    """verl's "+" variants: the value of ``estimator``, the gradient of k2,  k2 - sg(k2) + sg(kN), because k1's
    and k3's expected gradients are not the KL's gradient while k2's is."""

    def kl(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
        k2 = kl_k2(logps, ref_logps)
        return k2 - k2.detach() + estimator(logps, ref_logps).detach()

    kl.__name__ = kl.__qualname__ = f"{estimator.__name__}_straight_through"
    kl.__doc__ = f"Value of {estimator.__name__}, gradient of k2 (``straight_through_k2``)."
    return kl


_KL_VALUES = {"k1": kl_k1, "k2": kl_k2, "k3": k3_kl, "low_var_kl": kl_low_var, "abs": kl_abs}
KL_PENALTIES: dict[str, Callable] = {**_KL_VALUES, **{f"{name}+": straight_through_k2(fn) for name, fn in _KL_VALUES.items()}}


@torch.no_grad()
def kl_estimate(name: str, logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """Per-token value of the KL estimator ``name`` (a ``KL_PENALTIES`` name; a "+" variant's value is its base's),
    for logging: what a metric named ``kl/<name>`` reports."""
    return lookup_named(KL_PENALTIES, "KL estimator", name)(logps, ref_logps)


def entropy_bonus_loss(entropies: torch.Tensor, mask: torch.Tensor, coef: float, aggregation: str = "token-mean",
                       max_completion_length: Optional[int] = None) -> torch.Tensor:
    """The entropy bonus as a loss term (verl's entropy_coeff; Williams & Peng 1991; Mnih et al. 2016, A3C):

        L_ent = -coef * agg_{i,t} H(pi(. | q, o_{i,<t}))

    ``entropies`` (B, T) must carry the graph for the bonus to have a gradient; ``aggregation`` is a
    ``LOSS_AGGREGATIONS`` name (verl aggregates it as the policy loss). Added to the policy loss."""
    return -coef * LOSS_AGGREGATIONS[aggregation](entropies, mask.to(entropies.dtype), max_completion_length, None)


def _masked_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum()


def _aggregate_grpo(per_token: torch.Tensor, mask: torch.Tensor, max_len: Optional[int], n_items) -> torch.Tensor:
    """Mean over each completion's own tokens, then over completions (DeepSeekMath Eq. 21's 1/|o_i|)."""
    return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()


def _aggregate_bnpo(per_token: torch.Tensor, mask: torch.Tensor, max_len: Optional[int], n_items) -> torch.Tensor:
    """Mean over all active tokens of the batch: long completions weigh more (batch-normalised PO).

    Under data parallelism ``num_items_in_batch`` carries the batch's active-token count over every rank
    (divided by the world size, the gradients being averaged), as for dapo."""
    normaliser = mask.sum() if n_items is None else torch.as_tensor(n_items, dtype=per_token.dtype)
    return _masked_sum(per_token, mask) / normaliser.clamp(min=1.0)


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


def _aggregate_luspo(per_token: torch.Tensor, mask: torch.Tensor, max_len: Optional[int], n_items) -> torch.Tensor:
    """LUSPO (length-unbiased sequence policy optimisation, arXiv 2602.05261): GSPO's per-sequence term
    weighted by the completion's length -- the sum over each completion's tokens, then the mean over completions."""
    return (per_token * mask).sum(-1).mean()


# verl's loss_agg_mode values (``core_algos.agg_loss``). "token-mean" is bnpo's function itself; the two
# seq-mean modes leave sequences without an active token out of the mean, which is where they part from
# grpo (seq-mean-token-mean) and luspo (seq-mean-token-sum): equal whenever every row has a token.


def _aggregate_seq_mean_token_mean(per_token: torch.Tensor, mask: torch.Tensor, max_len: Optional[int], n_items) -> torch.Tensor:
    """verl's "seq-mean-token-mean":  1/|S| sum_{i in S} 1/|o_i| sum_t l_{i,t},  S = rows with an active token."""
    lengths = mask.sum(-1)
    nonempty = (lengths > 0).to(per_token.dtype)
    per_sequence = (per_token * mask).sum(-1) / lengths.clamp(min=1.0)
    return (per_sequence * nonempty).sum() / nonempty.sum().clamp(min=1.0)


def _aggregate_seq_mean_token_sum(per_token: torch.Tensor, mask: torch.Tensor, max_len: Optional[int], n_items) -> torch.Tensor:
    """verl's "seq-mean-token-sum":  1/|S| sum_{i in S} sum_t l_{i,t},  S = rows with an active token."""
    nonempty = (mask.sum(-1) > 0).to(per_token.dtype)
    return ((per_token * mask).sum(-1) * nonempty).sum() / nonempty.sum().clamp(min=1.0)


def _aggregate_seq_mean_token_sum_norm(per_token: torch.Tensor, mask: torch.Tensor, max_len: Optional[int], n_items) -> torch.Tensor:
    """verl's "seq-mean-token-sum-norm" (its Dr. GRPO recipe):  1/(|S| L) sum_{i in S} sum_t l_{i,t},  S = rows with an
    active token, L = max_completion_length (verl's loss_scale_factor; without it, the padded width T, verl's default).
    It is dr_grpo's B x L normaliser with the all-masked rows left out of B: equal to dr_grpo when every row has a token."""
    return _aggregate_seq_mean_token_sum(per_token, mask, max_len, n_items) / (mask.size(-1) if max_len is None else max_len)


LOSS_AGGREGATIONS: dict[str, Callable] = {
    "grpo": _aggregate_grpo,
    "bnpo": _aggregate_bnpo,
    "dr_grpo": _aggregate_dr_grpo,
    "dapo": _aggregate_dapo,
    "luspo": _aggregate_luspo,
    "token-mean": _aggregate_bnpo,
    "seq-mean-token-mean": _aggregate_seq_mean_token_mean,
    "seq-mean-token-sum": _aggregate_seq_mean_token_sum,
    "seq-mean-token-sum-norm": _aggregate_seq_mean_token_sum_norm,
}
# Aggregations whose normaliser is the batch's active-token count (``num_items_in_batch`` under data parallelism).
TOKEN_MEAN_AGGREGATIONS = ("bnpo", "dapo", "token-mean")


def per_token_advantages(advantages: torch.Tensor) -> torch.Tensor:
    """(B,) one advantage per completion -> (B, 1); (B, T) per-token advantages (an estimator such as
    ``optimal_token_baseline``) as they are. Either broadcasts against (B, T) per-token losses."""
    return advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages


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


# --------------------------------------------------------------------------------------------
# GRPO's per-token policy objectives. Each gets the same keyword arguments and reads what it needs:
#   logps, log_ratio, mask (B, T); ratio (B, T) or (B, 1) (``level``); adv (B, 1); is_ratio: the sampler
#   correction (B, T), (B, 1) or None; generator: a torch.Generator or None (Clip-Cov's random pick); and
#   the hyperparameters by their grpo_loss names.
# Returned: (B, T) or (B, 1) per-token loss, before masks, the KL term and aggregation.
# --------------------------------------------------------------------------------------------

POLICY_OBJECTIVES: dict[str, Callable] = {}  # objective name -> per-token function
LOSS_TYPES: dict[str, tuple[str, str]] = {}  # policy loss (loss_type) -> (objective name, aggregation name)


def register_policy_loss(fn_or_name=None, *, name: Optional[str] = None, aggregation: Optional[str] = None,
                         objective: Optional[str] = None):
    """Register a per-token objective as the policy loss (``loss_type``) ``name``, aggregated by
    ``LOSS_AGGREGATIONS[aggregation]`` (verl's ``register_policy_loss``). As a decorator at the definition,
    ``@register_policy_loss("name", aggregation="token-mean")``; as a call, ``register_policy_loss(fn, name=...)``
    (the shape of ``register_algorithm``, which the entry-point group ``grpo_bench.policy_losses`` uses: an
    installed package's entry point names the function). ``objective`` names the function in
    ``POLICY_OBJECTIVES`` when several loss types share it (default: the loss type's name). ``aggregation``
    defaults to "grpo", or to the aggregation the same function already has under ``name``.

    A different function, or another aggregation, under a taken name is refused; the same registration
    again is a no-op."""
    if callable(fn_or_name):
        if name is None:
            raise TypeError("register_policy_loss(fn, name=...) needs the name")
        return register_policy_loss(name, aggregation=aggregation, objective=objective)(fn_or_name)
    name = fn_or_name or name
    key = objective or name
    if aggregation is not None:
        lookup_named(LOSS_AGGREGATIONS, "loss aggregation", aggregation)

    def register(fn: Callable) -> Callable:
        taken = LOSS_TYPES.get(name)
        same_fn = taken is not None and POLICY_OBJECTIVES.get(taken[0]) is fn
        pair = (key, aggregation or (taken[1] if same_fn else "grpo"))
        if taken is not None and (not same_fn or taken != pair):
            owner = POLICY_OBJECTIVES[taken[0]]
            raise ValueError(f"policy loss name {name!r} is taken by {owner.__module__}.{owner.__qualname__} "
                             f"({taken[1]} aggregation); {fn.__module__}.{fn.__qualname__} needs another name")
        register_named(POLICY_OBJECTIVES, "policy objective", key, fn)
        LOSS_TYPES[name] = pair
        return fn

    return register


def policy_loss(name: str) -> tuple[Callable, str]:
    """The registered policy loss ``name``: (per-token objective, aggregation name), or ValueError listing the choices."""
    objective, aggregation = lookup_named(LOSS_TYPES, "loss_type", name)
    return POLICY_OBJECTIVES[objective], aggregation


# TRL 1.16's GRPOTrainer._compute_loss pairs (objective, aggregation): the clip objective serves five of them
# (decorators apply bottom-up, so grpo registers first and leads the choices).
@register_policy_loss("luspo", aggregation="luspo", objective="clip")
@register_policy_loss("dapo", aggregation="dapo", objective="clip")
@register_policy_loss("dr_grpo", aggregation="dr_grpo", objective="clip")
@register_policy_loss("bnpo", aggregation="bnpo", objective="clip")
@register_policy_loss("grpo", aggregation="grpo", objective="clip")
def _objective_clip(*, ratio, adv, epsilon, epsilon_high, delta, **_) -> torch.Tensor:
    """PPO's clipped surrogate as GRPO uses it (DeepSeekMath Eq. 21):  -min(r A, clip(r, 1-eps, 1+eps_high) A).

    With ``delta`` (two-sided clipping, INTELLECT-2 tech report 2025) the unclipped ratio is capped too,
    r <- min(r, delta), which bounds the loss of a negative-advantage token whose ratio runs away.
    """
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + epsilon_high)
    if delta is not None:
        ratio = torch.clamp(ratio, max=delta)
    return -torch.min(ratio * adv, clipped * adv)


@register_policy_loss("cispo", aggregation="dapo")
def _objective_cispo(*, logps, ratio, adv, epsilon_high, **_) -> torch.Tensor:
    """CISPO (MiniMax-M1, 2025, Eq. 4-5): REINFORCE weighted by a clipped, stop-gradient IS weight,

        J = 1/sum_i|o_i| sum_i sum_t sg( min(r_{i,t}, eps_max) ) A_i log pi_theta(o_{i,t})

    so no token loses its gradient, only its weight is bounded. As TRL 1.16: the cap is ``epsilon_high``
    itself (not 1 + epsilon_high), with no lower bound; ScaleRL recommends epsilon_high = 5.0.
    """
    return -torch.clamp(ratio, max=epsilon_high).detach() * adv * logps


@register_policy_loss("sapo", aggregation="grpo")
def _objective_sapo(*, ratio, adv, sapo_temperature_pos, sapo_temperature_neg, **_) -> torch.Tensor:
    """SAPO (Soft Adaptive Policy Optimization, Qwen, arXiv 2511.20347): a smooth gate instead of the clip,

        f(r) = sigmoid(tau (r - 1)) * 4 / tau,   tau = tau_pos if A > 0 else tau_neg,    loss = -f(r) A

    whose gradient weight 4 sigmoid (1 - sigmoid) is 1 on-policy (r = 1) and decays smoothly off-policy.
    """
    tau = torch.where(adv > 0, adv.new_tensor(sapo_temperature_pos), adv.new_tensor(sapo_temperature_neg))
    return -torch.sigmoid(tau * (ratio - 1)) * 4 / tau * adv


VESPO_LOG_W_MIN = math.log(1e-8)  # TRL's (and the paper's code's) floor on the log sequence weight


@torch.no_grad()
def vespo_weights(
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    is_ratio: Optional[torch.Tensor] = None,
    *,
    k_pos: float = 2.0,
    lambda_pos: float = 3.0,
    k_neg: float = 3.0,
    lambda_neg: float = 2.0,
) -> torch.Tensor:
    """VESPO's Gamma-shaped sequence weight (arXiv 2602.10693), as TRL 1.16 computes it, no gradient:

        w_i      = prod_t r_{i,t} * prod_t rho_{i,t}   (the sequence ratio, times the sampler IS weights if given)
        phi(w_i) = e^lambda * w_i^k * e^(-lambda w_i)  (phi(1) = 1; k, lambda from the sign of A_i, A >= 0: pos)

    computed in log space: token log-ratios clamped to [-20, 20], log w_i to [log 1e-8, 20]; NaN/inf -> 0.
    ``advantages`` (B, 1), ``is_ratio`` per token (B, T) (token_* modes only); returns (B, 1). Unlike TRL
    the log IS weights of padding are masked out (TRL relies on them being exactly 1, which a truncation
    bound C_min > 1 would break).
    """
    mask = mask.to(log_ratio.dtype)
    log_w = (torch.clamp(log_ratio, -20.0, 20.0) * mask).sum(-1, keepdim=True)  # (B, 1)
    if is_ratio is not None:
        log_is = torch.clamp(torch.log(is_ratio), VESPO_LOG_W_MIN, 20.0)
        log_w = log_w + (log_is * mask).sum(-1, keepdim=True)
    log_w = torch.clamp(log_w, VESPO_LOG_W_MIN, 20.0)
    nonneg = advantages >= 0
    k = torch.where(nonneg, log_w.new_tensor(k_pos), log_w.new_tensor(k_neg))
    lam = torch.where(nonneg, log_w.new_tensor(lambda_pos), log_w.new_tensor(lambda_neg)).clamp(min=1e-4)
    return torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


@register_policy_loss("vespo", aggregation="dapo")
def _objective_vespo(*, logps, log_ratio, mask, adv, is_ratio, vespo_k_pos, vespo_lambda_pos, vespo_k_neg,
                     vespo_lambda_neg, **_) -> torch.Tensor:
    """VESPO (Variational sequence-level soft policy optimisation, arXiv 2602.10693): REINFORCE weighted by
    the sequence's Gamma weight,  loss = -phi(w_i) A_i log pi_theta(o_{i,t})  (``vespo_weights``)."""
    phi = vespo_weights(log_ratio, mask, adv, is_ratio, k_pos=vespo_k_pos, lambda_pos=vespo_lambda_pos,
                        k_neg=vespo_k_neg, lambda_neg=vespo_lambda_neg)
    return -phi * adv * logps


# verl's policy losses that TRL lacks; paired with verl's default aggregation, token-mean, except GMPO,
# whose per-sequence objective verl averages over sequences.


@register_policy_loss("dual_clip", aggregation="token-mean")
def _objective_dual_clip(*, ratio, adv, epsilon, epsilon_high, clip_ratio_c, **_) -> torch.Tensor:
    """Dual-clip PPO (Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep RL", arXiv 1912.09729; verl's
    "vanilla" loss with clip_ratio_c): PPO's clip, and for A < 0 a floor c > 1 under the objective,

        l = max( -r A, -clip(r, 1-eps, 1+eps_high) A )          A >= 0
        l = min( max( -r A, -clip(r, 1-eps, 1+eps_high) A ), -c A )   A < 0

    so a negative-advantage token whose ratio ran far above 1 contributes at most -c A (no gradient there).
    """
    clipped = torch.max(-ratio * adv, -torch.clamp(ratio, 1 - epsilon, 1 + epsilon_high) * adv)
    return torch.where(adv < 0, torch.min(clipped, -clip_ratio_c * adv), clipped)


@register_policy_loss("gmpo", aggregation="grpo")
def _objective_gmpo(*, log_ratio, mask, adv, epsilon, epsilon_high, **_) -> torch.Tensor:
    """GMPO (Zhao et al. 2025, "Geometric-Mean Policy Optimization", arXiv 2507.20673; verl's
    "geo_mean"): the geometric mean of the token ratios, each clipped in log space, per sequence,

        l_i = -A_i * exp( 1/|o_i| sum_t sgn(A_i) min( sgn(A_i) log r_{i,t}, sgn(A_i) clip(log r_{i,t}, -eps, eps_high) ) )

    A token-level clip on the log-ratio, then one (B, 1) value per completion: an outlier token moves the
    geometric mean far less than the arithmetic one. The paper clips to (e^-0.4, e^0.4): epsilon 0.4.
    ``level`` does not apply (the objective forms its own sequence ratio).
    """
    sign = torch.sign(adv)
    clipped = torch.clamp(log_ratio, -epsilon, epsilon_high)
    log_ratio = sign * torch.min(sign * log_ratio, sign * clipped)
    mean_log_ratio = (log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)
    return -adv * torch.exp(mean_log_ratio)


@torch.no_grad()
def token_covariance(logps: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The per-token centred cross-product of advantage and log-prob (Cui et al. 2025),

        Cov_{i,t} = (A_{i,t} - mean(A)) * (log pi(o_{i,t}) - mean(log pi)),   means over active tokens,

    whose positive tail drives the collapse of policy entropy. (B, T); no gradient."""
    adv = adv.expand_as(logps)
    active = mask.sum().clamp(min=1.0)
    mean_adv = (adv * mask).sum() / active
    mean_logp = (logps * mask).sum() / active
    return (adv - mean_adv) * (logps - mean_logp)


@register_policy_loss("clip_cov", aggregation="token-mean")
def _objective_clip_cov(*, logps, ratio, adv, mask, epsilon, epsilon_high, clip_cov_ratio, clip_cov_lb,
                        clip_cov_ub, generator, **_) -> torch.Tensor:
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
    Models", arXiv 2505.22617; verl's "clip_cov"): PPO's clipped surrogate, with the gradient of a
    few high-covariance tokens cut,

        l_{i,t} = max( -r A, -clip(r, 1-eps, 1+eps_high) A ) * (1 - [ (i,t) in I_clip ])
        I_clip  = max(1, floor(clip_cov_ratio * N)) tokens drawn at random (``generator``) among the active
                  tokens the ratio clip left alone with  clip_cov_lb < Cov_{i,t} < clip_cov_ub  (``token_covariance``)

    (N active tokens; paper and verl: ratio 2e-4, bounds 1 and 5).
    """
    ratio = ratio.expand_as(logps)
    unclipped, clipped = -ratio * adv, -torch.clamp(ratio, 1 - epsilon, 1 + epsilon_high) * adv
    active = mask.bool()
    cov = token_covariance(logps.detach(), adv, mask)
    candidates = (active & ~(clipped > unclipped) & (cov > clip_cov_lb) & (cov < clip_cov_ub)).flatten().nonzero().flatten()
    count = min(max(int(clip_cov_ratio * int(active.sum())), 1), candidates.numel())
    device = generator.device if generator is not None else candidates.device
    picked = candidates[torch.randperm(candidates.numel(), generator=generator, device=device)[:count].to(candidates.device)]
    keep = torch.ones_like(logps).flatten().index_fill(0, picked, 0.0).view_as(logps)
    return torch.max(unclipped, clipped) * keep


@register_policy_loss("kl_cov", aggregation="token-mean")
def _objective_kl_cov(*, logps, log_ratio, ratio, adv, mask, kl_cov_ratio, kl_cov_coef, **_) -> torch.Tensor:
    """KL-Cov (Cui et al. 2025, arXiv 2505.22617; verl's "kl_cov"): the unclipped surrogate, plus a
    KL penalty on the tokens of highest covariance,

        l_{i,t} = -r A + kl_cov_coef * |log r|   for the top max(1, floor(kl_cov_ratio * N)) tokens by Cov_{i,t}
        l_{i,t} = -r A                          otherwise

    (N active tokens; paper and verl: ratio 2e-4, coefficient 1).
    """
    ratio = ratio.expand_as(logps)
    loss = -ratio * adv
    active = mask.bool().flatten()
    if not active.any():
        return loss
    cov = token_covariance(logps.detach(), adv, mask).flatten().masked_fill(~active, -math.inf)
    count = max(int(kl_cov_ratio * int(active.sum())), 1)
    top = torch.zeros_like(cov).index_fill(0, cov.topk(count).indices, 1.0).view_as(logps)
    return loss + top * kl_cov_coef * log_ratio.abs()


@torch.no_grad()
def _dppo_truncated_ratio(log_ratio: torch.Tensor, cap: float) -> torch.Tensor:
    """sg(min(r, C)), r = exp(log r) with log r clamped to [-20, 20] (verl's guard against overflow)."""
    return torch.clamp(torch.exp(torch.clamp(log_ratio, -20.0, 20.0)), max=cap)


@register_policy_loss("dppo_tv", aggregation="token-mean")
def _objective_dppo_tv(*, logps, old_logps, log_ratio, adv, epsilon, epsilon_high, clip_ratio_c, **_) -> torch.Tensor:
    """DPPO-Binary-TV (arXiv 2602.04879, verl's "dppo_tv"): REINFORCE weighted by a truncated, stop-gradient
    IS ratio, on the tokens whose sampled-token probability moved less than a total-variation bound,

        l_{i,t} = -A_{i,t} * sg(min(r_{i,t}, C)) * log pi(o_{i,t}) * sg(m_{i,t})
        m_{i,t} = [ pi(o_{i,t}) - pi_old(o_{i,t}) <= eps_high ]    A > 0
                = [ pi(o_{i,t}) - pi_old(o_{i,t}) >= -eps ]        A <= 0

    The trust region is a divergence bound (``epsilon``, ``epsilon_high``: TV thresholds, not ratio ranges) instead of
    PPO's ratio clip; C = ``clip_ratio_c`` truncates the IS weight (the paper: large, e.g. 20; verl's actor config 3.0).
    Token-level by definition: ``level`` does not apply."""
    with torch.no_grad():
        moved = torch.exp(logps) - torch.exp(old_logps)
        keep = torch.where(adv > 0, moved <= epsilon_high, moved >= -epsilon).to(logps.dtype)
    return -adv * _dppo_truncated_ratio(log_ratio, clip_ratio_c) * logps * keep


@register_policy_loss("dppo_kl", aggregation="token-mean")
def _objective_dppo_kl(*, logps, old_logps, log_ratio, adv, epsilon, epsilon_high, clip_ratio_c, **_) -> torch.Tensor:
    """DPPO-Binary-KL (arXiv 2602.04879, verl's "dppo_kl"): as ``dppo_tv``, with the binary KL between the
    sampled token's old and new probabilities as the divergence,

        D_{i,t} = p_old log(p_old / p) + (1 - p_old) log((1 - p_old + 1e-8) / (1 - p + 1e-8)),  p = pi(o_{i,t})
        m_{i,t} = [ D <= eps_high  or  p <= p_old ]     A > 0      (only a move up is bounded)
                = [ D <= eps       or  p >= p_old ]     A <= 0     (only a move down is bounded)
        l_{i,t} = -A_{i,t} * sg(min(r_{i,t}, C)) * log pi(o_{i,t}) * sg(m_{i,t})
    """
    with torch.no_grad():
        p, p_old = torch.exp(logps), torch.exp(old_logps)
        divergence = p_old * (old_logps - logps) + (1 - p_old) * torch.log((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8))
        keep = torch.where(adv > 0, (divergence <= epsilon_high) | (p <= p_old),
                           (divergence <= epsilon) | (p >= p_old)).to(logps.dtype)
    return -adv * _dppo_truncated_ratio(log_ratio, clip_ratio_c) * logps * keep


# The loss types TRL 1.16 has (the TRL check compares each); the registry holds these and verl's above.
GRPO_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
CLIPPED_LOSS_TYPES = tuple(name for name in GRPO_LOSS_TYPES if LOSS_TYPES[name][0] == "clip")


# --------------------------------------------------------------------------------------------
# Token and sequence masks, and the sampler/trainer mismatch correction
# --------------------------------------------------------------------------------------------

IMPORTANCE_SAMPLING_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


@torch.no_grad()
def sampling_importance_ratio(
    old_logps: torch.Tensor,
    sampling_logps: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "sequence_mask",
    clip_min: Optional[float] = None,
    clip_max: Optional[float] = 3.0,
) -> torch.Tensor:
    """Truncated or masked importance sampling for the sampler/trainer mismatch (Yao et al. 2025, "Your
    efficient RL framework secretly brings you off-policy RL training"; TRL's vllm_importance_sampling_*):

        rho_{i,t} = pi_old(o_{i,t}) / pi_sampler(o_{i,t})      token_* modes      (B, T)
        rho_i     = prod_t rho_{i,t}                           sequence_* modes   (B, 1)
        *_truncate: rho <- clip(rho, C_min, C_max)             *_mask: rho <- 0 outside [C_min, C_max]

    ``pi_old`` is the trainer's view of the sampling policy (its first-iteration log-probs), ``pi_sampler``
    what the sampler computed while sampling (e.g. in bf16). Padding and NaN sampler log-probs count as
    no mismatch (rho = 1). No gradient.
    """
    if mode not in IMPORTANCE_SAMPLING_MODES:
        raise ValueError(f"unknown importance_sampling_mode {mode!r}; expected one of {IMPORTANCE_SAMPLING_MODES}")
    diff = torch.nan_to_num((old_logps - sampling_logps) * mask.to(old_logps.dtype), nan=0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        if clip_min is None and clip_max is None:
            raise ValueError(f"importance_sampling_mode {mode!r} needs importance_sampling_clip_min or _clip_max")
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


@torch.no_grad()
def off_policy_sequence_mask(
    logps: torch.Tensor, sampling_logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, threshold: float
) -> torch.Tensor:
    """Off-policy sequence masking (DeepSeek-V3.2, 2025, Eq. 9): drop a completion whose advantage is
    negative *and* whose sampler drifted from the current policy by more than delta,

        keep_i = [A_i >= 0]  or  [ 1/|o_i| sum_t (log pi_sampler(o_{i,t}) - log pi_theta(o_{i,t})) <= delta ]

    ``sampling_logps``: the sampler's log-probs where recorded, else the old policy's. (B, 1) of 0/1."""
    mask = mask.to(logps.dtype)
    kl = torch.nan_to_num(sampling_logps - logps.detach(), nan=0.0)
    mean_kl = (kl * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)
    return ((advantages.view(-1, 1) >= 0) | (mean_kl <= threshold)).to(mask.dtype)


@torch.no_grad()
def high_entropy_mask(entropies: torch.Tensor, mask: torch.Tensor, quantile: float) -> torch.Tensor:
    """Train only on the highest-entropy ("forking") tokens (Wang et al. 2025, "Beyond the 80/20 rule";
    TRL's ``top_entropy_quantile`` rho): keep an active token iff its entropy is >= the (1 - rho)-quantile of
    the active tokens' entropies. rho = 1 keeps all, rho = 0 only the maximum (ties kept). (B, T) of 0/1."""
    active = entropies[mask.bool()].float()
    if active.numel() == 0:
        return torch.zeros_like(mask, dtype=entropies.dtype)
    threshold = torch.quantile(active, 1.0 - quantile)
    return ((entropies >= threshold) & mask.bool()).to(entropies.dtype)


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
    delta: Optional[float] = None,
    beta: float = 0.0,
    max_completion_length: Optional[int] = None,
    kl_bias_correction: bool = False,
    num_items_in_batch: Optional[float] = None,
    sapo_temperature_pos: float = 1.0,
    sapo_temperature_neg: float = 1.05,
    vespo_k_pos: float = 2.0,
    vespo_lambda_pos: float = 3.0,
    vespo_k_neg: float = 3.0,
    vespo_lambda_neg: float = 2.0,
    entropies: Optional[torch.Tensor] = None,
    top_entropy_quantile: float = 1.0,
    off_policy_mask_threshold: Optional[float] = None,
    sampling_logps: Optional[torch.Tensor] = None,
    importance_sampling_correction: bool = True,
    importance_sampling_mode: str = "sequence_mask",
    importance_sampling_clip_min: Optional[float] = None,
    importance_sampling_clip_max: Optional[float] = 3.0,
    loss_aggregation: Optional[str] = None,
    kl_loss_type: str = "k3",
    clip_ratio_c: float = 3.0,
    clip_cov_ratio: float = 2e-4,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    kl_cov_ratio: float = 2e-4,
    kl_cov_coef: float = 1.0,
    entropy_coef: float = 0.0,
    generator: Optional[torch.Generator] = None,
    return_parts: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, dict[str, float]]:
    """GRPO surrogate loss (DeepSeekMath, Shao et al. 2024, Eq. 21), to be minimised:

        J(theta) = 1/G sum_i 1/|o_i| sum_t { min( r_{i,t} A_i, clip(r_{i,t}, 1-eps, 1+eps_high) A_i )
                                             - beta * KL_k3[pi_theta || pi_ref]_{i,t} }
        loss = -J(theta)

    with r_{i,t} = pi_theta(o_{i,t}|q,o_{i,<t}) / pi_theta_old(o_{i,t}|q,o_{i,<t}) (``level="token"``)
    or one ratio per completion, exp of its mean token log-ratio (``level="sequence"``, GSPO).

    ``loss_type`` picks the per-token objective and the aggregation (``LOSS_TYPES``, TRL 1.16's pairs):
    the clipped surrogate above with the grpo / bnpo / dr_grpo / dapo / luspo aggregation, or cispo
    (MiniMax-M1), sapo (Qwen's SAPO), vespo (VESPO). Then, in TRL's order: the off-policy sequence mask,
    the high-entropy token mask, the sampler IS weight (not for vespo, which folds it into its weight),
    the KL term, the aggregation.

    Args:
        logps: (B, T) per-token log-probs under the current policy (carries the gradient).
        old_logps: (B, T) log-probs of the sampling policy, or None for on-policy (mu = 1): then the
            ratio is exp(logps - logps.detach()) = 1 in value with the policy gradient as its gradient,
            which is why the loss *value* is 0 at mu = 1 and beta = 0 with loss_type "grpo".
        ref_logps: (B, T) reference-policy log-probs; may be None when beta == 0.
        advantages: (B,) one advantage per completion (``group_advantages``), or (B, T) one per token (an
            estimator such as ``optimal_token_baseline``; not for vespo, gmpo or the off-policy mask).
        mask: (B, T) 1 on completion tokens up to and including the first EOS.
        level: "token" or "sequence".
        loss_type: a registered policy loss (``LOSS_TYPES``: TRL's ``GRPO_LOSS_TYPES``, verl's dual_clip, gmpo,
            clip_cov, kl_cov, and plug-ins); "dr_grpo" needs max_completion_length.
        epsilon, epsilon_high: clip range [1 - epsilon, 1 + epsilon_high]; epsilon_high defaults to
            epsilon (DAPO's clip-higher uses 0.28). For cispo, epsilon_high is the IS-weight cap.
        delta: two-sided clipping's cap on the unclipped ratio (INTELLECT-2); None: off.
        beta: weight of the k3 KL penalty to the reference (DeepSeekMath uses 0.04).
        kl_bias_correction: multiply the KL term by the importance ratio, as TRL's
            ``use_bias_correction_kl``; off in the paper.
        num_items_in_batch: for bnpo/dapo/cispo/vespo on a micro-batch or one rank's share, the generation
            batch's active tokens (divided by the world size under data parallelism).
        sapo_temperature_pos, sapo_temperature_neg: SAPO's tau for A > 0 and A <= 0.
        vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg: VESPO's Gamma weight parameters.
        entropies, top_entropy_quantile: (B, T) token entropies of the current policy; with rho < 1 only
            the top-rho share of tokens by entropy is trained on (``high_entropy_mask``).
        off_policy_mask_threshold: delta of DeepSeek-V3.2's off-policy sequence mask; None: off.
        sampling_logps: (B, T) the sampler's own log-probs of the sampled tokens, or None.
        importance_sampling_correction, importance_sampling_mode, importance_sampling_clip_min,
            importance_sampling_clip_max: weight the loss by ``sampling_importance_ratio`` when
            sampling_logps is given (TRL's vllm_importance_sampling_*).
        loss_aggregation: a ``LOSS_AGGREGATIONS`` name replacing the loss type's own (e.g. verl's
            "seq-mean-token-sum-norm"); None: the loss type's.
        kl_loss_type: the KL term's estimator, a ``KL_PENALTIES`` name ("k3": the paper's).
        clip_ratio_c: dual_clip's floor c > 1 on negative-advantage tokens (Ye et al. 2020, verl: 3.0).
        clip_cov_ratio, clip_cov_lb, clip_cov_ub, generator: clip_cov's share of tokens, covariance window
            and the generator of its random pick; kl_cov_ratio, kl_cov_coef: kl_cov's share and coefficient.
        entropy_coef: the entropy bonus, loss -= coef * H with H the mean entropy over the tokens trained on
            (``entropy_bonus_loss``, token-mean whatever the aggregation, as TRL and OpenRLHF; ``entropies`` must
            then carry the graph). 0: off (the paper).
        return_parts: also return the loss's parts, each aggregated as the loss is (no graph): ``policy`` (the
            objective with its masks and IS weight), ``kl`` (beta x the KL term, with ``kl_loss_type``'s estimator;
            present when beta > 0) and ``entropy`` (the bonus, negative; present when entropy_coef != 0). They add
            up to the loss up to rounding; the loss itself is computed as without them.
    Returns:
        scalar loss tensor; with ``return_parts``, (loss, {part: value}).
    """
    objective_fn, aggregation = policy_loss(loss_type)
    kl_estimator = lookup_named(KL_PENALTIES, "kl_loss_type", kl_loss_type)
    aggregation = aggregation if loss_aggregation is None else loss_aggregation
    aggregate = lookup_named(LOSS_AGGREGATIONS, "loss_aggregation", aggregation)
    if epsilon < 0 or (epsilon_high is not None and epsilon_high < 0) or beta < 0:
        raise ValueError("epsilon, epsilon_high and beta must be >= 0")
    mask = mask.to(logps.dtype)
    old_logps = logps.detach() if old_logps is None else old_logps
    ratio = importance_ratio(logps, old_logps, mask, level)  # (B, T) or (B, 1)
    adv = per_token_advantages(advantages)  # (B, 1), or (B, T) per-token advantages
    is_ratio = None
    if sampling_logps is not None and importance_sampling_correction:
        is_ratio = sampling_importance_ratio(old_logps, sampling_logps, mask, importance_sampling_mode,
                                             importance_sampling_clip_min, importance_sampling_clip_max)
    objective = LOSS_TYPES[loss_type][0]
    if objective == "vespo" and is_ratio is not None and importance_sampling_mode.startswith("sequence"):
        raise ValueError("loss_type 'vespo' needs a token_* importance_sampling_mode (TRL refuses sequence modes)")
    per_token = objective_fn(
        logps=logps, old_logps=old_logps, log_ratio=logps - old_logps, ratio=ratio, adv=adv, mask=mask, is_ratio=is_ratio,
        epsilon=epsilon, epsilon_high=epsilon if epsilon_high is None else epsilon_high, delta=delta,
        sapo_temperature_pos=sapo_temperature_pos, sapo_temperature_neg=sapo_temperature_neg,
        vespo_k_pos=vespo_k_pos, vespo_lambda_pos=vespo_lambda_pos, vespo_k_neg=vespo_k_neg,
        vespo_lambda_neg=vespo_lambda_neg, clip_ratio_c=clip_ratio_c, clip_cov_ratio=clip_cov_ratio,
        clip_cov_lb=clip_cov_lb, clip_cov_ub=clip_cov_ub, kl_cov_ratio=kl_cov_ratio, kl_cov_coef=kl_cov_coef,
        generator=generator,
    )
    if off_policy_mask_threshold is not None:
        behaviour = old_logps if sampling_logps is None else sampling_logps
        per_token = per_token * off_policy_sequence_mask(logps, behaviour, advantages, mask, off_policy_mask_threshold)
    trained = mask  # the tokens the loss trains on, which the entropy bonus averages over (TRL's effective mask)
    if top_entropy_quantile < 1.0:
        if entropies is None:
            raise ValueError("top_entropy_quantile < 1 needs the tokens' entropies")
        entropy_mask = high_entropy_mask(entropies, mask, top_entropy_quantile)
        per_token = per_token * entropy_mask
        trained = mask * entropy_mask
    if is_ratio is not None and objective != "vespo":
        per_token = per_token * is_ratio
    policy_per_token, kl_per_token = per_token, None
    if beta != 0.0:
        if ref_logps is None:
            raise ValueError("beta > 0 needs ref_logps")
        kl = kl_estimator(logps, ref_logps)
        kl_per_token = beta * (kl * ratio if kl_bias_correction else kl)
        per_token = per_token + kl_per_token
    per_token = per_token.expand_as(logps)  # sequence level with beta = 0 is still (B, 1)
    loss = aggregate(per_token, mask, max_completion_length, num_items_in_batch)
    bonus = None
    if entropy_coef != 0.0:
        if entropies is None:
            raise ValueError("entropy_coef != 0 needs the tokens' entropies (with their graph)")
        bonus = entropy_bonus_loss(entropies, trained, entropy_coef)
        loss = loss + bonus
    if not return_parts:
        return loss
    with torch.no_grad():
        def part(values: torch.Tensor) -> float:
            return aggregate(values.expand_as(logps), mask, max_completion_length, num_items_in_batch).item()

        parts = {"policy": part(policy_per_token)}
        if kl_per_token is not None:
            parts["kl"] = part(kl_per_token)
        if bonus is not None:
            parts["entropy"] = bonus.item()
    return loss, parts


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
    adv = per_token_advantages(advantages)
    high = 1 + (epsilon if epsilon_high is None else epsilon_high)
    clipped = ((ratio < 1 - epsilon) & (adv < 0)) | ((ratio > high) & (adv > 0))
    return (clipped.to(mask.dtype) * mask).sum() / mask.sum().clamp(min=1.0)


def cispo_clip_fraction(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    level: str = "token",
    epsilon: float = 0.2,
    epsilon_high: Optional[float] = None,
) -> torch.Tensor:
    """Share of active tokens whose CISPO weight hit its cap (r > eps_high with A > 0), TRL's ``cispo_clip_ratio``."""
    mask = mask.to(logps.dtype)
    ratio = importance_ratio(logps.detach(), old_logps, mask, level).expand_as(logps)
    cap = epsilon if epsilon_high is None else epsilon_high
    clipped = (ratio > cap) & (per_token_advantages(advantages) > 0)
    return (clipped.to(mask.dtype) * mask).sum() / mask.sum().clamp(min=1.0)


# Per objective, the share of tokens its clip bound; sapo and vespo have no hard clip and report none, gmpo's
# clip is on the log-ratio and kl_cov has none. dual_clip and clip_cov report PPO's ratio clip.
CLIP_FRACTIONS: dict[str, Callable] = {"clip": clip_fraction, "cispo": cispo_clip_fraction, "dual_clip": clip_fraction,
                                       "clip_cov": clip_fraction}


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
    return_parts: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, dict[str, float]]:
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
        return_parts: also return {"policy": the first term, "kl": the second (when beta > 0)}.
    Returns:
        scalar loss tensor; with ``return_parts``, (loss, {part: value}).
    """
    if beta < 0:
        raise ValueError("beta must be >= 0")
    policy = -(advantages * sequence_logps(logps, mask)).mean()
    loss, kl = policy, None
    if beta != 0.0:
        if ref_logps is None:
            raise ValueError("beta > 0 needs ref_logps")
        kl = beta * sequence_logps(k3_kl(logps, ref_logps), mask).mean()
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
    centred = (values - mean) * _active_values_differ(values, mask)  # a constant whitens to exactly 0
    return centred * torch.rsqrt(var + eps) * mask


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
    return _aggregate_bnpo(torch.max(unclipped, clipped), mask.to(logps.dtype), None, num_tokens)


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
    return 0.5 * _aggregate_bnpo(torch.max((values - returns) ** 2, (clipped - returns) ** 2), mask.to(values.dtype), None,
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
    beta: float = 0.0,
    normalize: bool = False,
    reward_clip_min: Optional[float] = None,
    reward_clip_max: Optional[float] = None,
) -> torch.Tensor:
    """REINFORCE leave-one-out advantages (Ahmadian et al. 2024, Eq. 7):

        r_i  <- clip(r_i, lo, hi) - beta * KL_i              KL_i = sum_t (log pi_old - log pi_ref)_{i,t}
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
    if beta != 0.0:
        rewards = rewards - beta * kl
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

KL_ESTIMATORS = ("k1", "k2", "k3")


def approx_kl(logps: torch.Tensor, ref_logps: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
    """Per-token estimates of KL[pi || pi_ref] (Schulman 2020), clamped to [-10, 10] as OpenRLHF's
    ``compute_approx_kl``; with log r = log pi - log pi_ref:

        k1 = log r        k2 = (log r)^2 / 2        k3 = exp(-log r) - 1 + log r   (= ``k3_kl``)
    """
    log_ratio = logps.float() - ref_logps.float()
    if estimator == "k1":
        kl = log_ratio
    elif estimator == "k2":
        kl = log_ratio ** 2 / 2.0
    elif estimator == "k3":
        # log r < -10 already gives k3 > 10, the cap: bounding it first keeps exp from overflowing into a
        # 0 * inf = NaN gradient (OpenRLHF does the same).
        bounded = log_ratio.clamp(min=-10.0)
        kl = torch.exp(-bounded) - 1 + bounded
    else:
        raise ValueError(f"unknown KL estimator {estimator!r}; expected one of {KL_ESTIMATORS}")
    return kl.clamp(min=-10.0, max=10.0)


def kl_penalised_rewards(
    scores: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, kl_coef: float,
    clip_min: Optional[float] = None, clip_max: Optional[float] = None,
) -> torch.Tensor:
    """Per-token rewards (OpenRLHF's ``compute_reward``): every token pays -kl_coef * KL_t, the last
    active token also gets the (clipped) score:  r_{i,t} = -kl_coef KL_{i,t} + [t = last_i] clip(s_i, lo, hi).

    ``scores`` (B,), ``kl`` and ``mask`` (B, T). Returns (B, T), 0 on padding."""
    mask = mask.to(kl.dtype)
    if clip_min is not None or clip_max is not None:
        scores = torch.clamp(scores, min=clip_min, max=clip_max)
    last = (mask.size(1) - 1 - mask.long().flip(1).argmax(1)).unsqueeze(1)  # (B, 1); an all-padding row: T - 1
    rewards = torch.zeros_like(kl).scatter_(1, last, scores.to(kl.dtype).unsqueeze(1))
    return (rewards - kl_coef * kl) * mask


def cumulative_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """Discounted reward-to-go per token (OpenRLHF's ``get_cumulative_returns``, REINFORCE's return):

        G_{i,t} = sum_{t' >= t} gamma^(t' - t) r_{i,t'}       (B, T), over active tokens only
    """
    rewards = rewards * mask.to(rewards.dtype)
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.size(1))):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    return returns


def batch_whiten(values: torch.Tensor, mask: torch.Tensor, std_norm: bool = True) -> torch.Tensor:
    """REINFORCE++'s global advantage normalisation over every active token of the batch, as OpenRLHF:

        A <- (A - mean) * rsqrt(max(var, 1e-8))       mean and (biased) var over active tokens

    ``std_norm=False`` only centres (OpenRLHF's ``no_std_norm``). 0 on padding."""
    mask = mask.to(values.dtype)
    n = mask.sum().clamp(min=1.0)
    mean = (values * mask).sum() / n
    centred = (values - mean) * _active_values_differ(values, mask)  # a constant centres to exactly 0
    if std_norm:
        centred = centred * torch.rsqrt((centred.pow(2) * mask).sum().div(n).clamp(min=1e-8))
    return centred * mask


def reinforce_pp_advantages(
    scores: torch.Tensor,
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

        s_i     <- s_i - mean_{group}(s)                  REINFORCE++-baseline only (``group_baseline``)
        r_{i,t}  = -kl_coef KL_{i,t} + [t = last_i] clip(s_i, lo, hi)           (``kl_penalised_rewards``)
        G_{i,t}  = sum_{t' >= t} gamma^(t'-t) r_{i,t'}                          (``cumulative_returns``)
        A        = whiten(G) over all active tokens of the batch                (``batch_whiten``)

    ``scores`` (B,) group by group; ``kl`` (B, T) the per-token KL of the old policy to the reference
    (zeros when the KL is in the loss instead). Returns (advantages, returns), each (B, T), no gradient.
    """
    if group_baseline:
        if group_size < 2 or scores.numel() % group_size:
            raise ValueError(f"group_baseline needs B a multiple of group_size >= 2, got B={scores.numel()}, G={group_size}")
        grouped = scores.view(-1, group_size)
        scores = (grouped - grouped.mean(1, keepdim=True)).masked_fill(tied_rows(grouped), 0.0).reshape(-1)
    rewards = kl_penalised_rewards(scores, kl.detach(), mask, kl_coef, reward_clip_min, reward_clip_max)
    returns = cumulative_returns(rewards, mask, gamma)
    return batch_whiten(returns, mask, std_norm).detach(), returns.detach()
