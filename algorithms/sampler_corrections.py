"""The sampler/trainer mismatch corrections, registered by name: GRPO's ``importance_sampling_mode``.

When the sampler computes its own log-probs of the sampled tokens (another precision, another engine), the
trainer's view of the sampling policy (pi_old, its first-iteration log-probs) and the sampler's (pi_sampler)
differ. A correction turns the two into a weight on the per-token loss: an importance weight, truncated or
masked (TRL 1.16's four modes), a rejection of whole sequences (SkyRL 0.4.0's geometric-mean and outlier-token
masks, verl 0.9.1's Geo-RS), OpenRLHF 0.11.2's gate on the ratio or a divergence; or, verl's bypass mode, no
weight at all: the sampler's log-probs stand in for pi_old, so the ratio itself is pi_theta / pi_sampler.

A correction is a small class in the policy losses' shape (algorithms/policy_losses.py): its name, what it is
declared as class properties, an ``Options`` dataclass of its own knobs (settings of GRPO: flags grouped in
--help under the mode) and ``weights``, a few lines, no gradient. ``@register_sampler_correction`` registers
one at its definition; an unknown name is one ValueError listing the choices.

Throughout, a NaN sampler log-prob (padding, a token the sampler did not score) counts as no mismatch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar, Optional

import torch

from algorithms.registry import Configurable, lookup_named, register_member

# TRL 1.16's vllm_importance_sampling_mode values (the TRL check compares each).
IMPORTANCE_SAMPLING_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
LOG_RATIO_BOUND = 20.0  # SkyRL's safe_exp_delta clamp on a log-ratio before exp


def _no_mismatch_where_unscored(old_logps: torch.Tensor, sampling_logps: torch.Tensor) -> torch.Tensor:
    """The sampler's log-probs with NaN replaced by the trainer's (a ratio of 1 there)."""
    return torch.where(torch.isnan(sampling_logps), old_logps, sampling_logps)


def _sequence_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) -> (B, 1): the mean over each row's active tokens (0 for a row without one)."""
    return (values * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)


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


class SamplerCorrection(Configurable):
    """A sampler/trainer mismatch correction (GRPO's ``importance_sampling_mode``). Subclasses set ``name``, declare
    what they are, and write ``weights``; knobs of their own go in an ``Options`` dataclass (``Configurable``)."""

    selector: ClassVar[str] = "importance_sampling_mode"
    # its weight is one per completion, (B, 1): a loss that folds the weight into its own (vespo) needs token ones
    sequence_level: ClassVar[bool] = False
    # the sampler's log-probs replace pi_old (verl's bypass mode): the ratio corrects, no weight is applied
    bypass: ClassVar[bool] = False

    @torch.no_grad()
    def weights(self, old_logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor,
                clip_min: Optional[float] = None, clip_max: Optional[float] = None) -> Optional[torch.Tensor]:
        """The weight on the per-token loss, (B, T) or (B, 1), or None for none. ``old_logps`` pi_old,
        ``sampling_logps`` pi_sampler, ``mask`` (B, T); ``clip_min``, ``clip_max``: GRPO's
        importance_sampling_clip_min and _max (TRL's bounds), for the modes that read them."""
        raise NotImplementedError

    @staticmethod
    def old_logps(old_logps: torch.Tensor, sampling_logps: torch.Tensor) -> torch.Tensor:
        """pi_old for the loss under ``bypass``: the sampler's log-probs, the trainer's where the sampler has none."""
        return _no_mismatch_where_unscored(old_logps, sampling_logps)


SAMPLER_CORRECTIONS: dict[str, type[SamplerCorrection]] = {}


def register_sampler_correction(correction: type[SamplerCorrection]) -> type[SamplerCorrection]:
    """``@register_sampler_correction`` at a SamplerCorrection subclass's definition: registered under its name (a
    taken name is refused, the same class again is a no-op, an option another correction declares keeps its
    default and type)."""
    return register_member(SAMPLER_CORRECTIONS, "sampler correction", correction)


def sampler_correction(name: str) -> type[SamplerCorrection]:
    """The registered correction ``name``, or ValueError listing the choices."""
    return lookup_named(SAMPLER_CORRECTIONS, "importance_sampling_mode", name)


# --- TRL 1.16's four: an importance weight truncated or masked to [importance_sampling_clip_min, _max] ---------


class _TRLMode(SamplerCorrection):
    """TRL's ``vllm_importance_sampling_mode`` of this name (``sampling_importance_ratio``)."""

    def weights(self, old_logps, sampling_logps, mask, clip_min=None, clip_max=None):
        return sampling_importance_ratio(old_logps, sampling_logps, mask, self.name, clip_min, clip_max)


for _mode in IMPORTANCE_SAMPLING_MODES:
    register_sampler_correction(type(_mode, (_TRLMode,), {
        "name": _mode, "sequence_level": _mode.startswith("sequence"), "__module__": __name__,
        "__doc__": f"TRL 1.16's {_mode!r} (``sampling_importance_ratio``)."}))


# --- SkyRL 0.4.0's sequence rejections (off_policy_correction_utils) ---------------------------------------


