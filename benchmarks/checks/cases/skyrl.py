"""SkyRL 0.4.0's cases: its registered ``maxrl`` estimator (and GRPO's, beside it), and its off-policy correction's
sequence masks -- ``sequence_mask_metric`` geometric and product, the outlier-token rejection -- alone and applied
in ``ppo_policy_loss``, against ours (benchmarks/references/skyrl.py calls SkyRL's own functions). The sampler's
log-probs are the batch's ``sampling_logps``, pi_old its ``old_logps``."""

from __future__ import annotations

from algorithms import estimators, kl, losses, policy_losses
from benchmarks.checks.cases.tensors import (Grid, TensorCases, add_gae, knobs, loss_pair, missing, ours_correction,
                                             ours_loss, sampler_corrections, value_pair)
from benchmarks.checks.cases.verl import reinforce_pp_unbiased
from benchmarks.checks.engine import register_cases
from benchmarks.references import skyrl

GRPO_EPS = ("SkyRL divides by std + 1e-6 (verl's); ours by std + 1e-4 (TRL's); group_advantages(eps=1e-6) is "
            "SkyRL's (next row)")
GEOMETRIC, OUTLIER = "sequence_geometric_mask", "sequence_outlier_mask"
GEO_BANDS = ((0.99, 1.01), (0.97, 1.03), (0.995, 1.2))
PRODUCT_BANDS = ((0.5, 2.0), (0.9, 1.1))
OUTLIER_BOUNDS = ((0.95, 1.05), (0.9, 1.1), (None, 1.05), (0.95, None), (1e-4, 100.0))


def _estimators(grid: Grid) -> None:
    """MaxRL: (r - mean) / (mean + 1e-6) per group, and the raw reward of a lone completion (G = 1); GRPO's group
    standardisation with SkyRL's epsilon."""
    skip = missing(estimators.ADVANTAGE_ESTIMATORS, "maxrl", "advantage estimator")
    grid.add("estimator", "maxrl", "maxrl", "-", value_pair(
        lambda b: estimators.advantages("maxrl", b.rewards, group_size=b.group_size),
        lambda b: skyrl.advantages("maxrl", b.rewards, b.mask, b.group_size)), skip=skip)
    grid.add("estimator", "maxrl", "maxrl", "group_size=1", value_pair(
        lambda b: estimators.advantages("maxrl", b.rewards, group_size=1),
        lambda b: skyrl.advantages("maxrl", b.rewards, b.mask, 1)), skip=skip)
    grid.add("estimator", "grpo", "grpo", "scale=group", value_pair(
        lambda b: estimators.advantages("grpo", b.rewards, group_size=b.group_size),
        lambda b: skyrl.advantages("grpo", b.rewards, b.mask, b.group_size)), GRPO_EPS)
    grid.add("estimator", "group_advantages(eps=1e-6)", "grpo", "scale=group", value_pair(
        lambda b: losses.group_advantages(b.rewards, b.group_size, "group", eps=1e-6),
        lambda b: skyrl.advantages("grpo", b.rewards, b.mask, b.group_size)))


def _critic_free_and_gae(grid: Grid) -> None:
    """RLOO (its G / (G - 1) scaling of the centred reward), REINFORCE++ (its verl port: unbiased whitening) and
    GAE (whitened advantages, returns) on PPO's token rewards."""
    grid.add("estimator", "rloo", "rloo", "-", value_pair(
        lambda b: estimators.advantages("rloo", b.rewards, group_size=b.group_size),
        lambda b: skyrl.advantages("rloo", b.rewards, b.mask, b.group_size)))
    grid.add("estimator", "reinforce_plus_plus (cumulative_returns + masked_whiten)", "reinforce++", "-", value_pair(
        lambda b: reinforce_pp_unbiased(b, False), lambda b: skyrl.advantages("reinforce++", b.rewards, b.mask, 1)))
    add_gae(grid, skyrl.gae, ((1.0, 0.95), (0.99, 0.9)))


def _kl(grid: Grid) -> None:
    """compute_approx_kl against our KL estimators (its k3 clamped as verl's low_var_kl: ours low_var_kl beside it),
    and the trainer's reward shaping (use_kl_in_reward) against ours."""
    for ours_name, theirs_name in (("k1", "k1"), ("k2", "k2"), ("k3", "k3"), ("low_var_kl", "k3"), ("abs", "abs")):
        clamp = (lambda case: ("SkyRL's k3 is clamped (log-ratio to [-20, 20], value to [-10, 10]), as verl's "
                               "low_var_kl; ours is DeepSeekMath's as written; our low_var_kl is SkyRL's k3")
                 if case == "far" else None) if ours_name == "k3" else None
        grid.add("kl", ours_name, f"compute_approx_kl({theirs_name})", "-", loss_pair(
            lambda b, n=ours_name: kl.KL_PENALTIES[n](b.logps, b.ref_logps),
            lambda b, n=theirs_name: skyrl.approx_kl(b.logps, b.ref_logps, n)), clamp)
    for coef in (0.05, 0.2):
        grid.add("kl_in_reward", "kl_penalised_rewards", "apply_reward_kl_penalty (k1)", knobs(kl_coef=coef),
                 value_pair(lambda b, c=coef: losses.kl_penalised_rewards(b.rewards, kl.kl_k1(b.old_logps, b.ref_logps),
                                                                          b.mask, c),
                            lambda b, c=coef: skyrl.reward_kl_penalty(b.rewards, b.old_logps, b.ref_logps, b.mask, c)))


