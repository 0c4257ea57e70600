"""GRPO's policy losses: the aggregations, the importance ratio, the registered per-token objectives with their
options, the masks and the sampler correction, and ``GRPOLoss``, GRPO's loss configured (``GRPOConfig.loss()``), whose
call puts them together.

Shapes used throughout: B completions (prompts x group size, group by group), T completion tokens, right-padded;
``mask`` is 1 on completion tokens up to and including the first EOS (the convention, stated once:
algorithms/rollout.py).

A policy loss (verl's word; GRPO's ``loss_type``) is a small class: its name, its aggregation (``LOSS_AGGREGATIONS``),
what it needs declared as properties, an ``Options`` dataclass of its own knobs, and ``objective``, a few lines
over one ``LossInputs``. ``GRPOLoss`` has no loss names inside: it reads the properties. A loss registers with
``@register_policy_loss`` at its definition; an installed package adds one the same way (entry-point group
``grpo_bench.policy_losses``), and its options become GRPO settings (flags, config and matrix keys). An aggregation is
a function registered by name with ``@register_aggregation``, which declares whether it is a token mean (GRPO then
hands it the batch's token count over every data-parallel rank).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Callable, ClassVar, Optional

import torch

from algorithms.kl import KL_PENALTIES
from algorithms.registry import Configurable, lookup_named, register_function, register_member, register_named
from algorithms.sampler_corrections import (  # noqa: F401 (the TRL modes re-exported: callers import them from here)
    IMPORTANCE_SAMPLING_MODES, SamplerCorrection, sampling_importance_ratio,
)

GRPO_LEVELS = ("token", "sequence")


def entropy_bonus_loss(entropies: torch.Tensor, mask: torch.Tensor, coef: float, aggregation: str = "token-mean",
                       max_completion_length: Optional[int] = None) -> torch.Tensor:
    """The entropy bonus as a loss term (verl's entropy_coeff; Williams & Peng 1991; Mnih et al. 2016, A3C):

        L_ent = -coef * agg_{i,t} H(pi(. | q, o_{i,<t}))

    ``entropies`` (B, T) must carry the graph for the bonus to have a gradient; ``aggregation`` is a
    ``LOSS_AGGREGATIONS`` name (verl aggregates it as the policy loss). Added to the policy loss."""
    return -coef * LOSS_AGGREGATIONS[aggregation](entropies, mask.to(entropies.dtype), max_completion_length, None)


# The aggregations: name -> fn(per_token (B, T), mask (B, T), max_completion_length, num_items_in_batch) -> the loss.
LOSS_AGGREGATIONS: dict[str, Callable] = {}


def register_aggregation(*names: str, token_mean: bool = False) -> Callable:
    """``@register_aggregation(name, ...)``: register the function as the loss aggregation ``names`` (GRPO's
    ``loss_aggregation``, a policy loss's ``aggregation``). ``token_mean`` declares that it divides by the batch's
    active-token count, which on one data-parallel rank's share is ``num_items_in_batch``: GRPO counts it over every
    rank for such an aggregation. A taken name is refused, the same function again is a no-op unless it declares
    another ``token_mean``."""

    def register(fn: Callable) -> Callable:
        if getattr(fn, "token_mean", token_mean) != token_mean:
            raise ValueError(f"loss aggregation {fn.__module__}.{fn.__qualname__} is registered with token_mean "
                             f"{fn.token_mean}; another token_mean needs another function")
        fn.token_mean = token_mean
        for name in names:
            register_named(LOSS_AGGREGATIONS, "loss aggregation", name, fn)
        return fn

    return register


def _masked_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum()


@register_aggregation("grpo")
def _aggregate_grpo(per_token: torch.Tensor, mask: torch.Tensor, max_len: Optional[int], n_items) -> torch.Tensor:
    """Mean over each completion's own tokens, then over completions (DeepSeekMath Eq. 21's 1/|o_i|)."""
    return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()


@register_aggregation("bnpo", token_mean=True)
def aggregate_token_mean(per_token: torch.Tensor, mask: torch.Tensor, max_len: Optional[int], n_items) -> torch.Tensor:
    """Mean over all active tokens of the batch: long completions weigh more (batch-normalised PO).

    Under data parallelism ``num_items_in_batch`` carries the batch's active-token count over every rank
    (divided by the world size, the gradients being averaged), as for dapo."""
    normaliser = mask.sum() if n_items is None else torch.as_tensor(n_items, dtype=per_token.dtype)
    return _masked_sum(per_token, mask) / normaliser.clamp(min=1.0)


@register_aggregation("dr_grpo")
def _aggregate_dr_grpo(per_token: torch.Tensor, mask: torch.Tensor, max_len: Optional[int], n_items) -> torch.Tensor:
    """Dr. GRPO (Liu et al. 2025): a constant normaliser B * max_completion_length removes length bias."""
    if max_len is None:
        raise ValueError("loss_type='dr_grpo' needs max_completion_length")
    return _masked_sum(per_token, mask) / (per_token.size(0) * max_len)


@register_aggregation("dapo", token_mean=True)
def _aggregate_dapo(per_token: torch.Tensor, mask: torch.Tensor, max_len: Optional[int], n_items) -> torch.Tensor:
    """DAPO (Yu et al. 2025) token-level mean over the *whole generation batch*.

    Equals bnpo when the loss sees the whole generation batch at once; when it is called on a
    micro-batch, ``num_items_in_batch`` carries the generation batch's active-token count.
    """
    normaliser = mask.sum() if n_items is None else torch.as_tensor(n_items, dtype=per_token.dtype)
    return _masked_sum(per_token, mask) / normaliser.clamp(min=1.0)


@register_aggregation("luspo")
def _aggregate_luspo(per_token: torch.Tensor, mask: torch.Tensor, max_len: Optional[int], n_items) -> torch.Tensor:
    """LUSPO (length-unbiased sequence policy optimisation, arXiv 2602.05261): GSPO's per-sequence term
    weighted by the completion's length -- the sum over each completion's tokens, then the mean over completions."""
    return (per_token * mask).sum(-1).mean()


# verl's loss_agg_mode values (``core_algos.agg_loss``). "token-mean" is bnpo's function itself; the two
# seq-mean modes leave sequences without an active token out of the mean, which is where they part from
# grpo (seq-mean-token-mean) and luspo (seq-mean-token-sum): equal whenever every row has a token.
register_aggregation("token-mean", token_mean=True)(aggregate_token_mean)


@register_aggregation("seq-mean-token-mean")
def _aggregate_seq_mean_token_mean(per_token: torch.Tensor, mask: torch.Tensor, max_len: Optional[int], n_items) -> torch.Tensor:
    """verl's "seq-mean-token-mean":  1/|S| sum_{i in S} 1/|o_i| sum_t l_{i,t},  S = rows with an active token."""
    lengths = mask.sum(-1)
    nonempty = (lengths > 0).to(per_token.dtype)
    per_sequence = (per_token * mask).sum(-1) / lengths.clamp(min=1.0)
    return (per_sequence * nonempty).sum() / nonempty.sum().clamp(min=1.0)


@register_aggregation("seq-mean-token-sum")
def _aggregate_seq_mean_token_sum(per_token: torch.Tensor, mask: torch.Tensor, max_len: Optional[int], n_items) -> torch.Tensor:
    """verl's "seq-mean-token-sum":  1/|S| sum_{i in S} sum_t l_{i,t},  S = rows with an active token."""
    nonempty = (mask.sum(-1) > 0).to(per_token.dtype)
    return ((per_token * mask).sum(-1) * nonempty).sum() / nonempty.sum().clamp(min=1.0)


@register_aggregation("seq-mean-token-sum-norm")
def _aggregate_seq_mean_token_sum_norm(per_token: torch.Tensor, mask: torch.Tensor, max_len: Optional[int], n_items) -> torch.Tensor:
    """verl's "seq-mean-token-sum-norm" (its Dr. GRPO recipe):  1/(|S| L) sum_{i in S} sum_t l_{i,t},  S = rows with an
    active token, L = max_completion_length (verl's loss_scale_factor; without it, the padded width T, verl's default).
    It is dr_grpo's B x L normaliser with the all-masked rows left out of B: equal to dr_grpo when every row has a token."""
    return _aggregate_seq_mean_token_sum(per_token, mask, max_len, n_items) / (mask.size(-1) if max_len is None else max_len)


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


# --------------------------------------------------------------------------------------------
# Policy losses: one small class each, registered by name (verl's ``register_policy_loss``), with its aggregation,
# what it needs declared as class properties, and its own knobs in an ``Options`` dataclass whose fields are
# settings of GRPO (flags, config keys and matrix keys, grouped in --help under the loss; one default per name).
# ``objective`` reads the tensors of one ``LossInputs`` and its options, and returns the per-token loss,
# (B, T) or (B, 1), before masks, the KL term and aggregation.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LossInputs:
    """What every objective may read: logps, old_logps, log_ratio (= logps - old_logps) and mask (B, T); ratio
    (B, T) or (B, 1) by ``level``; adv (B, 1), or (B, T) per-token advantages; is_ratio, the sampler's IS weight
    (B, T), (B, 1) or None; the clip range [1 - epsilon, 1 + epsilon_high] (epsilon_high already defaulted to
    epsilon) and two-sided clipping's cap ``delta``; generator (a torch.Generator or None, for random picks);
    group_size, G of a batch ordered group by group, where the caller gives it (None: unknown)."""

    logps: torch.Tensor
    old_logps: torch.Tensor
    log_ratio: torch.Tensor
    ratio: torch.Tensor
    adv: torch.Tensor
    mask: torch.Tensor
    is_ratio: Optional[torch.Tensor]
    epsilon: float
    epsilon_high: float
    delta: Optional[float]
    generator: Optional[torch.Generator]
    group_size: Optional[int] = None


class PolicyLoss(Configurable):
    """A policy loss (GRPO's ``loss_type``). Subclasses set ``name`` and ``aggregation`` (a LOSS_AGGREGATIONS
    name), declare what they need, and write ``objective``; knobs of their own go in an ``Options`` dataclass
    (``Configurable``)."""

    selector: ClassVar[str] = "loss_type"
    aggregation: ClassVar[str] = "grpo"
    family: ClassVar[str] = ""  # the objective several losses share ("clip" for TRL's five); default: the name
    takes_delta: ClassVar[bool] = False  # two-sided clipping (``delta``) caps its ratio: PPO's clipped surrogate
    per_completion_advantages: ClassVar[bool] = False  # reads one advantage per completion, (B, 1)
    folds_sampling_weight: ClassVar[bool] = False  # takes the sampler IS weight into its own weight (token modes only)
    clip_fraction: ClassVar[Optional[Callable]] = None  # the share of tokens its clip bound, as a metric

    def objective(self, x: LossInputs) -> torch.Tensor:
        raise NotImplementedError


POLICY_LOSSES: dict[str, type[PolicyLoss]] = {}


def _call_per_token(fn: Callable, x: LossInputs) -> torch.Tensor:
    """A per-token function ``fn(**LossInputs fields)`` on ``x``."""
    return fn(**{f.name: getattr(x, f.name) for f in fields(x)})


def register_policy_loss(loss=None, *, name: Optional[str] = None, aggregation: Optional[str] = None):
    """Register a policy loss under its name. A PolicyLoss subclass: ``@register_policy_loss`` at its definition (its
    ``name`` and ``aggregation``). A per-token function ``fn(**LossInputs fields)`` with no options:
    ``@register_policy_loss("name", aggregation="token-mean")``, or ``register_policy_loss(fn, name=...)`` (the
    aggregation defaults to "grpo", or to the one the same function already has). The entry-point group
    ``grpo_bench.policy_losses`` names either, registered with the entry point's name. A different loss under a taken
    name is refused, the same one again is a no-op, and an option another loss declares must keep its default and type."""
    if loss is None or isinstance(loss, str):
        if aggregation is not None:
            lookup_named(LOSS_AGGREGATIONS, "loss aggregation", aggregation)
        return lambda fn: register_policy_loss(fn, name=loss or name, aggregation=aggregation)
    if isinstance(loss, type) and issubclass(loss, PolicyLoss):
        if name is not None and name != loss.name:
            raise ValueError(f"policy loss {loss.__qualname__} is named {loss.name!r}, not {name!r}")
        lookup_named(LOSS_AGGREGATIONS, "loss aggregation", loss.aggregation)
        return register_member(POLICY_LOSSES, "policy loss", loss)
    if not callable(loss) or name is None:
        raise TypeError(f"{loss!r}: register a PolicyLoss subclass, or a per-token function with its name")
    lookup_named(LOSS_AGGREGATIONS, "loss aggregation", aggregation or "grpo")
    return register_function(POLICY_LOSSES, "policy loss", PolicyLoss, loss, name, "objective", _call_per_token,
                             aggregation=aggregation)


def policy_loss(name: str) -> type[PolicyLoss]:
    """The registered policy loss ``name``, or ValueError listing the choices."""
    return lookup_named(POLICY_LOSSES, "loss_type", name)


def objective_family(name: str) -> str:
    """The objective the loss ``name`` computes ("clip" for grpo, bnpo, dr_grpo, dapo and luspo)."""
    cls = policy_loss(name)
    return cls.family or cls.name


# TRL 1.16's GRPOTrainer._compute_loss pairs (objective, aggregation): the clipped surrogate serves five of them.
@register_policy_loss
class GRPOClip(PolicyLoss):
    """PPO's clipped surrogate as GRPO uses it (DeepSeekMath Eq. 21):  -min(r A, clip(r, 1-eps, 1+eps_high) A).

    With ``delta`` (two-sided clipping, INTELLECT-2 tech report 2025) the unclipped ratio is capped too,
    r <- min(r, delta), which bounds the loss of a negative-advantage token whose ratio runs away.
    """

    name, aggregation, family, takes_delta = "grpo", "grpo", "clip", True
    clip_fraction = staticmethod(clip_fraction)

    def objective(self, x: LossInputs) -> torch.Tensor:
        clipped = torch.clamp(x.ratio, 1 - x.epsilon, 1 + x.epsilon_high)
        ratio = x.ratio if x.delta is None else torch.clamp(x.ratio, max=x.delta)
        return -torch.min(ratio * x.adv, clipped * x.adv)


@register_policy_loss
class BNPO(GRPOClip):
    """The clipped surrogate, mean over the batch's active tokens (TRL's bnpo)."""
    name, aggregation = "bnpo", "bnpo"


@register_policy_loss
class DrGRPO(GRPOClip):
    """The clipped surrogate over a constant B x max_completion_length (Dr. GRPO, Liu et al. 2025)."""
    name, aggregation = "dr_grpo", "dr_grpo"


@register_policy_loss
class DAPO(GRPOClip):
    """The clipped surrogate, token mean over the whole generation batch (DAPO, Yu et al. 2025)."""
    name, aggregation = "dapo", "dapo"


@register_policy_loss
class LUSPO(GRPOClip):
    """The clipped surrogate, each completion's token sum, then the mean over completions (LUSPO; use level sequence)."""
    name, aggregation = "luspo", "luspo"


@register_policy_loss
class CISPO(PolicyLoss):
    """CISPO (MiniMax-M1, 2025, Eq. 4-5): REINFORCE weighted by a clipped, stop-gradient IS weight,

        J = 1/sum_i|o_i| sum_i sum_t sg( min(r_{i,t}, eps_max) ) A_i log pi_theta(o_{i,t})

    so no token loses its gradient, only its weight is bounded. As TRL 1.16: the cap is ``epsilon_high``
    itself (not 1 + epsilon_high), with no lower bound; ScaleRL recommends epsilon_high = 5.0.
    """

    name, aggregation = "cispo", "dapo"
    clip_fraction = staticmethod(cispo_clip_fraction)

    def objective(self, x: LossInputs) -> torch.Tensor:
        return -torch.clamp(x.ratio, max=x.epsilon_high).detach() * x.adv * x.logps


@register_policy_loss
class SAPO(PolicyLoss):
    """SAPO (Soft Adaptive Policy Optimization, Qwen, arXiv 2511.20347): a smooth gate instead of the clip,

        f(r) = sigmoid(tau (r - 1)) * 4 / tau,   tau = tau_pos if A > 0 else tau_neg,    loss = -f(r) A

    whose gradient weight 4 sigmoid (1 - sigmoid) is 1 on-policy (r = 1) and decays smoothly off-policy.
    """

    name, aggregation = "sapo", "grpo"

    @dataclass
    class Options:
        sapo_temperature_pos: float = field(default=1.0, metadata={"help": "SAPO gate temperature for A > 0 (SAPO paper, TRL: 1.0)"})
        sapo_temperature_neg: float = field(default=1.05, metadata={"help": "SAPO gate temperature for A <= 0 (SAPO paper, TRL: 1.05)"})

        def validate(self) -> None:
            for name in ("sapo_temperature_pos", "sapo_temperature_neg"):
                if getattr(self, name) <= 0:
                    raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")

    def objective(self, x: LossInputs) -> torch.Tensor:
        o = self.options
        tau = torch.where(x.adv > 0, x.adv.new_tensor(o.sapo_temperature_pos), x.adv.new_tensor(o.sapo_temperature_neg))
        return -torch.sigmoid(tau * (x.ratio - 1)) * 4 / tau * x.adv


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


@register_policy_loss
class VESPO(PolicyLoss):
    """VESPO (Variational sequence-level soft policy optimisation, arXiv 2602.10693): REINFORCE weighted by
    the sequence's Gamma weight,  loss = -phi(w_i) A_i log pi_theta(o_{i,t})  (``vespo_weights``), which takes
    the sampler's IS weight into w_i itself."""

    name, aggregation = "vespo", "dapo"
    per_completion_advantages = folds_sampling_weight = True

    @dataclass
    class Options:
        vespo_k_pos: float = field(default=2.0, metadata={"help": "VESPO Gamma-weight power k for A >= 0 (TRL: 2.0)"})
        vespo_lambda_pos: float = field(default=3.0, metadata={"help": "VESPO Gamma-weight decay lambda for A >= 0 (TRL: 3.0)"})
        vespo_k_neg: float = field(default=3.0, metadata={"help": "VESPO Gamma-weight power k for A < 0 (TRL: 3.0)"})
        vespo_lambda_neg: float = field(default=2.0, metadata={"help": "VESPO Gamma-weight decay lambda for A < 0 (TRL: 2.0)"})

        def validate(self) -> None:
            """Any finite values (the Gamma weight clamps what it must)."""

    def objective(self, x: LossInputs) -> torch.Tensor:
        o = self.options
        phi = vespo_weights(x.log_ratio, x.mask, x.adv, x.is_ratio, k_pos=o.vespo_k_pos, lambda_pos=o.vespo_lambda_pos,
                            k_neg=o.vespo_k_neg, lambda_neg=o.vespo_lambda_neg)
        return -phi * x.adv * x.logps


# verl's policy losses that TRL lacks; paired with verl's default aggregation, token-mean, except GMPO,
# whose per-sequence objective verl averages over sequences.


@dataclass
class TruncationOptions:
    clip_ratio_c: float = field(default=3.0, metadata={"help": "dual_clip: floor -c A on negative-advantage tokens, c > 1 (Ye et al. 2020; verl: 3.0); dppo_tv/dppo_kl: the cap of the truncated IS weight (verl's actor: 3.0; the DPPO paper: large, e.g. 20)"})

    def validate(self) -> None:
        if self.clip_ratio_c <= 1.0:
            raise ValueError(f"clip_ratio_c must be > 1 (dual-clip's floor), got {self.clip_ratio_c}")


@register_policy_loss
class DualClip(PolicyLoss):
    """Dual-clip PPO (Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep RL", arXiv 1912.09729; verl's
    "vanilla" loss with clip_ratio_c): PPO's clip, and for A < 0 a floor c > 1 under the objective,

        l = max( -r A, -clip(r, 1-eps, 1+eps_high) A )          A >= 0
        l = min( max( -r A, -clip(r, 1-eps, 1+eps_high) A ), -c A )   A < 0

    so a negative-advantage token whose ratio ran far above 1 contributes at most -c A (no gradient there).
    """

    name, aggregation = "dual_clip", "token-mean"
    clip_fraction = staticmethod(clip_fraction)
    Options = TruncationOptions

    def objective(self, x: LossInputs) -> torch.Tensor:
        clipped = torch.max(-x.ratio * x.adv, -torch.clamp(x.ratio, 1 - x.epsilon, 1 + x.epsilon_high) * x.adv)
        return torch.where(x.adv < 0, torch.min(clipped, -self.options.clip_ratio_c * x.adv), clipped)


@register_policy_loss
class GMPO(PolicyLoss):
    """GMPO (Zhao et al. 2025, "Geometric-Mean Policy Optimization", arXiv 2507.20673; verl's
    "geo_mean"): the geometric mean of the token ratios, each clipped in log space, per sequence,

        l_i = -A_i * exp( 1/|o_i| sum_t sgn(A_i) min( sgn(A_i) log r_{i,t}, sgn(A_i) clip(log r_{i,t}, -eps, eps_high) ) )

    A token-level clip on the log-ratio, then one (B, 1) value per completion: an outlier token moves the
    geometric mean far less than the arithmetic one. The paper clips to (e^-0.4, e^0.4): epsilon 0.4.
    ``level`` does not apply (the objective forms its own sequence ratio).
    """

    name, aggregation = "gmpo", "grpo"
    per_completion_advantages = True

    def objective(self, x: LossInputs) -> torch.Tensor:
        sign = torch.sign(x.adv)
        clipped = torch.clamp(x.log_ratio, -x.epsilon, x.epsilon_high)
        log_ratio = sign * torch.min(sign * x.log_ratio, sign * clipped)
        mean_log_ratio = (log_ratio * x.mask).sum(-1, keepdim=True) / x.mask.sum(-1, keepdim=True).clamp(min=1.0)
        return -x.adv * torch.exp(mean_log_ratio)


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


@register_policy_loss
class ClipCov(PolicyLoss):
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
    Models", arXiv 2505.22617; verl's "clip_cov"): PPO's clipped surrogate, with the gradient of a
    few high-covariance tokens cut,

        l_{i,t} = max( -r A, -clip(r, 1-eps, 1+eps_high) A ) * (1 - [ (i,t) in I_clip ])
        I_clip  = max(1, floor(clip_cov_ratio * N)) tokens drawn at random (``generator``) among the active
                  tokens the ratio clip left alone with  clip_cov_lb < Cov_{i,t} < clip_cov_ub  (``token_covariance``)

    (N active tokens; paper and verl: ratio 2e-4, bounds 1 and 5).
    """

    name, aggregation = "clip_cov", "token-mean"
    clip_fraction = staticmethod(clip_fraction)

    @dataclass
    class Options:
        clip_cov_ratio: float = field(default=2e-4, metadata={"help": "clip_cov: share of active tokens whose gradient is cut (Cui et al. 2025, verl: 2e-4)"})
        clip_cov_lb: float = field(default=1.0, metadata={"help": "clip_cov: lower covariance bound of the candidates (verl: 1.0)"})
        clip_cov_ub: float = field(default=5.0, metadata={"help": "clip_cov: upper covariance bound of the candidates (verl: 5.0)"})

        def validate(self) -> None:
            if not 0.0 < self.clip_cov_ratio <= 1.0:
                raise ValueError(f"clip_cov_ratio must be in (0, 1], got {self.clip_cov_ratio}")

    def objective(self, x: LossInputs) -> torch.Tensor:
        o = self.options
        ratio = x.ratio.expand_as(x.logps)
        unclipped, clipped = -ratio * x.adv, -torch.clamp(ratio, 1 - x.epsilon, 1 + x.epsilon_high) * x.adv
        active = x.mask.bool()
        cov = token_covariance(x.logps.detach(), x.adv, x.mask)
        candidates = (active & ~(clipped > unclipped) & (cov > o.clip_cov_lb) & (cov < o.clip_cov_ub)).flatten().nonzero().flatten()
        count = min(max(int(o.clip_cov_ratio * int(active.sum())), 1), candidates.numel())
        device = x.generator.device if x.generator is not None else candidates.device
        order = torch.randperm(candidates.numel(), generator=x.generator, device=device)
        picked = candidates[order[:count].to(candidates.device)]
        keep = torch.ones_like(x.logps).flatten().index_fill(0, picked, 0.0).view_as(x.logps)
        return torch.max(unclipped, clipped) * keep


@register_policy_loss
class KLCov(PolicyLoss):
    """KL-Cov (Cui et al. 2025, arXiv 2505.22617; verl's "kl_cov"): the unclipped surrogate, plus a
    KL penalty on the tokens of highest covariance,

        l_{i,t} = -r A + kl_cov_coef * |log r|   for the top max(1, floor(kl_cov_ratio * N)) tokens by Cov_{i,t}
        l_{i,t} = -r A                          otherwise

    (N active tokens; paper and verl: ratio 2e-4, coefficient 1).
    """

    name, aggregation = "kl_cov", "token-mean"

    @dataclass
    class Options:
        kl_cov_ratio: float = field(default=2e-4, metadata={"help": "kl_cov: share of active tokens, by covariance, that get the |log r| penalty (Cui et al. 2025, verl: 2e-4)"})
        kl_cov_coef: float = field(default=1.0, metadata={"help": "kl_cov: weight of the |log r| penalty (verl's ppo_kl_coef: 1.0)"})

        def validate(self) -> None:
            if not 0.0 < self.kl_cov_ratio <= 1.0:
                raise ValueError(f"kl_cov_ratio must be in (0, 1], got {self.kl_cov_ratio}")
            if self.kl_cov_coef < 0:
                raise ValueError(f"kl_cov_coef must be >= 0, got {self.kl_cov_coef}")

    def objective(self, x: LossInputs) -> torch.Tensor:
        o = self.options
        ratio = x.ratio.expand_as(x.logps)
        loss = -ratio * x.adv
        active = x.mask.bool().flatten()
        if not active.any():
            return loss
        cov = token_covariance(x.logps.detach(), x.adv, x.mask).flatten().masked_fill(~active, -math.inf)
        count = max(int(o.kl_cov_ratio * int(active.sum())), 1)
        top = torch.zeros_like(cov).index_fill(0, cov.topk(count).indices, 1.0).view_as(x.logps)
        return loss + top * o.kl_cov_coef * x.log_ratio.abs()


@torch.no_grad()
def _dppo_truncated_ratio(log_ratio: torch.Tensor, cap: float) -> torch.Tensor:
    """sg(min(r, C)), r = exp(log r) with log r clamped to [-20, 20] (verl's guard against overflow)."""
    return torch.clamp(torch.exp(torch.clamp(log_ratio, -20.0, 20.0)), max=cap)


@register_policy_loss
class DPPOTV(PolicyLoss):
    """DPPO-Binary-TV (arXiv 2602.04879, verl's "dppo_tv"): REINFORCE weighted by a truncated, stop-gradient
    IS ratio, on the tokens whose sampled-token probability moved less than a total-variation bound,

        l_{i,t} = -A_{i,t} * sg(min(r_{i,t}, C)) * log pi(o_{i,t}) * sg(m_{i,t})
        m_{i,t} = [ pi(o_{i,t}) - pi_old(o_{i,t}) <= eps_high ]    A > 0
                = [ pi(o_{i,t}) - pi_old(o_{i,t}) >= -eps ]        A <= 0

    The trust region is a divergence bound (``epsilon``, ``epsilon_high``: TV thresholds, not ratio ranges) instead of
    PPO's ratio clip; C = ``clip_ratio_c`` truncates the IS weight (the paper: large, e.g. 20; verl's actor config 3.0).
    Token-level by definition: ``level`` does not apply."""

    name, aggregation = "dppo_tv", "token-mean"
    Options = TruncationOptions

    def objective(self, x: LossInputs) -> torch.Tensor:
        with torch.no_grad():
            moved = torch.exp(x.logps) - torch.exp(x.old_logps)
            keep = torch.where(x.adv > 0, moved <= x.epsilon_high, moved >= -x.epsilon).to(x.logps.dtype)
        return -x.adv * _dppo_truncated_ratio(x.log_ratio, self.options.clip_ratio_c) * x.logps * keep


@register_policy_loss
class DPPOKL(PolicyLoss):
    """DPPO-Binary-KL (arXiv 2602.04879, verl's "dppo_kl"): as ``dppo_tv``, with the binary KL between the
    sampled token's old and new probabilities as the divergence,

        D_{i,t} = p_old log(p_old / p) + (1 - p_old) log((1 - p_old + 1e-8) / (1 - p + 1e-8)),  p = pi(o_{i,t})
        m_{i,t} = [ D <= eps_high  or  p <= p_old ]     A > 0      (only a move up is bounded)
                = [ D <= eps       or  p >= p_old ]     A <= 0     (only a move down is bounded)
        l_{i,t} = -A_{i,t} * sg(min(r_{i,t}, C)) * log pi(o_{i,t}) * sg(m_{i,t})
    """

    name, aggregation = "dppo_kl", "token-mean"
    Options = TruncationOptions

    def objective(self, x: LossInputs) -> torch.Tensor:
        with torch.no_grad():
            p, p_old = torch.exp(x.logps), torch.exp(x.old_logps)
            divergence = p_old * (x.old_logps - x.logps) + (1 - p_old) * torch.log((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8))
            keep = torch.where(x.adv > 0, (divergence <= x.epsilon_high) | (p <= p_old),
                               (divergence <= x.epsilon) | (p >= p_old)).to(x.logps.dtype)
        return -x.adv * _dppo_truncated_ratio(x.log_ratio, self.options.clip_ratio_c) * x.logps * keep


# ms-swift 4.6.0's loss types that TRL and verl lack: REAL (a group-wise ranking loss) and FIPO (the clipped
# surrogate weighted by the future KL of each token).


def real_group_losses(scores: torch.Tensor, advantages: torch.Tensor, group_size: int, tau: float) -> torch.Tensor:
    """REAL's loss per group (arXiv 2602.05630; ms-swift 4.6.0's loss_type "real"), (n_groups,):

        L_g = log(1 + sum_{i in N_g} e^{S_i / tau}) + log(1 + sum_{i in P_g} e^{-S_i / tau})

    ``scores`` (B,) S_i, each completion's mean token log-ratio log(pi_theta / pi_old); ``advantages`` (B,) only
    their signs count: P_g = {A_i > 0}, N_g = {A_i <= 0}. A group without both a positive and a non-positive
    completion has no pair to rank: L_g = 0. The gradient weight on S_i is bounded by 1 / tau (ms-swift: tau 0.5)."""
    scores, signs = scores.view(-1, group_size) / tau, advantages.reshape(-1, group_size)
    positive = signs > 0
    valid = positive.any(dim=1) & (~positive).any(dim=1)
    zero = scores.new_zeros(scores.size(0), 1)  # the 1 in log(1 + sum): logsumexp with e^0
    negatives = torch.logsumexp(torch.cat([scores.masked_fill(positive, -math.inf), zero], dim=1), dim=1)
    positives = torch.logsumexp(torch.cat([(-scores).masked_fill(~positive, -math.inf), zero], dim=1), dim=1)
    return torch.where(valid, negatives + positives, torch.zeros_like(negatives))


@dataclass
class REALOptions:
    real_tau: float = field(default=0.5, metadata={
        "help": "real: temperature tau of the ranking loss, its gradient weight bounded by 1/tau (ms-swift: 0.5)"})

    def validate(self) -> None:
        if self.real_tau <= 0:
            raise ValueError(f"real_tau must be > 0, got {self.real_tau}")


@register_policy_loss
class REAL(PolicyLoss):
    """REAL (arXiv 2602.05630; ms-swift 4.6.0's loss_type "real"): each group's completions ranked by their
    sequence score S_i = 1/|o_i| sum_t log(pi_theta / pi_old)(o_{i,t}), the positive-advantage ones above the rest
    (``real_group_losses``), averaged over the batch's groups (the groups without a pair count as 0),

        loss = 1/n sum_g L_g

    Each row carries its group's L_g, (B, 1), so the "grpo" aggregation (the mean over rows) gives 1/n sum_g L_g
    (exact when every row has an active token). Only the advantages' signs count, so GRPO's ``scale_rewards`` does
    not matter (ms-swift forces "none"); epsilon and delta do not apply, and unlike ms-swift the KL term is
    aggregated per completion (ms-swift: over tokens; equal at equal lengths). Needs whole groups (``group_size``)."""

    name, aggregation = "real", "grpo"
    per_completion_advantages = True
    Options = REALOptions

    def objective(self, x: LossInputs) -> torch.Tensor:
        if x.group_size is None:
            raise ValueError("loss_type 'real' ranks within groups: it needs group_size")
        scores = (x.log_ratio * x.mask).sum(-1) / x.mask.sum(-1).clamp(min=1.0)
        losses = real_group_losses(scores, x.adv.view(-1), x.group_size, self.options.real_tau)
        return losses.repeat_interleave(x.group_size).unsqueeze(-1)


@torch.no_grad()
def fipo_influence_weights(
    log_ratio: torch.Tensor,
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    decay_rate: float = 32.0,
    clip_range: Optional[float] = 0.2,
    clip_high_only: bool = True,
    safety_threshold: Optional[float] = 4.0,
    delta: Optional[float] = None,
) -> torch.Tensor:
    """FIPO's token influence weight (arXiv 2603.19835; ms-swift 4.6.0's ``_compute_fipo_influence``), (B, T), no
    gradient:

        FKL_{i,t} = sum_{s >= t} gamma^(s - t) log r_{i,s},   gamma = 2^(-1 / decay_rate)   (decay_rate: half-life)
        w_{i,t}   = clip(exp(FKL_{i,t}), 1 or 1 - c, 1 + c)     (c = clip_range; the lower bound 1 if clip_high_only)
        w_{i,t}   = clip(w_{i,t}, 0.8, 1.0)   where A_i < 0 and r_{i,t} > safety_threshold

    a token whose continuation the update already made more likely weighs more. Padding (and, with ``delta``, a
    token whose ratio exceeds delta: dual clip's participation mask) adds nothing to the future KL. ``clip_range``
    None or 0 and ``safety_threshold`` None or 0 turn those off (ms-swift: None; a threshold 0 would cap every
    negative-advantage token, no use). ``ratio`` (B, T) or (B, 1), ``advantages`` (B, 1)."""
    mask = mask.to(log_ratio.dtype)
    step = log_ratio * mask
    if delta is not None:
        step = step.masked_fill((ratio > delta).expand_as(step), 0.0)
    positions = torch.arange(step.size(-1), device=step.device)
    distance = positions.unsqueeze(0) - positions.unsqueeze(1)  # [t, s] = s - t
    gamma = 2.0 ** (-1.0 / decay_rate)
    decay = torch.where(distance >= 0, gamma ** distance.clamp(min=0).to(step.dtype), torch.zeros((), dtype=step.dtype))
    weight = torch.exp((step @ decay.T) * mask)
    if clip_range:
        weight = weight.clamp(min=1.0 if clip_high_only else 1.0 - clip_range, max=1.0 + clip_range)
    if safety_threshold:
        unsafe = (advantages < 0) & (ratio > safety_threshold)
        weight = torch.where(unsafe.expand_as(weight), weight.clamp(min=0.8, max=1.0), weight)
    return weight


@dataclass
class FIPOOptions:
    fipo_decay_rate: float = field(default=32.0, metadata={
        "help": "fipo: half-life in tokens of the future-KL discount, gamma = 2^(-1/rate) (ms-swift: 32)"})
    fipo_clip_range: Optional[float] = field(default=0.2, metadata={
        "help": "fipo: clip the influence weight to 1 +- this; 0: no clip (ms-swift: 0.2)"})
    fipo_clip_high_only: bool = field(default=True, metadata={
        "help": "fipo: clip the influence weight to [1, 1 + fipo_clip_range] (ms-swift: on)"})
    fipo_safety_threshold: Optional[float] = field(default=4.0, metadata={
        "help": "fipo: cap the weight to [0.8, 1] of A < 0 tokens whose ratio exceeds this; 0: off (ms-swift: 4.0)"})

    def validate(self) -> None:
        if self.fipo_decay_rate <= 0:
            raise ValueError(f"fipo_decay_rate must be > 0, got {self.fipo_decay_rate}")
        if self.fipo_clip_range is not None and not 0 <= self.fipo_clip_range < 1:
            raise ValueError(f"fipo_clip_range must be in [0, 1), got {self.fipo_clip_range}")
        if self.fipo_safety_threshold is not None and self.fipo_safety_threshold < 0:
            raise ValueError(f"fipo_safety_threshold must be >= 0, got {self.fipo_safety_threshold}")


@register_policy_loss
class FIPO(GRPOClip):
    """FIPO (Future-KL influenced policy optimisation, arXiv 2603.19835; ms-swift 4.6.0's loss_type "fipo"): the
    clipped surrogate (with ``delta``'s cap), each token weighted by its influence weight (``fipo_influence_weights``),
    token mean over the generation batch as dapo:

        l_{i,t} = -min(r A, clip(r, 1-eps, 1+eps_high) A) * sg(w_{i,t})

    At mu = 1 every log-ratio is 0, w = 1, and FIPO is dapo."""

    name, aggregation, family = "fipo", "dapo", "fipo"
    Options = FIPOOptions

    def objective(self, x: LossInputs) -> torch.Tensor:
        o = self.options
        weight = fipo_influence_weights(x.log_ratio, x.ratio, x.adv, x.mask, decay_rate=o.fipo_decay_rate,
                                        clip_range=o.fipo_clip_range, clip_high_only=o.fipo_clip_high_only,
                                        safety_threshold=o.fipo_safety_threshold, delta=x.delta)
        return super().objective(x) * weight


# The loss types TRL 1.16 has (the TRL check compares each); the registry holds these and verl's above.
GRPO_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
CLIPPED_LOSS_TYPES = tuple(name for name in GRPO_LOSS_TYPES if POLICY_LOSSES[name].takes_delta)



# --------------------------------------------------------------------------------------------
# Token and sequence masks (the sampler/trainer mismatch corrections: algorithms/sampler_corrections.py)
# --------------------------------------------------------------------------------------------


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


@dataclass(frozen=True)
class GRPOLoss:
    """GRPO's surrogate loss (DeepSeekMath, Shao et al. 2024, Eq. 21), configured; a call takes the tensors and
    returns the loss to minimise:

        J(theta) = 1/G sum_i 1/|o_i| sum_t { min( r_{i,t} A_i, clip(r_{i,t}, 1-eps, 1+eps_high) A_i )
                                             - beta * KL_k3[pi_theta || pi_ref]_{i,t} }
        loss = -J(theta)

    with r_{i,t} = pi_theta(o_{i,t}|q,o_{i,<t}) / pi_theta_old(o_{i,t}|q,o_{i,<t}) (``level`` "token")
    or one ratio per completion, exp of its mean token log-ratio (``level`` "sequence", GSPO).

    ``policy``, the registered policy loss (GRPO's ``loss_type``) with its options, gives the per-token objective: the
    clipped surrogate above with TRL 1.16's grpo / bnpo / dr_grpo / dapo / luspo aggregations, cispo, sapo, vespo,
    verl's dual_clip, gmpo, clip_cov, kl_cov, dppo_tv, dppo_kl, ms-swift's real and fipo, and plug-ins. Then, in TRL's
    order: the off-policy sequence mask, the high-entropy token mask, the sampler's weight (``correction``, GRPO's
    ``importance_sampling_mode`` with its options; unless the loss folds it into its own), the KL term, the
    aggregation, the entropy bonus.

    ``GRPOConfig.loss()`` builds it. Every field but four is the GRPO setting of the same name, whose meaning and
    default are stated there, once: ``policy`` and ``correction`` are the members those settings pick, ``aggregation``
    is a ``LOSS_AGGREGATIONS`` name (``loss_aggregation``, else the loss type's own), and ``max_completion_length`` the
    sampling limit (the normaliser of dr_grpo and seq-mean-token-sum-norm)."""

    policy: PolicyLoss
    correction: SamplerCorrection
    aggregation: str
    level: str
    epsilon: float
    epsilon_high: Optional[float]
    delta: Optional[float]
    beta: float
    kl_loss_type: str
    kl_bias_correction: bool
    entropy_coef: float
    top_entropy_quantile: float
    off_policy_mask_threshold: Optional[float]
    importance_sampling_correction: bool
    importance_sampling_clip_min: Optional[float]
    importance_sampling_clip_max: Optional[float]
    group_size: Optional[int]
    max_completion_length: Optional[int]

    def __post_init__(self):
        lookup_named(KL_PENALTIES, "kl_loss_type", self.kl_loss_type)
        lookup_named(LOSS_AGGREGATIONS, "loss_aggregation", self.aggregation)
        if self.epsilon < 0 or (self.epsilon_high is not None and self.epsilon_high < 0) or self.beta < 0:
            raise ValueError("epsilon, epsilon_high and beta must be >= 0")

    @property
    def token_mean(self) -> bool:
        """Whether the aggregation divides by the batch's token count (``num_items_in_batch`` on one rank's share)."""
        return LOSS_AGGREGATIONS[self.aggregation].token_mean

    @property
    def reads_entropies(self) -> bool:
        """Whether a call needs the tokens' entropies: the entropy mask, or the bonus (which needs their graph)."""
        return self.top_entropy_quantile < 1.0 or self.entropy_coef != 0.0

    def sampler_weight(self, old_logps: torch.Tensor, sampling_logps: torch.Tensor,
                       mask: torch.Tensor) -> Optional[torch.Tensor]:
        """The correction's weight on the per-token loss, (B, T) or (B, 1), from pi_old and the sampler's log-probs
        (B, T); None for none (correction off, bypass, a gate at level off)."""
        if not self.importance_sampling_correction:
            return None
        return self.correction.weights(old_logps, sampling_logps, mask, self.importance_sampling_clip_min,
                                       self.importance_sampling_clip_max)

    def pi_old(self, old_logps: torch.Tensor, sampling_logps: Optional[torch.Tensor]) -> torch.Tensor:
        """The old policy's log-probs the ratio is taken against: the trainer's, or under a bypass correction (verl's
        bypass mode) the sampler's where it recorded them."""
        if sampling_logps is not None and self.importance_sampling_correction and self.correction.bypass:
            return self.correction.old_logps(old_logps, sampling_logps)
        return old_logps

    def clip_fraction(self, logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor,
                      mask: torch.Tensor, sampling_logps: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
        """The share of active tokens the policy loss's clip bound (its ``clip_fraction``), the ratio taken against
        the pi_old a call with the same ``sampling_logps`` uses (``pi_old``: under bypass the sampler's, as verl's
        pg_clipfrac in bypass mode); None where the loss has no clip."""
        if self.policy.clip_fraction is None:
            return None
        return self.policy.clip_fraction(logps, self.pi_old(old_logps, sampling_logps), advantages, mask,
                                         level=self.level, epsilon=self.epsilon, epsilon_high=self.epsilon_high)

    def __call__(
        self,
        logps: torch.Tensor,
        old_logps: Optional[torch.Tensor],
        ref_logps: Optional[torch.Tensor],
        advantages: torch.Tensor,
        mask: torch.Tensor,
        *,
        entropies: Optional[torch.Tensor] = None,
        sampling_logps: Optional[torch.Tensor] = None,
        num_items_in_batch: Optional[float] = None,
        generator: Optional[torch.Generator] = None,
        return_parts: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, dict[str, float]]:
        """The loss on one batch.

        Args:
            logps: (B, T) per-token log-probs under the current policy (carries the gradient).
            old_logps: (B, T) log-probs of the sampling policy, or None for on-policy (mu = 1): then the
                ratio is exp(logps - logps.detach()) = 1 in value with the policy gradient as its gradient,
                which is why the loss *value* is 0 at mu = 1 and beta = 0 with loss_type "grpo".
            ref_logps: (B, T) reference-policy log-probs; may be None when beta == 0.
            advantages: (B,) one advantage per completion (``group_advantages``), or (B, T) one per token (an
                estimator such as ``optimal_token_baseline``; not for a loss that reads one per completion, nor the
                off-policy mask).
            mask: (B, T) 1 on completion tokens up to and including the first EOS.
            entropies: (B, T) token entropies of the current policy, for the entropy mask (``high_entropy_mask``)
                and the bonus (``entropy_bonus_loss``, token-mean over the tokens trained on whatever the
                aggregation, as TRL and OpenRLHF; then with their graph); read only where ``reads_entropies``.
            sampling_logps: (B, T) the sampler's own log-probs of the sampled tokens, or None: where given, the
                correction weighs the loss (``sampler_weight``) or, verl's bypass, stands in for old_logps.
            num_items_in_batch: for a token-mean aggregation on a micro-batch or one rank's share, the generation
                batch's active tokens (divided by the world size under data parallelism).
            generator: the generator of a loss's random pick (clip_cov).
            return_parts: also return the loss's parts, each aggregated as the loss is (no graph): ``policy`` (the
                objective with its masks and IS weight), ``kl`` (beta x the KL term, with ``kl_loss_type``'s
                estimator; present when beta > 0) and ``entropy`` (the bonus, negative; present when entropy_coef
                != 0). They add up to the loss up to rounding; the loss itself is computed as without them.
        Returns:
            scalar loss tensor; with ``return_parts``, (loss, {part: value}).
        """
        policy = self.policy
        mask = mask.to(logps.dtype)
        old_logps = logps.detach() if old_logps is None else old_logps
        is_ratio = None
        if sampling_logps is not None and self.importance_sampling_correction:
            if policy.folds_sampling_weight and self.correction.sequence_level:
                raise ValueError(f"loss_type {policy.name!r} needs a token-level importance_sampling_mode (TRL "
                                 f"refuses sequence modes), got {self.correction.name!r}")
            old_logps = self.pi_old(old_logps, sampling_logps)
            is_ratio = self.sampler_weight(old_logps, sampling_logps, mask)
        ratio = importance_ratio(logps, old_logps, mask, self.level)  # (B, T) or (B, 1)
        epsilon_high = self.epsilon if self.epsilon_high is None else self.epsilon_high
        per_token = policy.objective(LossInputs(
            logps=logps, old_logps=old_logps, log_ratio=logps - old_logps, ratio=ratio,
            adv=per_token_advantages(advantages), mask=mask, is_ratio=is_ratio, epsilon=self.epsilon,
            epsilon_high=epsilon_high, delta=self.delta, generator=generator, group_size=self.group_size))
        if self.off_policy_mask_threshold is not None:
            behaviour = old_logps if sampling_logps is None else sampling_logps
            per_token = per_token * off_policy_sequence_mask(logps, behaviour, advantages, mask,
                                                             self.off_policy_mask_threshold)
        trained = mask  # the tokens the loss trains on, which the entropy bonus averages over (TRL's effective mask)
        if self.top_entropy_quantile < 1.0:
            if entropies is None:
                raise ValueError("top_entropy_quantile < 1 needs the tokens' entropies")
            entropy_mask = high_entropy_mask(entropies, mask, self.top_entropy_quantile)
            per_token = per_token * entropy_mask
            trained = mask * entropy_mask
        if is_ratio is not None and not policy.folds_sampling_weight:
            per_token = per_token * is_ratio
        policy_per_token, kl_per_token = per_token, None
        if self.beta != 0.0:
            if ref_logps is None:
                raise ValueError("beta > 0 needs ref_logps")
            kl = KL_PENALTIES[self.kl_loss_type](logps, ref_logps)
            kl_per_token = self.beta * (kl * ratio if self.kl_bias_correction else kl)
            per_token = per_token + kl_per_token

        def aggregate(values: torch.Tensor) -> torch.Tensor:  # sequence level with beta = 0 is still (B, 1)
            return LOSS_AGGREGATIONS[self.aggregation](values.expand_as(logps), mask, self.max_completion_length,
                                                       num_items_in_batch)

        loss = aggregate(per_token)
        bonus = None
        if self.entropy_coef != 0.0:
            if entropies is None:
                raise ValueError("entropy_coef != 0 needs the tokens' entropies (with their graph)")
            bonus = entropy_bonus_loss(entropies, trained, self.entropy_coef)
            loss = loss + bonus
        if not return_parts:
            return loss
        with torch.no_grad():
            parts = {"policy": aggregate(policy_per_token).item()}
            if kl_per_token is not None:
                parts["kl"] = aggregate(kl_per_token).item()
            if bonus is not None:
                parts["entropy"] = bonus.item()
        return loss, parts


# --------------------------------------------------------------------------------------------
# RGRA (arXiv 2603.18756): GRPO's group-relative advantage with REINFORCE's objective, no ratio and no clip
# --------------------------------------------------------------------------------------------


@register_policy_loss
class RGRA(PolicyLoss):
    """REINFORCE with Group Relative Advantage (Carrino et al. 2026, "Are complicated loss functions necessary for
    teaching LLMs to reason?", arXiv 2603.18756): GRPO's objective with the importance ratio and its clip removed,
    the group-relative advantage and the KL term kept,

        J(theta) = 1/G sum_i 1/|o_i| sum_t { A_i log pi_theta(o_{i,t} | q, o_{i,<t})
                                             - beta * KL_k3[pi_theta || pi_ref]_{i,t} }
        loss = -J(theta)

    per token -A_i log pi_theta, aggregated as GRPO's ("grpo"). At mu = 1 its gradient is GRPO's (there the ratio
    is 1 in value and never clipped); at mu > 1 the later updates push on log pi_theta of completions sampled from
    pi_old with no importance weight and no trust region, which is what the paper finds unnecessary. Its value is
    not 0 on policy, as the clipped surrogate's is: it carries log pi itself."""

    name, aggregation = "rgra", "grpo"

    def objective(self, x: LossInputs) -> torch.Tensor:
        return -x.adv * x.logps