@register_sampler_correction
class GeometricMask(SamplerCorrection):
    """The geometric-mean sequence mask (SkyRL 0.4.0's sequence_mask_metric "geometric"; verl 0.9.1's Geo-RS,
    rollout_rs "seq_mean_k1"): a completion is rejected when the geometric mean of its token ratios leaves the band,

        g_i = exp( 1/|o_i| sum_t log(pi_old / pi_sampler)(o_{i,t}) ),    w_i = [ geo_mask_low <= g_i <= geo_mask_high ]

    (B, 1) of 0/1, no reweighting: the length-normalised ratio does not grow with the length, so one band suits
    short and long completions (SkyRL: [0.99, 1.01]). verl bounds the reciprocal, pi_sampler / pi_old: its
    "lower_upper" threshold is this band at [1/upper, 1/lower]."""

    name, sequence_level = "sequence_geometric_mask", True

    @dataclass
    class Options(Configurable.Options):
        geo_mask_low: float = field(default=0.99, metadata={
            "help": "sequence_geometric_mask: reject a completion whose geometric-mean ratio is below this "
                    "(SkyRL: 0.99)"})
        geo_mask_high: float = field(default=1.01, metadata={
            "help": "sequence_geometric_mask: reject a completion whose geometric-mean ratio is above this "
                    "(SkyRL: 1.01)"})

        def validate(self) -> None:
            if not 0 < self.geo_mask_low <= self.geo_mask_high:
                raise ValueError(f"geo_mask_low must be > 0 and <= geo_mask_high, got [{self.geo_mask_low}, "
                                 f"{self.geo_mask_high}]")

    def weights(self, old_logps, sampling_logps, mask, clip_min=None, clip_max=None):
        mask = mask.to(old_logps.dtype)
        log_ratio = old_logps - _no_mismatch_where_unscored(old_logps, sampling_logps)
        geometric = torch.exp(_sequence_mean(log_ratio, mask).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))
        return ((geometric >= self.options.geo_mask_low) & (geometric <= self.options.geo_mask_high)).to(mask.dtype)


@register_sampler_correction
class OutlierTokenMask(SamplerCorrection):
    """Outlier-token rejection (SkyRL 0.4.0's outlier_token_is_threshold_low / _high): a completion is rejected
    when any of its tokens' ratios is an outlier,

        w_i = [ for every active t:  low <= pi_old(o_{i,t}) / pi_sampler(o_{i,t}) <= high ]

    (B, 1) of 0/1, the ratio's log clamped to +-20 first (SkyRL's); SkyRL suggests [1e-4, 100]. None: that side
    unbounded (on the command line: 0 below, a huge value above)."""

    name, sequence_level = "sequence_outlier_mask", True

    @dataclass
    class Options(Configurable.Options):
        outlier_token_is_threshold_low: Optional[float] = field(default=1e-4, metadata={
            "help": "sequence_outlier_mask: reject a completion with a token ratio below this; 0: no bound "
                    "(SkyRL suggests 1e-4)"})
        outlier_token_is_threshold_high: Optional[float] = field(default=100.0, metadata={
            "help": "sequence_outlier_mask: reject a completion with a token ratio above this; 1e30: in effect none "
                    "(SkyRL suggests 100)"})

        def validate(self) -> None:
            low, high = self.outlier_token_is_threshold_low, self.outlier_token_is_threshold_high
            if (low is not None and low < 0) or (high is not None and high <= 0):
                raise ValueError(f"outlier_token_is_threshold_low must be >= 0 and _high > 0, got {low}, {high}")
            if low is not None and high is not None and low > high:
                raise ValueError(f"outlier_token_is_threshold_low ({low}) must be <= _high ({high})")

    def weights(self, old_logps, sampling_logps, mask, clip_min=None, clip_max=None):
        o = self.options
        low = -math.inf if o.outlier_token_is_threshold_low is None else o.outlier_token_is_threshold_low
        high = math.inf if o.outlier_token_is_threshold_high is None else o.outlier_token_is_threshold_high
        log_ratio = old_logps - _no_mismatch_where_unscored(old_logps, sampling_logps)
        ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))
        outlier = ((ratio < low) | (ratio > high)) & mask.bool()
        return (~outlier.any(dim=-1, keepdim=True)).to(old_logps.dtype)


# --- OpenRLHF 0.11.2's gate (models/loss.py PolicyLoss, is_correction_*) ----------------------------------

GATING_LEVELS, GATING_MODES, GATING_STATISTICS = ("off", "token", "seq"), ("mask", "clip"), ("ratio", "binary_kl", "tv")


