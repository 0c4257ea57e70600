"""``grpo-bench check references``: every advantage estimator, policy loss, aggregation, KL estimator and PPO piece of
this suite against every reference framework that implements it -- verl 0.9.1, OpenRLHF 0.11.2 and TRL 1.12.0's PPO
(benchmarks/references/) -- on the same float64 tensors.

A configuration is one function of ours and the framework's counterpart, with knob values (clip ranges, dual-clip c,
aggregation, KL estimator, gamma and lambda, ...), on one batch: random, or an edge case (all-masked rows, tied
rewards, one-token completions, long completions, ratios far outside the clip range). For a loss the check records
the largest absolute difference of the value and of the gradient with respect to the log-probs (the values, for a
value loss); for an advantage estimator, of the advantages on active tokens. A row agrees when both stay within
``TOL`` times max(1, the reference's largest magnitude).

Where a framework computes something else by design (another aggregation over all-masked rows, another epsilon, a
clamp, another variance), the row says "differs by design" with the reason, and a row beside it shows that ours with
the matching knob agrees. A planted error -- our function perturbed in place for the duration of one re-run -- must
make at least one agreeing row fail; the report lists which planted errors were caught.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional

import torch

from algorithms import estimators, kl, losses, policy_losses
from benchmarks.errors import UsageError
from benchmarks.io import atomic_write_text
from benchmarks.markdown import markdown_table, write_report
from benchmarks.references import features, install, openrlhf, trl_ppo, verl
from benchmarks.study import StudySettings, option

TOL = 1e-5
FRAMEWORKS = ("verl", "openrlhf", "trl-ppo")
DTYPE = torch.float64
HUGE_C = 1e12  # a dual-clip floor that never binds: verl's "vanilla" loss is PPO's clip with it


# --------------------------------------------------------------------------------------------
# Batches: one random shape and the edge cases, float64
# --------------------------------------------------------------------------------------------

# case -> (B, T, G, spread of the log-ratios)
CASES = {
    "random": (8, 12, 4, 0.3),
    "empty": (8, 12, 4, 0.3),  # rows 1 and 6 have no active token
    "tied": (8, 12, 4, 0.3),  # every group's rewards tie but the last one's
    "one_token": (8, 6, 4, 0.3),  # every completion is one token
    "long": (4, 384, 2, 0.3),
    "far": (8, 12, 4, 3.0),  # ratios far outside any clip range; KL clamps bind
}
SEEDS = {"random": (0, 1)}  # other cases: seed 0


@dataclass(frozen=True)
class Batch:
    case: str
    seed: int
    group_size: int
    mask: torch.Tensor  # (B, T) the mask convention, float64
    logps: torch.Tensor  # (B, T) current policy
    old_logps: torch.Tensor  # (B, T) sampling policy
    ref_logps: torch.Tensor  # (B, T) reference
    advantages: torch.Tensor  # (B,) random signs and sizes, 0 for a tied group
    rewards: torch.Tensor  # (B,) in {0, 0.5, 1}, group by group
    baseline_rewards: torch.Tensor  # (B,) a greedy completion's reward (ReMax)
    values: torch.Tensor  # (B, T) critic's current values
    old_values: torch.Tensor  # (B, T)
    returns: torch.Tensor  # (B, T)
    entropies: torch.Tensor  # (B, T)
    sum_pi_squared: torch.Tensor  # (B, T) >= pi_old(o_t)^2

    @property
    def lengths(self) -> torch.Tensor:
        return self.mask.sum(-1).long()

    @property
    def width(self) -> int:
        return self.mask.size(1)


def make_batch(case: str, seed: int) -> Batch:
    B, T, G, spread = CASES[case]
    g = torch.Generator().manual_seed(1000 * seed + list(CASES).index(case))

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=DTYPE)

    def rand(*shape):
        return torch.rand(*shape, generator=g, dtype=DTYPE)

    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T  # one completion fills the width (TRL then puts its score on the last token)
    if case == "empty":
        lengths[[1, 6]] = 0
    if case == "one_token":
        lengths[:] = 1
    if case == "long":
        lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
        lengths[0] = T
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).to(DTYPE)
    logps = -(rand(B, T) * 2 + 0.05)
    rewards = torch.randint(0, 3, (B,), generator=g).to(DTYPE) / 2
    rewards.view(-1, G)[:, 0], rewards.view(-1, G)[:, 1] = 0.0, 1.0  # every group varies ...
    advantages = randn(B)
    if case == "tied":  # ... but in "tied", where all groups tie except the last
        grouped = rewards.view(-1, G)
        grouped[:-1] = torch.tensor([0.0, 1.0, 0.5])[torch.arange(grouped.size(0) - 1) % 3].to(DTYPE).unsqueeze(1)
        advantages.view(-1, G)[:-1] = 0.0
    p_old = torch.exp(logps)
    return Batch(
        case=case, seed=seed, group_size=G, mask=mask, logps=logps, old_logps=logps + spread * randn(B, T),
        ref_logps=logps + spread * randn(B, T), advantages=advantages, rewards=rewards,
        baseline_rewards=torch.randint(0, 3, (B,), generator=g).to(DTYPE) / 2, values=randn(B, T) * mask,
        old_values=(randn(B, T) * mask), returns=randn(B, T) * mask, entropies=rand(B, T) * 2,
        sum_pi_squared=p_old.square() + rand(B, T) * (1 - p_old).square())


# --------------------------------------------------------------------------------------------
# Configurations and rows
# --------------------------------------------------------------------------------------------

# A comparison: (ours, theirs, our gradient, their gradient); gradients None for an estimator.
Comparison = tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]


@dataclass
class Config:
    framework: str  # a key of install.PINNED
    group: str  # policy_loss, aggregation, kl, actor_loss, estimator, gae, whitening, value_loss, ppo_policy_loss
    function: str  # our name (a registry name, or the losses.py function)
    theirs: str  # the framework's name
    knobs: str  # "epsilon=0.2, epsilon_high=0.28", ...
    case: str
    seed: int
    compare: Callable[[Batch], Comparison] = field(repr=False)
    by_design: Optional[str] = None  # the reason the framework differs here, or None: it must agree

    @property
    def name(self) -> str:
        return f"{self.framework}:{self.group}:{self.function}[{self.knobs}]@{self.case}/{self.seed}"


@dataclass
class Row:
    framework: str
    group: str
    function: str
    theirs: str
    knobs: str
    case: str
    seed: int
    expected: str  # "agree" or "differs by design"
    value_diff: float
    grad_diff: Optional[float]
    scale: float
    status: str  # "agrees", "FAILS", "differs by design", "by design, agrees here"
    reason: str = ""
    error: str = ""

    @property
    def within(self) -> bool:
        limit = TOL * max(1.0, self.scale)
        return self.value_diff <= limit and (self.grad_diff is None or self.grad_diff <= limit)


def max_diff(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    """Largest absolute difference; NaNs in the same places are equal, elsewhere infinitely apart."""
    ours, theirs = ours.detach().to(DTYPE), theirs.detach().to(DTYPE)
    if ours.shape != theirs.shape:
        try:
            ours, theirs = torch.broadcast_tensors(ours, theirs)
        except RuntimeError:
            return math.inf
    nan_o, nan_t = torch.isnan(ours), torch.isnan(theirs)
    if (nan_o != nan_t).any():
        return math.inf
    diff = (ours - theirs).abs().masked_fill(nan_o, 0.0)
    return float(diff.max()) if diff.numel() else 0.0


def run_config(config: Config, batch: Batch) -> Row:
    common = dict(framework=config.framework, group=config.group, function=config.function, theirs=config.theirs,
                  knobs=config.knobs, case=config.case, seed=config.seed,
                  expected="agree" if config.by_design is None else "differs by design", reason=config.by_design or "")
    try:
        ours, theirs, g_ours, g_theirs = config.compare(batch)
    except install.MissingFramework:
        raise
    except Exception as exc:  # noqa: BLE001  a crash of either side is a failed row, not a crashed check
        return Row(**common, value_diff=math.inf, grad_diff=None, scale=1.0, status="FAILS",
                   error=f"{type(exc).__name__}: {exc}".splitlines()[0][:200])
    scale = float(theirs.detach().abs().nan_to_num(0.0).max()) if theirs.numel() else 0.0
    if g_theirs is not None:
        scale = max(scale, float(g_theirs.abs().nan_to_num(0.0).max()) if g_theirs.numel() else 0.0)
    row = Row(**common, value_diff=max_diff(ours, theirs),
              grad_diff=None if g_ours is None else max_diff(g_ours, g_theirs), scale=scale, status="")
    if config.by_design is None:
        row.status = "agrees" if row.within else "FAILS"
    else:
        row.status = "by design, agrees here" if row.within else "differs by design"
    return row


# --------------------------------------------------------------------------------------------
# Helpers that turn two functions into a Comparison
# --------------------------------------------------------------------------------------------


def _leaf(x: torch.Tensor) -> torch.Tensor:
    return x.detach().clone().requires_grad_(True)


def loss_pair(ours: Callable, theirs: Callable, wrt: str = "logps") -> Callable[[Batch], Comparison]:
    """Each side gets the batch with ``wrt`` a fresh leaf and returns a scalar (or a per-token tensor, compared on
    active tokens, its gradient that of the masked sum); the gradients are taken with respect to ``wrt``."""

    def side(fn, batch):
        x = _leaf(getattr(batch, wrt))
        out = fn(dataclasses.replace(batch, **{wrt: x}))
        if out.dim() > 0:
            out = out * batch.mask
        (grad,) = torch.autograd.grad(out.sum(), x, allow_unused=True)
        return out.detach(), torch.zeros_like(x) if grad is None else grad

    def compare(batch: Batch) -> Comparison:
        o, go = side(ours, batch)
        t, gt = side(theirs, batch)
        return o, t, go, gt

    return compare


def value_pair(ours: Callable, theirs: Callable) -> Callable[[Batch], Comparison]:
    """Advantages (and the like): (B,) per completion or (B, T) per token, compared on active tokens."""

    def tokens(x: torch.Tensor, batch: Batch) -> torch.Tensor:
        x = x.detach().to(DTYPE)
        return (x.unsqueeze(-1) if x.dim() == 1 else x) * batch.mask

    def compare(batch: Batch) -> Comparison:
        with torch.no_grad():
            return tokens(ours(batch), batch), tokens(theirs(batch), batch), None, None

    return compare


def _knobs(**values) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items()) or "-"


def _cases(cases: Iterable[str]) -> list[tuple[str, int]]:
    return [(case, seed) for case in cases for seed in SEEDS.get(case, (0,))]


def _ours_loss(loss_type: str, **kwargs) -> Callable[[Batch], torch.Tensor]:
    """``grpo_loss`` of ``loss_type`` on a batch; ``kwargs`` its options, plus ``with_entropies`` (pass the batch's)
    and ``max_completion_length="T"`` (the batch's width)."""

    def call(b: Batch) -> torch.Tensor:
        extra = dict(kwargs)
        ref = b.ref_logps if extra.get("beta", 0.0) else None
        if extra.pop("with_entropies", False):
            extra["entropies"] = b.entropies
        if extra.get("max_completion_length") == "T":
            extra["max_completion_length"] = b.width
        return policy_losses.grpo_loss(b.logps, b.old_logps, ref, b.advantages, b.mask, loss_type=loss_type, **extra)

    return call


# --------------------------------------------------------------------------------------------
# verl 0.9.1
# --------------------------------------------------------------------------------------------

EMPTY_ROWS = ("verl's seq-mean modes leave all-masked rows out of the mean over sequences; ours {ours} ({norm}) counts "
              "them as zeros; with loss_aggregation={match} ours drops them too")
NORMS = {"grpo": "the paper's 1/G", "sapo": "the paper's 1/G", "luspo": "the paper's 1/G",
         "dr_grpo": "Dr. GRPO's constant B x L"}


def _empty_rows(loss_type: str, match: str) -> str:
    if loss_type == "dr_grpo":  # verl 0.9.1 divides by (rows with a token) x L; see the seq-mean-token-sum-norm rows
        return ("verl's seq-mean-token-sum-norm divides by the rows that have a token times L; Dr. GRPO's constant "
                "B x L (ours) counts all-masked rows too")
    return EMPTY_ROWS.format(ours=loss_type, norm=NORMS[loss_type], match=match)


def _k3_clamp(case: str) -> Optional[str]:
    return ("verl's k3 is clamped as its low_var_kl (log-ratio to [-20, 20], value to [-10, 10]); ours is "
            "DeepSeekMath's and TRL's k3 as written; our low_var_kl is verl's k3" if case == "far" else None)


def verl_configs(cases: Iterable[str]) -> list[Config]:
    cases = list(cases)
    out: list[Config] = []

    def add(group, function, theirs, knobs, compare, by_design=None):
        for case, seed in _cases(cases):
            reason = by_design(case) if callable(by_design) else by_design
            out.append(Config("verl", group, function, theirs, knobs, case, seed, compare, reason))

    clip_ranges = ((0.2, None), (0.2, 0.28))
    # The clipped surrogate under each aggregation: verl's "vanilla" loss with its dual-clip floor out of reach.
    for loss_type, match in (("grpo", "seq-mean-token-mean"), ("bnpo", None), ("dapo", None),
                             ("luspo", "seq-mean-token-sum"), ("dr_grpo", "seq-mean-token-sum-norm")):
        mode, agg = verl.POLICY_LOSSES[loss_type]
        for eps, eps_high in clip_ranges:
            theirs_kwargs = dict(epsilon=eps, epsilon_high=eps_high, clip_ratio_c=HUGE_C)
            ours = _ours_loss(loss_type, epsilon=eps, epsilon_high=eps_high, max_completion_length="T")
            theirs = (lambda agg, kw: lambda b: verl.policy_loss(
                "vanilla", b.logps, b.old_logps, b.advantages, b.mask, loss_agg_mode=agg,
                loss_scale_factor=b.width if agg == "seq-mean-token-sum-norm" else None, **kw))(agg, theirs_kwargs)
            reason = None
            if match:
                reason = (lambda m, lt: lambda case: _empty_rows(lt, m) if case == "empty" else None)(match, loss_type)
            knobs = _knobs(epsilon=eps, epsilon_high=eps_high or eps)
            add("policy_loss", loss_type, f"vanilla + {agg}", knobs, loss_pair(ours, theirs), reason)
            if match and loss_type != "dr_grpo":  # the matching knob: our loss with verl's aggregation
                add("policy_loss", f"{loss_type}(loss_aggregation={match})", f"vanilla + {agg}", knobs,
                    loss_pair(_ours_loss(loss_type, epsilon=eps, epsilon_high=eps_high, loss_aggregation=match), theirs))
    # verl's default dual-clip floor c = 3 against the paper's clip (ours grpo has none; our dual_clip is verl's).
    add("policy_loss", "bnpo", "vanilla (clip_ratio_c=3, default)", "epsilon=0.2",
        loss_pair(_ours_loss("bnpo"), lambda b: verl.policy_loss("vanilla", b.logps, b.old_logps, b.advantages, b.mask,
                                                                 loss_agg_mode="token-mean", clip_ratio_c=3.0)),
        lambda case: ("verl's vanilla loss is dual-clip PPO with c = 3 by default: a negative-advantage token's loss "
                      "is capped at -3A; ours bnpo/grpo is the paper's clip (loss_type dual_clip is verl's)")
        if case == "far" else None)
    for c in (3.0, 10.0):
        for eps, eps_high in clip_ranges:
            add("policy_loss", "dual_clip", "vanilla", _knobs(epsilon=eps, epsilon_high=eps_high or eps, clip_ratio_c=c),
                loss_pair(_ours_loss("dual_clip", epsilon=eps, epsilon_high=eps_high, clip_ratio_c=c),
                          (lambda kw: lambda b: verl.policy_loss("vanilla", b.logps, b.old_logps, b.advantages, b.mask,
                                                                 loss_agg_mode="token-mean", **kw))(
                              dict(epsilon=eps, epsilon_high=eps_high, clip_ratio_c=c))))
    # The other registered losses, each with verl's aggregation for it.
    others = {
        "gmpo": (dict(epsilon=0.4, epsilon_high=0.4), dict(epsilon=0.4, epsilon_high=0.4), "geo_mean", "token-mean"),
        "sapo": (dict(sapo_temperature_pos=1.0, sapo_temperature_neg=1.05), dict(tau_pos=1.0, tau_neg=1.05), "sapo",
                 "seq-mean-token-mean"),
        "dppo_tv": (dict(epsilon=0.2, epsilon_high=0.28, clip_ratio_c=3.0),
                    dict(epsilon=0.2, epsilon_high=0.28, clip_ratio_c=3.0), "dppo_tv", "token-mean"),
        "dppo_kl": (dict(epsilon=0.05, epsilon_high=0.1, clip_ratio_c=3.0),
                    dict(epsilon=0.05, epsilon_high=0.1, clip_ratio_c=3.0), "dppo_kl", "token-mean"),
        "kl_cov": (dict(kl_cov_ratio=0.1, kl_cov_coef=1.0), dict(kl_cov_ratio=0.1, ppo_kl_coef=1.0), "kl_cov",
                   "token-mean"),
        "clip_cov": (dict(clip_cov_ratio=1.0, clip_cov_lb=-1e9, clip_cov_ub=1e9),
                     dict(clip_cov_ratio=1.0, clip_cov_lb=-1e9, clip_cov_ub=1e9), "clip_cov", "token-mean"),
    }
    for loss_type, (ours_kw, theirs_kw, mode, agg) in others.items():
        theirs = (lambda mode, agg, kw: lambda b: verl.policy_loss(mode, b.logps, b.old_logps, b.advantages, b.mask,
                                                                   loss_agg_mode=agg, **kw))(mode, agg, theirs_kw)
        reason = None
        if loss_type == "sapo":  # verl's SAPO always aggregates seq-mean-token-mean
            reason = lambda case: _empty_rows("sapo", "seq-mean-token-mean") if case == "empty" else None  # noqa: E731
            add("policy_loss", "sapo(loss_aggregation=seq-mean-token-mean)", mode, _knobs(**ours_kw),
                loss_pair(_ours_loss(loss_type, loss_aggregation="seq-mean-token-mean", **ours_kw), theirs))
        add("policy_loss", loss_type, mode, _knobs(**ours_kw), loss_pair(_ours_loss(loss_type, **ours_kw), theirs), reason)
    # CISPO: verl clips the stop-gradient weight to [1 - eps, 1 + eps_high]; ours (MiniMax-M1, TRL) caps it at eps_high.
    add("policy_loss", "cispo", "cispo", "epsilon_high=5.0 vs clip_ratio_high=0.28",
        loss_pair(_ours_loss("cispo", epsilon_high=5.0),
                  lambda b: verl.policy_loss("cispo", b.logps, b.old_logps, b.advantages, b.mask, epsilon=0.2,
                                             epsilon_high=0.28)),
        "verl's CISPO clips the IS weight to [1 - eps_low, 1 + eps_high] (two-sided); ours is MiniMax-M1's and TRL's, "
        "min(r, eps_high) with no lower bound; verl with clip_ratio_low=1, clip_ratio_high=eps_high-1 is ours")
    for cap in (5.0, 1.28):
        add("policy_loss", "cispo", "cispo (clip_ratio_low=1.0)", _knobs(epsilon_high=cap),
            loss_pair(_ours_loss("cispo", epsilon_high=cap),
                      (lambda cap: lambda b: verl.policy_loss("cispo", b.logps, b.old_logps, b.advantages, b.mask,
                                                              epsilon=1.0, epsilon_high=cap - 1.0))(cap)))
    # GSPO: our sequence-level ratio (level="sequence") with verl's aggregation.
    for eps, eps_high in ((3e-4, 4e-4), (0.2, None)):
        add("policy_loss", "grpo(level=sequence)", "gspo", _knobs(epsilon=eps, epsilon_high=eps_high or eps),
            loss_pair(_ours_loss("grpo", level="sequence", epsilon=eps, epsilon_high=eps_high,
                                 loss_aggregation="seq-mean-token-mean"),
                      (lambda kw: lambda b: verl.policy_loss("gspo", b.logps, b.old_logps, b.advantages, b.mask,
                                                             loss_agg_mode="seq-mean-token-mean", **kw))(
                          dict(epsilon=eps, epsilon_high=eps_high))))
    # Aggregations: one per-token loss matrix, every verl loss_agg_mode.
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        ours_agg = (lambda agg: lambda b: policy_losses.LOSS_AGGREGATIONS[agg](
            b.logps.exp() * b.advantages.unsqueeze(-1), b.mask, None, None))(agg)
        theirs_agg = (lambda agg: lambda b: verl.agg_loss(b.logps.exp() * b.advantages.unsqueeze(-1), b.mask, agg))(agg)
        add("aggregation", agg, agg, "-", loss_pair(ours_agg, theirs_agg))
    # KL estimators, per token.
    for name, theirs_name in verl.KL.items():
        by_design = _k3_clamp if name in ("k3", "k3+") else None
        add("kl", name, theirs_name, "-",
            loss_pair((lambda n: lambda b: kl.KL_PENALTIES[n](b.logps, b.ref_logps))(name),
                      (lambda n: lambda b: verl.kl_penalty(b.logps, b.ref_logps, n))(theirs_name)), by_design)
    # The actor's loss: policy loss, KL loss and entropy bonus, as verl's ppo_loss composes them.
    for kl_type in ("low_var_kl", "k1", "k2", "k3+"):
        ours = _ours_loss("bnpo", beta=0.04, kl_loss_type=kl_type, entropy_coef=0.01, with_entropies=True)
        theirs = (lambda kt: lambda b: verl.actor_loss("vanilla", b.logps, b.old_logps, b.advantages, b.mask,
                                                       loss_agg_mode="token-mean", ref_logps=b.ref_logps,
                                                       kl_loss_coef=0.04, kl_loss_type=kt, entropies=b.entropies,
                                                       entropy_coeff=0.01, clip_ratio_c=HUGE_C))(kl_type)
        add("actor_loss", "bnpo + beta*KL - entropy", f"ppo_loss (vanilla, {kl_type})",
            _knobs(beta=0.04, kl_loss_type=kl_type, entropy_coef=0.01), loss_pair(ours, theirs),
            _k3_clamp if kl_type == "k3+" else None)
    add("actor_loss", "grpo + beta*KL - entropy", "ppo_loss (vanilla, seq-mean-token-mean)",
        "beta=0.04, kl_loss_type=low_var_kl, entropy_coef=0.01",
        loss_pair(_ours_loss("grpo", beta=0.04, kl_loss_type="low_var_kl", entropy_coef=0.01, with_entropies=True,
                             loss_aggregation="seq-mean-token-mean"),
                  lambda b: verl.actor_loss("vanilla", b.logps, b.old_logps, b.advantages, b.mask,
                                            loss_agg_mode="seq-mean-token-mean", ref_logps=b.ref_logps, kl_loss_coef=0.04,
                                            kl_loss_type="low_var_kl", entropies=b.entropies, entropy_coeff=0.01,
                                            clip_ratio_c=HUGE_C)),
        "verl aggregates the entropy bonus with the actor's loss_agg_mode; ours (TRL, OpenRLHF) takes the token mean "
        "whatever the aggregation; the two meet under token-mean (the rows above)")
    # Advantage estimators.
    for name, kwargs in (("grpo", dict(scale="group")), ("grpo", dict(scale="none")), ("rloo", {}), ("remax", {}),
                         ("gpg", {}), ("opo", {}), ("grpo_passk", dict(scale="group")),
                         ("grpo_passk", dict(scale="none")), ("optimal_token_baseline", {}),
                         ("reinforce_plus_plus", {}), ("reinforce_plus_plus_baseline", {})):
        norm = kwargs.get("scale", "group") != "none"
        ours = (lambda n, kw: lambda b: estimators.advantage_estimator(n)(
            b.rewards, group_size=b.group_size, lengths=b.lengths, baseline_rewards=b.baseline_rewards, mask=b.mask,
            old_logps=b.old_logps, sum_pi_squared=b.sum_pi_squared, **kw))(name, kwargs)
        theirs = (lambda n, norm: lambda b: verl.advantages(
            n, b.rewards, b.mask, b.group_size, norm_adv_by_std_in_grpo=norm, baseline_rewards=b.baseline_rewards,
            old_logps=b.old_logps, sum_pi_squared=b.sum_pi_squared)[0])(name, norm)
        by_design = None
        if name == "grpo" and norm:
            by_design = ("verl divides by std + 1e-6; ours by std + 1e-4 (TRL's); group_advantages(eps=1e-6) is verl's "
                         "(next row)")
        elif name in ("reinforce_plus_plus", "reinforce_plus_plus_baseline"):
            by_design = ("verl whitens REINFORCE++ returns with the unbiased token variance (masked_whiten); ours "
                         "follows OpenRLHF, the paper's code: biased variance, clamped at 1e-8; with masked_whiten ours "
                         "is verl's (next row)")
        add("estimator", name, name, _knobs(**kwargs), value_pair(ours, theirs), by_design)
    add("estimator", "group_advantages(eps=1e-6)", "grpo", "scale=group",
        value_pair(lambda b: losses.group_advantages(b.rewards, b.group_size, "group", eps=1e-6),
                   lambda b: verl.advantages("grpo", b.rewards, b.mask, b.group_size)[0]))
    for name, baseline in (("reinforce_plus_plus", False), ("reinforce_plus_plus_baseline", True)):
        add("estimator", f"{name} (cumulative_returns + masked_whiten)", name, "-",
            value_pair((lambda baseline: lambda b: _rpp_unbiased(b, baseline))(baseline),
                       (lambda n: lambda b: verl.advantages(n, b.rewards, b.mask, b.group_size)[0])(name)))
    # PPO: GAE with verl's whitening, the whitening, the value loss and the policy loss.
    for gamma, lam in ((1.0, 0.95), (0.99, 0.95), (1.0, 1.0)):
        add("gae", "gae + masked_whiten", "compute_gae_advantage_return", _knobs(gamma=gamma, lam=lam),
            value_pair((lambda g, l: lambda b: losses.masked_whiten(losses.gae(_token_rewards(b), b.old_values, b.mask, g, l)[0], b.mask))(gamma, lam),
                       (lambda g, l: lambda b: verl.gae(_token_rewards(b), b.old_values, b.mask, g, l)[0])(gamma, lam)))
        add("gae", "gae (returns)", "compute_gae_advantage_return", _knobs(gamma=gamma, lam=lam),
            value_pair((lambda g, l: lambda b: losses.gae(_token_rewards(b), b.old_values, b.mask, g, l)[1])(gamma, lam),
                       (lambda g, l: lambda b: verl.gae(_token_rewards(b), b.old_values, b.mask, g, l)[1])(gamma, lam)))
    for coef in (0.05, 0.2):
        add("kl_in_reward", "kl_penalised_rewards", "compute_rewards (k1)", _knobs(kl_coef=coef),
            value_pair((lambda c: lambda b: losses.kl_penalised_rewards(b.rewards, kl.kl_k1(b.old_logps, b.ref_logps),
                                                                       b.mask, c))(coef),
                       (lambda c: lambda b: verl.core().compute_rewards(verl.outcome_rewards(b.rewards, b.mask),
                                                                        b.old_logps, b.ref_logps, c))(coef)))
    add("whitening", "masked_whiten", "verl.utils.torch_functional.masked_whiten", "-",
        value_pair(lambda b: losses.masked_whiten(b.returns, b.mask), lambda b: verl.masked_whiten(b.returns, b.mask)))
    for clip in (0.2, 0.5):
        add("value_loss", "ppo_value_loss", "compute_value_loss", _knobs(value_clip=clip),
            loss_pair((lambda c: lambda b: losses.ppo_value_loss(b.values, b.old_values, b.returns, b.mask, c))(clip),
                      (lambda c: lambda b: verl.value_loss(b.values, b.old_values, b.returns, b.mask, c))(clip),
                      wrt="values"))
    for eps, eps_high in clip_ranges:
        add("ppo_policy_loss", "ppo_policy_loss", "vanilla (clip_ratio_c=1e12)", _knobs(epsilon=eps, epsilon_high=eps_high or eps),
            loss_pair((lambda e, eh: lambda b: losses.ppo_policy_loss(b.logps, b.old_logps, _token_adv(b), b.mask, e, eh))(eps, eps_high),
                      (lambda e, eh: lambda b: verl.policy_loss("vanilla", b.logps, b.old_logps, _token_adv(b), b.mask,
                                                                epsilon=e, epsilon_high=eh, clip_ratio_c=HUGE_C))(eps, eps_high)))
    return out


def _token_rewards(b: Batch) -> torch.Tensor:
    """PPO's token rewards: -0.05 k1 on every active token, the reward on the last one (algorithms/ppo.py)."""
    return losses.kl_penalised_rewards(b.rewards, kl.kl_k1(b.old_logps, b.ref_logps), b.mask, 0.05)


def _token_adv(b: Batch) -> torch.Tensor:
    """Per-token advantages for PPO's loss: the batch's advantages varied along the completion."""
    return (b.advantages.unsqueeze(-1) + 0.5 * torch.sin(torch.arange(b.width, dtype=DTYPE))) * b.mask


def _rpp_unbiased(b: Batch, baseline: bool) -> torch.Tensor:
    scores = b.rewards
    if baseline:
        grouped = scores.view(-1, b.group_size)
        scores = (grouped - grouped.mean(1, keepdim=True)).masked_fill(losses.tied_rows(grouped), 0.0).reshape(-1)
    rewards = losses.kl_penalised_rewards(scores, torch.zeros_like(b.mask), b.mask, 0.0)
    return losses.masked_whiten(losses.cumulative_returns(rewards, b.mask), b.mask)


# --------------------------------------------------------------------------------------------
# OpenRLHF 0.11.2
# --------------------------------------------------------------------------------------------


def openrlhf_configs(cases: Iterable[str]) -> list[Config]:
    cases = list(cases)
    out: list[Config] = []

    def add(group, function, theirs, knobs, compare, by_design=None):
        for case, seed in _cases(cases):
            reason = by_design(case) if callable(by_design) else by_design
            out.append(Config("openrlhf", group, function, theirs, knobs, case, seed, compare, reason))

    def far_clamp(what):
        return lambda case: (f"OpenRLHF clamps {what}; ours does not" if case == "far" else None)

    for eps, eps_high in ((0.2, None), (0.2, 0.28)):
        kw = dict(epsilon=eps, epsilon_high=eps_high)
        knobs = _knobs(epsilon=eps, epsilon_high=eps_high or eps)
        add("policy_loss", "bnpo", "PolicyLoss(ppo, token_level_loss=True)", knobs,
            loss_pair(_ours_loss("bnpo", **kw), (lambda kw: lambda b: openrlhf.policy_loss(
                b.logps, b.old_logps, b.advantages, b.mask, **kw))(kw)))
        add("policy_loss", "grpo(loss_aggregation=seq-mean-token-mean)", "PolicyLoss(ppo, token_level_loss=False)", knobs,
            loss_pair(_ours_loss("grpo", loss_aggregation="seq-mean-token-mean", **kw),
                      (lambda kw: lambda b: openrlhf.policy_loss(b.logps, b.old_logps, b.advantages, b.mask,
                                                                 token_level_loss=False, **kw))(kw)))
        add("policy_loss", "grpo", "PolicyLoss(ppo, token_level_loss=False)", knobs,
            loss_pair(_ours_loss("grpo", **kw),
                      (lambda kw: lambda b: openrlhf.policy_loss(b.logps, b.old_logps, b.advantages, b.mask,
                                                                 token_level_loss=False, **kw))(kw)),
            lambda case: ("OpenRLHF's per-sample mean leaves all-masked rows out; ours grpo (1/G) counts them as "
                          "zeros; with loss_aggregation=seq-mean-token-mean ours drops them too (row above)")
            if case == "empty" else None)
        for c in (3.0, 10.0):
            add("policy_loss", "dual_clip", "PolicyLoss(ppo, dual_clip)", f"{knobs}, clip_ratio_c={c}",
                loss_pair(_ours_loss("dual_clip", clip_ratio_c=c, **kw),
                          (lambda kw, c: lambda b: openrlhf.policy_loss(b.logps, b.old_logps, b.advantages, b.mask,
                                                                        dual_clip=c, **kw))(kw, c)))
    for eps, eps_high in ((0.2, None), (0.2, 0.28)):
        add("ppo_policy_loss", "ppo_policy_loss", "PolicyLoss(ppo)", _knobs(epsilon=eps, epsilon_high=eps_high or eps),
            loss_pair((lambda e, eh: lambda b: losses.ppo_policy_loss(b.logps, b.old_logps, _token_adv(b), b.mask, e, eh))(eps, eps_high),
                      (lambda e, eh: lambda b: openrlhf.policy_loss(b.logps, b.old_logps, _token_adv(b), b.mask,
                                                                    epsilon=e, epsilon_high=eh))(eps, eps_high)))
    for eps in (3e-4, 0.2):
        add("policy_loss", "grpo(level=sequence)", "PolicyLoss(gspo)", _knobs(epsilon=eps),
            loss_pair(_ours_loss("grpo", level="sequence", epsilon=eps, loss_aggregation="seq-mean-token-mean"),
                      (lambda e: lambda b: openrlhf.policy_loss(b.logps, b.old_logps, b.advantages, b.mask, epsilon=e,
                                                                policy_loss_type="gspo"))(eps)))
    # KL: the suite's OpenRLHF estimator (approx_kl) and its KL_PENALTIES names.
    for est in ("k1", "k2", "k3"):
        add("kl", f"approx_kl({est})", f"compute_approx_kl({est})", "-",
            loss_pair((lambda e: lambda b: kl.approx_kl(b.logps, b.ref_logps, e))(est),
                      (lambda e: lambda b: openrlhf.approx_kl(b.logps, b.ref_logps, e))(est)))
        add("kl", est, f"compute_approx_kl({est})", "-",
            loss_pair((lambda e: lambda b: kl.KL_PENALTIES[e](b.logps, b.ref_logps))(est),
                      (lambda e: lambda b: openrlhf.approx_kl(b.logps, b.ref_logps, e))(est)),
            None if est == "k1" else far_clamp("every KL estimate to [-10, 10] (approx_kl is OpenRLHF's)"))
        add("kl", f"{est}+", f"compute_approx_kl({est}, unbiased_gradient=True)", "-",
            loss_pair((lambda e: lambda b: kl.KL_PENALTIES[f"{e}+"](b.logps, b.ref_logps))(est),
                      (lambda e: lambda b: openrlhf.approx_kl(b.logps, b.ref_logps, e, unbiased_gradient=True))(est)),
            None if est == "k1" else far_clamp("every KL estimate to [-10, 10]"))
    for clip in (0.2, None):
        add("value_loss", "ppo_value_loss", "ValueLoss", _knobs(value_clip=clip),
            loss_pair((lambda c: lambda b: losses.ppo_value_loss(b.values, b.old_values, b.returns, b.mask,
                                                                 1e12 if c is None else c))(clip),
                      (lambda c: lambda b: openrlhf.value_loss(b.values, b.old_values, b.returns, b.mask, c))(clip),
                      wrt="values"))
    # Advantages: the experience maker's reward shaping, returns and whitening.
    kl_of = lambda b: kl.approx_kl(b.old_logps, b.ref_logps, "k1")  # noqa: E731
    for coef, clip in ((0.05, (-10.0, 10.0)), (0.2, (-0.5, 0.5)), (0.05, None)):
        add("kl_in_reward", "kl_penalised_rewards", "compute_reward", _knobs(kl_coef=coef, reward_clip=clip),
            value_pair((lambda c, r: lambda b: losses.kl_penalised_rewards(
                b.rewards, kl_of(b), b.mask, c, *(r or (None, None))))(coef, clip),
                (lambda c, r: lambda b: openrlhf.compute_reward(b.rewards, c, kl_of(b), b.mask, r))(coef, clip)))
    for kl_coef in (0.0, 0.05):
        for name, theirs_name, baseline in (("reinforce_plus_plus", "reinforce", False),
                                            ("reinforce_plus_plus_baseline", "reinforce_baseline", True)):
            add("estimator", f"reinforce_pp_advantages(group_baseline={baseline})", theirs_name, _knobs(kl_coef=kl_coef),
                value_pair((lambda bl, kc: lambda b: losses.reinforce_pp_advantages(
                    b.rewards, kl_of(b), b.mask, kl_coef=kc, group_size=b.group_size, group_baseline=bl)[0])(baseline, kl_coef),
                    (lambda n, kc: lambda b: openrlhf.advantages(n, b.rewards, b.mask, b.group_size, kl=kl_of(b),
                                                                 kl_coef=kc)[0])(theirs_name, kl_coef)))
    for name, theirs_name in (("reinforce_plus_plus", "reinforce"), ("reinforce_plus_plus_baseline", "reinforce_baseline"),
                              ("rloo", "rloo")):
        add("estimator", name, theirs_name, "-",
            value_pair((lambda n: lambda b: estimators.advantage_estimator(n)(
                b.rewards, group_size=b.group_size, lengths=b.lengths))(name),
                (lambda n: lambda b: openrlhf.advantages(n, b.rewards, b.mask, b.group_size)[0])(theirs_name)))
    add("estimator", "grpo", "group_norm", "scale=group",
        value_pair(lambda b: estimators.advantage_estimator("grpo")(b.rewards, group_size=b.group_size),
                   lambda b: openrlhf.advantages("group_norm", b.rewards, b.mask, b.group_size)[0]),
        "OpenRLHF's group_norm divides by std + 1e-9; ours by std + 1e-4 (TRL's); group_advantages(eps=1e-9) is "
        "OpenRLHF's (next row)")
    add("estimator", "group_advantages(eps=1e-9)", "group_norm", "scale=group",
        value_pair(lambda b: losses.group_advantages(b.rewards, b.group_size, "group", eps=1e-9),
                   lambda b: openrlhf.advantages("group_norm", b.rewards, b.mask, b.group_size)[0]))
    add("estimator", "grpo", "dr_grpo", "scale=none",
        value_pair(lambda b: estimators.advantage_estimator("grpo")(b.rewards, group_size=b.group_size, scale="none"),
                   lambda b: openrlhf.advantages("dr_grpo", b.rewards, b.mask, b.group_size)[0]))
    for gamma, lam in ((1.0, 0.95), (0.99, 0.9)):
        ours_rewards = lambda b: losses.kl_penalised_rewards(b.rewards, kl_of(b), b.mask, 0.05, -10.0, 10.0)  # noqa: E731
        theirs = (lambda g, l: lambda b: openrlhf.advantages("gae", b.rewards, b.mask, b.group_size, kl=kl_of(b),
                                                             kl_coef=0.05, values=b.old_values, gamma=g, lambd=l))(gamma, lam)
        add("gae", "gae + batch_whiten", "gae", _knobs(gamma=gamma, lam=lam),
            value_pair((lambda g, l: lambda b: losses.batch_whiten(
                losses.gae(ours_rewards(b), b.old_values, b.mask, g, l)[0], b.mask))(gamma, lam),
                (lambda th: lambda b: th(b)[0])(theirs)))
        add("gae", "gae + masked_whiten", "gae", _knobs(gamma=gamma, lam=lam),
            value_pair((lambda g, l: lambda b: losses.masked_whiten(
                losses.gae(ours_rewards(b), b.old_values, b.mask, g, l)[0], b.mask))(gamma, lam),
                (lambda th: lambda b: th(b)[0])(theirs)),
            "OpenRLHF whitens GAE advantages with the biased token variance (clamped at 1e-8); PPO here uses the "
            "unbiased one, TRL's and verl's; batch_whiten is OpenRLHF's (row above)")
        add("gae", "gae (returns)", "gae", _knobs(gamma=gamma, lam=lam),
            value_pair((lambda g, l: lambda b: losses.gae(ours_rewards(b), b.old_values, b.mask, g, l)[1])(gamma, lam),
                       (lambda th: lambda b: th(b)[1])(theirs)))
    return out


# --------------------------------------------------------------------------------------------
# TRL 1.12.0's PPO
# --------------------------------------------------------------------------------------------

TRL_LAYOUT = ("TRL 1.12 puts the score on the token after the last one (sequence_lengths_p1), where the critic also "
              "predicts and the value loss also counts, unless the completion fills the width; ours on the last "
              "active token (verl, OpenRLHF). Ours on TRL's layout agrees (the row beside it)")


def _trl_p1(b: Batch) -> torch.Tensor:
    """TRL's value mask: one token past each completion's end (0 past the width)."""
    lengths = (b.lengths + 1).clamp(max=b.width)
    return (torch.arange(b.width).unsqueeze(0) < lengths.unsqueeze(1)).to(DTYPE)


def _ours_on_trl_layout(b: Batch, gamma: float, lam: float, estimator: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Our gae on TRL's layout: the score one past the end (on the last token when the completion fills the width),
    the KL on active tokens, values kept on the extra token; whitened over the active tokens."""
    p1 = _trl_p1(b)
    kl_tokens = kl.KL_PENALTIES[estimator](b.old_logps, b.ref_logps)
    rewards = losses.kl_penalised_rewards(torch.zeros_like(b.rewards), kl_tokens, b.mask, 0.05)  # the KL part only
    last = (p1.sum(-1).long() - 1).clamp(min=0)
    rewards = rewards + torch.zeros_like(rewards).scatter(1, last.unsqueeze(1), b.rewards.unsqueeze(1))
    advantages, returns = losses.gae(rewards, b.old_values, p1, gamma, lam)
    return losses.masked_whiten(advantages, b.mask), returns


def trl_ppo_configs(cases: Iterable[str]) -> list[Config]:
    cases = list(cases)
    out: list[Config] = []

    def add(group, function, theirs, knobs, compare, by_design=None):
        for case, seed in _cases(cases):
            reason = by_design(case) if callable(by_design) else by_design
            out.append(Config("trl-ppo", group, function, theirs, knobs, case, seed, compare, reason))

    def theirs_gae(g, l, est):
        return lambda b: trl_ppo.advantages(b.rewards, b.old_logps, b.ref_logps, b.old_values, b.mask, gamma=g, lam=l,
                                            kl_coef=0.05, kl_estimator=est)

    for gamma, lam in ((1.0, 0.95), (0.99, 0.95)):
        for est in ("k1", "k3"):
            knobs = _knobs(gamma=gamma, lam=lam, kl_estimator=est)
            kl_fn = (lambda e: lambda lp, ref: kl.KL_PENALTIES[e](lp, ref))(est)
            ours_rewards = (lambda kf: lambda b: losses.kl_penalised_rewards(
                b.rewards, kf(b.old_logps, b.ref_logps), b.mask, 0.05))(kl_fn)
            add("gae", "gae + masked_whiten", "PPOTrainer.train steps 4-6", knobs,
                value_pair((lambda g, l, r: lambda b: losses.masked_whiten(
                    losses.gae(r(b), b.old_values, b.mask, g, l)[0], b.mask))(gamma, lam, ours_rewards),
                    (lambda th: lambda b: th(b)["advantages"])(theirs_gae(gamma, lam, est))),
                TRL_LAYOUT)
            add("gae", "gae + masked_whiten (TRL's layout)", "PPOTrainer.train steps 4-6", knobs,
                value_pair((lambda g, l, e: lambda b: _ours_on_trl_layout(b, g, l, e)[0])(gamma, lam, est),
                           (lambda th: lambda b: th(b)["advantages"])(theirs_gae(gamma, lam, est))))
            add("gae", "gae returns (TRL's layout)", "PPOTrainer.train steps 4-6", knobs,
                value_pair((lambda g, l, e: lambda b: _ours_on_trl_layout(b, g, l, e)[1])(gamma, lam, est),
                           (lambda th: lambda b: th(b)["returns"])(theirs_gae(gamma, lam, est))))
        add("kl", "k1" if gamma == 1.0 else "k3", "PPOTrainer.train step 4 (kl)", "-",
            value_pair((lambda e: lambda b: kl.KL_PENALTIES[e](b.old_logps, b.ref_logps))(
                "k1" if gamma == 1.0 else "k3"),
                (lambda e: lambda b: trl_ppo.advantages(b.rewards, b.old_logps, b.ref_logps, b.old_values, b.mask,
                                                        kl_estimator=e)["kl"])("k1" if gamma == 1.0 else "k3")))
    add("whitening", "masked_whiten", "masked_whiten", "-",
        value_pair(lambda b: losses.masked_whiten(b.returns, b.mask),
                   lambda b: trl_ppo.masked_whiten(b.returns, b.mask.bool())))
    for clip in (0.2, 0.05):
        def losses_of(b, c=clip):
            return trl_ppo.losses(b.logps, b.old_logps, _token_adv(b), b.values, b.old_values, b.returns, b.mask,
                                  cliprange=c, cliprange_value=c)

        add("ppo_policy_loss", "ppo_policy_loss", "PPOTrainer.train pg_loss", _knobs(epsilon=clip),
            loss_pair((lambda c: lambda b: losses.ppo_policy_loss(b.logps, b.old_logps, _token_adv(b), b.mask, c))(clip),
                      (lambda f: lambda b: f(b)["pg_loss"])(losses_of)))
        add("value_loss", "ppo_value_loss", "PPOTrainer.train vf_loss", _knobs(value_clip=clip),
            loss_pair((lambda c: lambda b: losses.ppo_value_loss(b.values, b.old_values, b.returns, b.mask, c))(clip),
                      (lambda f: lambda b: f(b)["vf_loss"])(losses_of), wrt="values"),
            "TRL's value loss also counts the token after each completion (padding_mask_p1), where it puts the score; "
            "ours counts the completion's tokens; on TRL's mask ours agrees (next row)")
        add("value_loss", "ppo_value_loss (TRL's value mask)", "PPOTrainer.train vf_loss", _knobs(value_clip=clip),
            loss_pair((lambda c: lambda b: losses.ppo_value_loss(b.values * _trl_p1(b), b.old_values * _trl_p1(b),
                                                                 b.returns, _trl_p1(b), c))(clip),
                      (lambda f: lambda b: f(b)["vf_loss"])(losses_of), wrt="values"))
    return out


CONFIG_BUILDERS = {"verl": verl_configs, "openrlhf": openrlhf_configs, "trl-ppo": trl_ppo_configs}


def all_configs(frameworks: Iterable[str] = FRAMEWORKS, cases: Iterable[str] = tuple(CASES)) -> list[Config]:
    cases = list(cases)
    return [c for fw in frameworks for c in CONFIG_BUILDERS[fw](cases)]


def run_configs(configs: list[Config]) -> list[Row]:
    batches: dict[tuple[str, int], Batch] = {}
    rows = []
    for config in configs:
        key = (config.case, config.seed)
        if key not in batches:
            batches[key] = make_batch(*key)
        rows.append(run_config(config, batches[key]))
    return rows


# --------------------------------------------------------------------------------------------
# Planted errors: our functions perturbed in place for one re-run; each must make an agreeing row fail
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _patched(target, name: str, value, *, item: bool = False):
    """``target.name = value`` (``target[name]`` with ``item``) for the block, then the original back."""
    old = target[name] if item else getattr(target, name)
    if item:
        target[name] = value
    else:
        setattr(target, name, value)
    try:
        yield
    finally:
        if item:
            target[name] = old
        else:
            setattr(target, name, old)


def _plant_clip_sign(self, x):
    clipped = torch.clamp(x.ratio, 1 - x.epsilon, 1 + x.epsilon_high)
    return -torch.max(x.ratio * x.adv, clipped * x.adv)  # max instead of min: the pessimistic bound turned optimistic


def _plant_clip_range(self, x):
    clipped = torch.clamp(x.ratio, 1 - x.epsilon_high, 1 + x.epsilon)  # the two clip bounds swapped
    return -torch.min(x.ratio * x.adv, clipped * x.adv)


def _plant_gae_off_by_one(rewards, values, mask, gamma=1.0, lam=0.95):
    shifted = torch.cat([values[:, 1:], torch.zeros_like(values[:, :1])], 1)  # V(s_{t+1}) read at t+2
    return _REAL["gae"](rewards, shifted * mask, mask, gamma, lam)


def _plant_whiten_biased(values, mask, eps=1e-8):
    mask = mask.to(values.dtype)
    n = mask.sum()
    mean = (values * mask).sum() / n
    var = (((values - mean) ** 2) * mask).sum() / n  # biased: n, not n - 1
    return (values - mean) * torch.rsqrt(var + eps) * mask


def _plant_k3_reversed(logps, ref_logps):
    delta = logps - ref_logps  # KL[pi_ref || pi]'s estimator, not KL[pi || pi_ref]'s
    return torch.exp(delta) - delta - 1


def _plant_value_unclipped(values, old_values, returns, mask, clip=0.2, num_tokens=None):
    return _REAL["ppo_value_loss"](values, old_values, returns, mask, 1e12, num_tokens)


def _plant_token_mean_padding(per_token, mask, max_len, n_items):
    return (per_token * mask).sum() / mask.numel()  # padding counted in the mean


def _plant_group_std_biased(rewards, group_size, scale="group", eps=1e-4):
    grouped = rewards.view(-1, group_size)
    centred = (grouped - grouped.mean(1, keepdim=True)).masked_fill(losses.tied_rows(grouped), 0.0)
    if scale == "none":
        return centred.view(-1)
    return (centred / (grouped.std(1, unbiased=False, keepdim=True) + eps)).view(-1)


def _plant_rloo_self(rewards, *, group_size, **_):
    grouped = rewards.view(-1, group_size)
    return (grouped - grouped.mean(1, keepdim=True)).view(-1)  # the baseline includes the completion itself


def _plant_ppo_unclipped(logps, old_logps, advantages, mask, epsilon=0.2, epsilon_high=None, num_tokens=None):
    return _REAL["ppo_policy_loss"](logps, old_logps, advantages, mask, 1e12, 1e12, num_tokens)  # no trust region


def _plant_kl_reward_sign(scores, kl, mask, kl_coef, clip_min=None, clip_max=None):
    return _REAL["kl_penalised_rewards"](scores, -kl, mask, kl_coef, clip_min, clip_max)  # the KL rewarded, not paid


_REAL = {"gae": losses.gae, "ppo_value_loss": losses.ppo_value_loss, "ppo_policy_loss": losses.ppo_policy_loss,
         "kl_penalised_rewards": losses.kl_penalised_rewards}


@dataclass(frozen=True)
class Plant:
    name: str
    what: str
    groups: tuple[str, ...]  # the config groups re-run under it
    patch: Callable[[], contextlib.AbstractContextManager]


def _multi(*managers):
    @contextlib.contextmanager
    def both():
        with contextlib.ExitStack() as stack:
            for m in managers:
                stack.enter_context(m())
            yield
    return both


PLANTS = (
    Plant("clip-sign", "the clipped surrogate takes max(r A, clip(r) A) instead of min", ("policy_loss", "actor_loss"),
          lambda: _patched(policy_losses.GRPOClip, "objective", _plant_clip_sign)),
    Plant("clip-bounds-swapped", "clip(r, 1 - eps_high, 1 + eps): the two bounds swapped (seen only when they differ)",
          ("policy_loss",), lambda: _patched(policy_losses.GRPOClip, "objective", _plant_clip_range)),
    Plant("gae-off-by-one", "GAE bootstraps from V(s_{t+2}) instead of V(s_{t+1})", ("gae",),
          lambda: _patched(losses, "gae", _plant_gae_off_by_one)),
    Plant("whiten-biased-std", "masked_whiten divides by the biased variance (n, not n - 1)", ("gae", "whitening", "estimator"),
          lambda: _patched(losses, "masked_whiten", _plant_whiten_biased)),
    Plant("k3-reversed", "k3 estimates KL[pi_ref || pi] (the log-ratio's sign flipped)", ("kl", "actor_loss"),
          lambda: _patched(kl.KL_PENALTIES, "k3", _plant_k3_reversed, item=True)),
    Plant("ppo-clip-dropped", "PPO's policy loss without its clip (the plain importance-weighted surrogate)",
          ("ppo_policy_loss",), lambda: _patched(losses, "ppo_policy_loss", _plant_ppo_unclipped)),
    Plant("kl-penalty-sign", "the KL penalty in the token rewards added instead of subtracted",
          ("kl_in_reward", "gae", "estimator"), lambda: _patched(losses, "kl_penalised_rewards", _plant_kl_reward_sign)),
    Plant("value-clip-dropped", "the value loss forgets the clipped term", ("value_loss",),
          lambda: _patched(losses, "ppo_value_loss", _plant_value_unclipped)),
    Plant("token-mean-counts-padding", "token-mean divides by every position, padding included", ("aggregation", "policy_loss", "actor_loss"),
          _multi(lambda: _patched(policy_losses.LOSS_AGGREGATIONS, "token-mean", _plant_token_mean_padding, item=True),
                 lambda: _patched(policy_losses.LOSS_AGGREGATIONS, "bnpo", _plant_token_mean_padding, item=True))),
    Plant("group-std-biased", "group advantages divide by the biased group std", ("estimator",),
          _multi(lambda: _patched(losses, "group_advantages", _plant_group_std_biased),
                 lambda: _patched(estimators, "group_advantages", _plant_group_std_biased))),
    Plant("rloo-includes-self", "RLOO's baseline is the group mean, the completion itself included", ("estimator",),
          lambda: _patched(estimators.ADVANTAGE_ESTIMATORS, "rloo", _plant_rloo_self, item=True)),
)


@dataclass
class PlantResult:
    name: str
    what: str
    rows: int  # agreeing rows re-run
    failed: int  # of those, rows that failed under the plant
    example: str  # one failed row

    @property
    def caught(self) -> bool:
        return self.failed > 0

    @property
    def missed(self) -> bool:
        """Re-run rows all agreed (a plant whose functions no chosen framework or case compares is not missed)."""
        return self.rows > 0 and self.failed == 0

    @property
    def verdict(self) -> str:
        return "yes" if self.caught else "NO" if self.missed else "not exercised (no rows)"


def run_plant(plant: Plant, configs: list[Config], baseline: Optional[list[Row]] = None) -> PlantResult:
    """Re-run under ``plant`` the configurations of its groups that must agree (and, given the unplanted
    ``baseline`` rows, do): the plant is caught when one of them fails."""
    agreeing = None if baseline is None else {id(c) for c, r in zip(configs, baseline) if r.status == "agrees"}
    chosen = [c for c in configs if c.by_design is None and c.group in plant.groups
              and (agreeing is None or id(c) in agreeing)]
    with plant.patch():
        rows = run_configs(chosen)
    failed = [(c, r) for c, r in zip(chosen, rows) if r.status == "FAILS"]
    example = ""
    if failed:
        c, r = max(failed, key=lambda cr: cr[1].value_diff if math.isfinite(cr[1].value_diff) else 1e300)
        example = f"{c.framework} {c.function} [{c.knobs}] on {c.case}: value diff {_fmt(r.value_diff)}"
    return PlantResult(plant.name, plant.what, len(chosen), len(failed), example)


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def _fmt(x: Optional[float]) -> str:
    if x is None:
        return "-"
    if not math.isfinite(x):
        return "inf"
    return "0" if x == 0 else f"{x:.1e}"


def group_table(rows: list[Row]) -> str:
    keyed: dict[tuple, list[Row]] = {}
    for r in rows:
        keyed.setdefault((r.framework, r.group, r.function, r.theirs), []).append(r)
    table = []
    for (fw, group, fn, theirs), rs in keyed.items():
        agreeing = [r for r in rs if r.expected == "agree"]
        design = [r for r in rs if r.expected != "agree"]
        status = ("FAILS" if any(r.status == "FAILS" for r in rs)
                  else "differs by design" if any(r.status == "differs by design" for r in rs) else "agrees")
        table.append([fw, group, fn, theirs, len(rs), len({r.knobs for r in rs}), len({r.case for r in rs}),
                      _fmt(max((r.value_diff for r in agreeing), default=None)),
                      _fmt(max((r.grad_diff for r in agreeing if r.grad_diff is not None), default=None)),
                      len([r for r in design if r.status == "differs by design"]), status])
    return markdown_table(["framework", "group", "ours", "theirs", "configs", "knob sets", "cases",
                           "max value diff (agreeing rows)", "max grad diff", "differs-by-design rows", "status"], table)


def design_table(rows: list[Row]) -> str:
    keyed: dict[tuple, list[Row]] = {}
    for r in rows:
        if r.expected != "agree":
            keyed.setdefault((r.framework, r.function, r.theirs, r.reason), []).append(r)
    table = [[fw, fn, theirs, ", ".join(sorted({r.case for r in rs if r.status == "differs by design"})) or "(none here)",
              _fmt(max(r.value_diff for r in rs)), reason] for (fw, fn, theirs, reason), rs in keyed.items()]
    return markdown_table(["framework", "ours", "theirs", "cases where it shows", "max value diff", "why"], table)


def report(rows: list[Row], plants: list[PlantResult], seconds: float, command: str) -> str:
    failing = [r for r in rows if r.status == "FAILS"]
    design = [r for r in rows if r.status == "differs by design"]
    caught = [p for p in plants if p.caught]
    agreeing = [r for r in rows if r.status == "agrees"]
    per_fw = {fw: len([r for r in rows if r.framework == fw]) for fw in dict.fromkeys(r.framework for r in rows)}
    verdict = ("every compared function agrees" if not failing else f"{len(failing)} configuration(s) FAIL")
    worst_value = max((r.value_diff for r in agreeing), default=0.0)
    worst_grad = max((r.grad_diff for r in agreeing if r.grad_diff is not None), default=0.0)
    lines = [
        "# Reference check: estimators and losses against verl, OpenRLHF and TRL 1.12's PPO", "",
        f"**{len(rows)} configurations: {verdict} (over the {len(agreeing)} agreeing rows max value diff "
        f"{_fmt(worst_value)}, max gradient diff {_fmt(worst_grad)}, tolerance {TOL:g} x max(1, |theirs|)); "
        f"{len(design)} rows differ by design; "
        f"{len(caught)}/{len([p for p in plants if p.rows])} planted errors caught.**", "",
        "Versions: " + ", ".join(f"{install.PINNED[fw].label}" for fw in per_fw) + f"; torch {torch.__version__}. "
        f"Written by `{command}` in {seconds:.0f} s; every row is in [references.csv](references.csv).", "",
        "Configurations per framework: " + ", ".join(f"{fw} {n}" for fw, n in per_fw.items()) + ". Cases: "
        + ", ".join(f"{case} (B={b}, T={t}, G={g}{', seeds ' + str(len(SEEDS[case])) if case in SEEDS else ''})"
                    for case, (b, t, g, _) in CASES.items()) + ".", "",
        "Tensors are float64. A value diff is the largest absolute difference of the loss (of the advantages on active "
        "tokens for an estimator), a gradient diff that of the gradient with respect to the log-probs (the values, for "
        "a value loss). OpenRLHF computes its KL and its whitening statistics in float32, hence its differences of up to "
        "~1e-6; verl and OpenRLHF divide a sequence's sum by |o_i| + 1e-8, hence their ~1e-9.",
        "", "## Per function", "", group_table(rows), "",
        "## Where the frameworks differ by design", "",
        "Each row below is paired with a row of ours with the matching knob that agrees (the table above).", "",
        design_table(rows), "",
        "## Planted errors", "",
        "Each planted error replaces one of our functions for a re-run of the agreeing rows it touches "
        "(`grpo-bench check references --plant NAME` runs one and exits 1 when it is caught).", "",
        markdown_table(["planted error", "what", "rows re-run", "rows failing", "caught", "e.g."],
                       [[p.name, p.what, p.rows, p.failed, p.verdict, p.example] for p in plants]),
    ]
    if failing:
        lines += ["", "## Failing rows", "", markdown_table(
            ["framework", "ours", "theirs", "knobs", "case", "value diff", "grad diff", "error"],
            [[r.framework, r.function, r.theirs, r.knobs, r.case, _fmt(r.value_diff), _fmt(r.grad_diff), r.error]
             for r in failing[:60]])]
    return "\n".join(lines) + "\n"


def rows_csv(rows: list[Row]) -> str:
    buffer = io.StringIO()
    names = [f.name for f in dataclasses.fields(Row)]
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(names)
    for r in rows:
        writer.writerow(["" if getattr(r, n) is None else (f"{getattr(r, n):.3e}" if isinstance(getattr(r, n), float)
                                                          else getattr(r, n)) for n in names])
    return buffer.getvalue()


# --------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------


@dataclass
class ReferencesSettings(StudySettings):
    install: bool = field(default=False, metadata={
        "help": "first fetch the pinned frameworks (pip install --no-deps --target into $GRPO_BENCH_REFERENCES, "
                "default ~/.cache/grpo-bench/references)"})
    out: str = option("out", "results/references")  # references.md, references.csv, features.md
    frameworks: tuple[str, ...] = field(default=FRAMEWORKS, metadata={
        "help": "frameworks to compare against", "metavar": "NAME"})
    cases: tuple[str, ...] = field(default=tuple(CASES), metadata={"help": "batches", "metavar": "CASE"})
    plant: Optional[str] = field(default=None, metadata={
        "help": "run one planted error and write nothing; exit 1 when it is caught "
                f"({', '.join(p.name for p in PLANTS)}) (default: none)", "metavar": "NAME"})
    plants: bool = field(default=True, metadata={"help": "run every planted error after the check"})
    # the README's feature table (section "features")
    readme: Optional[str] = option("readme", shown="none")


def validate(settings: ReferencesSettings) -> None:
    unknown = [f for f in settings.frameworks if f not in FRAMEWORKS]
    if unknown:
        raise UsageError(f"--frameworks: unknown {', '.join(unknown)}; choose from {', '.join(FRAMEWORKS)}")
    unknown = [c for c in settings.cases if c not in CASES]
    if unknown:
        raise UsageError(f"--cases: unknown {', '.join(unknown)}; choose from {', '.join(CASES)}")
    if settings.plant is not None and settings.plant not in {p.name for p in PLANTS}:
        raise UsageError(f"--plant: unknown {settings.plant!r}; choose from {', '.join(p.name for p in PLANTS)}")


def prepare(settings: ReferencesSettings, log=print) -> None:
    """Fetch the frameworks (``--install``) or fail with one line naming ``--install``."""
    if settings.install:
        install.install(settings.frameworks, log=log)
    for fw in settings.frameworks:
        install.require(fw)


def run_references_check(settings: ReferencesSettings, command: str = "grpo-bench check references", log=print) -> int:
    validate(settings)
    prepare(settings, log)
    start = time.perf_counter()
    configs = all_configs(settings.frameworks, settings.cases)
    if settings.plant is not None:
        (plant,) = [p for p in PLANTS if p.name == settings.plant]
        result = run_plant(plant, configs, run_configs(configs))
        log(f"planted error {plant.name}: {result.failed}/{result.rows} agreeing rows fail"
            + (f" (e.g. {result.example})" if result.example else "") + (": caught" if result.caught else ": NOT caught"))
        return 1 if result.caught else 0
    rows = run_configs(configs)
    plants = [run_plant(p, configs, rows) for p in PLANTS] if settings.plants else []
    seconds = time.perf_counter() - start
    out = Path(settings.out)
    atomic_write_text(out / "references.md", report(rows, plants, seconds, command))
    atomic_write_text(out / "references.csv", rows_csv(rows))
    write_report(out / "features.md", features.feature_report(rows), readme=settings.readme, section="features",
                 section_body=features.feature_summary(rows))
    failing = [r for r in rows if r.status == "FAILS"]
    missed = [p.name for p in plants if p.missed]
    log(f"{len(rows)} configurations, {len(failing)} failing, "
        f"{len([r for r in rows if r.status == 'differs by design'])} differ by design; planted errors caught "
        f"{len([p for p in plants if p.caught])}/{len([p for p in plants if p.rows])}" + (f" (missed: {', '.join(missed)})" if missed else "")
        + f"; {seconds:.0f} s -> {out}/references.md, references.csv, features.md")
    for r in failing[:10]:
        log(f"  FAILS {r.framework} {r.function} vs {r.theirs} [{r.knobs}] {r.case}/{r.seed}: value "
            f"{_fmt(r.value_diff)} grad {_fmt(r.grad_diff)} {r.error}")
    return 1 if failing or missed else 0