def _skip(name: str):
    return missing(sampler_corrections(), name, "sampler correction")


def _product_rejection(low: float, high: float):
    """TRL's sequence_mask mode as a 0/1 mask: where its weight (the product ratio, or 0 outside the band) is 0."""
    def kept(b):
        weight = policy_losses.sampling_importance_ratio(b.old_logps, b.sampling_logps, b.mask, "sequence_mask",
                                                         low, high)
        return (weight != 0).to(b.mask.dtype)

    return kept


def _masks(grid: Grid) -> None:
    """The off-policy correction's sequence masks, 1 where a completion is kept: the geometric-mean band (ours
    sequence_geometric_mask), the product band (where TRL's sequence_mask mode weighs 0), the outlier tokens."""
    for low, high in GEO_BANDS:
        grid.add("sampler_correction", GEOMETRIC, "compute_sequence_mask(geometric)",
                 knobs(geo_mask_low=low, geo_mask_high=high), value_pair(
                     ours_correction(GEOMETRIC, geo_mask_low=low, geo_mask_high=high),
                     lambda b, lo=low, hi=high: skyrl.sequence_mask(b.old_logps, b.sampling_logps, b.mask,
                                                                    "geometric", geo_mask_low=lo, geo_mask_high=hi)),
                 skip=_skip(GEOMETRIC))
    for low, high in PRODUCT_BANDS:
        grid.add("sampler_correction", "sequence_mask (rejected where 0)", "compute_sequence_mask(product)",
                 knobs(clip_min=low, clip_max=high), value_pair(
                     _product_rejection(low, high),
                     lambda b, lo=low, hi=high: skyrl.sequence_mask(b.old_logps, b.sampling_logps, b.mask, "product",
                                                                    product_mask_low=lo, product_mask_high=hi)))
    for low, high in OUTLIER_BOUNDS:
        grid.add("sampler_correction", OUTLIER, "compute_outlier_token_mask",
                 knobs(outlier_token_is_threshold_low=low, outlier_token_is_threshold_high=high), value_pair(
                     ours_correction(OUTLIER, outlier_token_is_threshold_low=low,
                                     outlier_token_is_threshold_high=high),
                     lambda b, lo=low, hi=high: skyrl.outlier_token_mask(b.old_logps, b.sampling_logps, b.mask,
                                                                         low=lo, high=hi)),
                 skip=_skip(OUTLIER))


def _corrected_losses(grid: Grid) -> None:
    """ppo_policy_loss with the correction applied (token_mean reduction: SkyRL scales the advantages by the tokens
    before the masks, as our bnpo divides by them) against our bnpo loss under the same importance_sampling_mode."""
    cases = ((GEOMETRIC, dict(geo_mask_low=0.99, geo_mask_high=1.01),
              dict(sequence_mask_metric="geometric", geo_mask_low=0.99, geo_mask_high=1.01)),
             (OUTLIER, dict(outlier_token_is_threshold_low=0.95, outlier_token_is_threshold_high=1.05),
              dict(outlier_token_is_threshold_low=0.95, outlier_token_is_threshold_high=1.05)))
    for mode, ours_options, theirs_options in cases:
        for eps_high in (None, 0.28):
            ours = ours_loss("bnpo", epsilon=0.2, epsilon_high=eps_high, with_sampling=True,
                             importance_sampling_mode=mode, **ours_options)
            theirs = (lambda b, eh=eps_high, o=theirs_options: skyrl.policy_loss(
                b.logps, b.old_logps, b.sampling_logps, b.advantages, b.mask, epsilon=0.2, epsilon_high=eh, **o))
            grid.add("sampler_correction", f"{mode} (bnpo)", "ppo_policy_loss(regular) + off_policy_correction",
                     knobs(epsilon_high=eps_high or 0.2, **ours_options), loss_pair(ours, theirs), skip=_skip(mode))


def _truncated(grid: Grid) -> None:
    """tis_ratio_type token / sequence (the IS weight capped above) against TRL's truncate modes, which ours has."""
    for mode, level, cap in (("token_truncate", "token", 2.0), ("sequence_truncate", "sequence", 1.5)):
        cap_field = "token_tis_ratio_clip_high" if level == "token" else "sequence_tis_ratio_clip_high"
        ours = ours_loss("bnpo", with_sampling=True, importance_sampling_mode=mode, importance_sampling_clip_min=None,
                         importance_sampling_clip_max=cap)
        theirs = (lambda b, lv=level, f=cap_field, c=cap: skyrl.policy_loss(
            b.logps, b.old_logps, b.sampling_logps, b.advantages, b.mask, tis_ratio_type=lv, **{f: c}))
        grid.add("sampler_correction", f"{mode} (bnpo)", f"ppo_policy_loss(regular) + tis_ratio_type={level}",
                 knobs(importance_sampling_clip_max=cap), loss_pair(ours, theirs))


@register_cases
class SkyRLCases(TensorCases):
    name, adapter = skyrl.FRAMEWORK, skyrl.SkyRL

    def add_configs(self, grid: Grid) -> None:
        for part in (_estimators, _critic_free_and_gae, _kl, _masks, _corrected_losses, _truncated):
            part(grid)