@register_sampler_correction
class Gated(SamplerCorrection):
    """OpenRLHF 0.11.2's train/rollout correction (``is_correction_level`` / ``_mode`` / ``_gating`` /
    ``_threshold``): a statistic per unit, gated to [low, high],

        rho_t  = pi_old(o_t) / pi_sampler(o_t)
        stat_t = rho_t  (ratio),   p log(p/q) + (1-p) log((1-p)/(1-q))  (binary_kl),   |p - q|  (tv)
                 with p = pi_sampler(o_t), q = pi_old(o_t), each clamped to [1e-6, 1 - 1e-6]
        level token: each token's stat;  seq: per completion, exp of the mean log ratio (the geometric mean) for
                 ratio, the mean for a divergence
        mask:  w_t = rho_t where low <= stat <= high, else 0     (the survivors keep their token IS weight)
        clip:  w_t = clip(rho_t, low, high)                       (token level and ratio only: TIS)

    (B, T); level off: no weight. A divergence is bounded from above only: its threshold_low must be 0 (OpenRLHF
    refuses the default ratio band there). FlashREINFORCE's trust region is seq, mask, binary_kl, [0, delta]."""

    name = "gated"

    @dataclass
    class Options(Configurable.Options):
        is_correction_level: str = field(default="token", metadata={
            "help": "gated: the unit gated, each token or the completion (seq); off: no correction (OpenRLHF: "
                    "off by default, token or seq when on)", "choices": GATING_LEVELS})
        is_correction_mode: str = field(default="mask", metadata={
            "help": "gated: mask (drop what leaves the band) or clip (clamp the token ratio into it)",
            "choices": GATING_MODES})
        is_correction_gating: str = field(default="ratio", metadata={
            "help": "gated: the statistic gated: the ratio itself, or the sampled token's binary_kl or tv between "
                    "sampler and trainer (upper bound only)", "choices": GATING_STATISTICS})
        is_correction_threshold_low: float = field(default=0.5, metadata={
            "help": "gated: the band's lower bound (OpenRLHF: 0.5; 0 for binary_kl and tv)"})
        is_correction_threshold_high: float = field(default=5.0, metadata={
            "help": "gated: the band's upper bound (OpenRLHF: 5.0; a divergence's delta)"})

        def validate(self) -> None:
            for name, choices in (("is_correction_level", GATING_LEVELS), ("is_correction_mode", GATING_MODES),
                                  ("is_correction_gating", GATING_STATISTICS)):
                if getattr(self, name) not in choices:
                    raise ValueError(f"unknown {name} {getattr(self, name)!r}; choose from {', '.join(choices)}")
            if self.is_correction_mode == "clip" and (self.is_correction_level == "seq"
                                                      or self.is_correction_gating != "ratio"):
                raise ValueError("is_correction_mode clip needs is_correction_level token and is_correction_gating "
                                 "ratio")
            if (self.is_correction_gating != "ratio" and self.is_correction_level != "off"
                    and self.is_correction_threshold_low > 0):
                raise ValueError(f"is_correction_gating {self.is_correction_gating} takes an upper bound only: set "
                                 f"is_correction_threshold_low 0")
            if not 0 <= self.is_correction_threshold_low <= self.is_correction_threshold_high:
                raise ValueError(f"is_correction_threshold_low must be >= 0 and <= _high, got "
                                 f"[{self.is_correction_threshold_low}, {self.is_correction_threshold_high}]")

    def weights(self, old_logps, sampling_logps, mask, clip_min=None, clip_max=None):
        o = self.options
        if o.is_correction_level == "off":
            return None
        mask = mask.to(old_logps.dtype)
        sampling_logps = _no_mismatch_where_unscored(old_logps, sampling_logps)
        log_ratio = old_logps - sampling_logps
        token_ratio = torch.exp(log_ratio)
        seq = o.is_correction_level == "seq"
        if o.is_correction_gating == "ratio":
            stat = torch.exp(_sequence_mean(log_ratio, mask)) if seq else token_ratio
        else:
            p = torch.exp(sampling_logps).clamp(1e-6, 1 - 1e-6)  # the clamp keeps the binary KL's logs finite
            q = torch.exp(old_logps).clamp(1e-6, 1 - 1e-6)
            if o.is_correction_gating == "binary_kl":
                stat = p * torch.log(p / q) + (1 - p) * torch.log((1 - p) / (1 - q))
            else:
                stat = (p - q).abs()
            stat = _sequence_mean(stat, mask) if seq else stat
        low, high = o.is_correction_threshold_low, o.is_correction_threshold_high
        if o.is_correction_mode == "clip":
            return stat.clamp(min=low, max=high)
        keep = (stat >= low) & (stat <= high)
        return torch.where(keep, token_ratio, torch.zeros_like(token_ratio))


# --- verl 0.9.1's bypass mode ---------------------------------------------------------------------------


@register_sampler_correction
class Bypass(SamplerCorrection):
    """verl 0.9.1's bypass mode (rollout_correction.bypass_mode, loss_type "ppo_clip"): the old policy *is* the
    sampler, pi_old := pi_sampler, so the loss's own ratio pi_theta / pi_sampler (clipped as the loss clips it)
    carries the correction and no weight is applied; no old-log-prob pass is needed. At mu = 1 the ratio is then
    pi_theta / pi_sampler instead of 1 in value; at every iteration the old log-probs are the sampler's.
    Unscored (NaN) sampler log-probs fall back to the trainer's."""

    name, bypass = "bypass", True

    def weights(self, old_logps, sampling_logps, mask, clip_min=None, clip_max=None):
        return None
