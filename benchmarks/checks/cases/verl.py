"""verl 0.9.1's cases: every policy loss under each of its aggregations, dual-clip, CISPO, GSPO, the aggregations,
the KL estimators, the actor's composed loss, the advantage estimators, PPO's GAE, whitening, value and policy
losses, and its rollout correction's Geo-RS and bypass mode (benchmarks/references/verl.py calls verl's own
functions)."""

from __future__ import annotations

from typing import Optional

import torch

from algorithms import estimators, kl, losses, policy_losses
from benchmarks.checks.cases.tensors import (HUGE_C, Batch, Grid, TensorCases, add_gae, knobs, loss_pair, missing,
                                             ours_correction, ours_loss, sampler_corrections, token_adv, value_pair)
from benchmarks.checks.engine import register_cases
from benchmarks.references import verl

CLIP_RANGES = ((0.2, None), (0.2, 0.28))
EMPTY_ROWS = ("verl's seq-mean modes leave all-masked rows out of the mean over sequences; ours {ours} ({norm}) counts "
              "them as zeros; with loss_aggregation={match} ours drops them too")
NORMS = {"grpo": "the paper's 1/G", "sapo": "the paper's 1/G", "luspo": "the paper's 1/G",
         "dr_grpo": "Dr. GRPO's constant B x L"}
# Our loss type -> the verl aggregation ours matches with loss_aggregation (None: it agrees as it is).
MATCHING = {"grpo": "seq-mean-token-mean", "bnpo": None, "dapo": None, "luspo": "seq-mean-token-sum",
            "dr_grpo": "seq-mean-token-sum-norm"}
# The other registered losses: (our options, verl's actor config, verl's loss_mode, its aggregation).
OTHERS = {
    "gmpo": (dict(epsilon=0.4, epsilon_high=0.4), dict(epsilon=0.4, epsilon_high=0.4), "geo_mean", "token-mean"),
    "sapo": (dict(sapo_temperature_pos=1.0, sapo_temperature_neg=1.05), dict(tau_pos=1.0, tau_neg=1.05), "sapo",
             "seq-mean-token-mean"),
    "dppo_tv": (dict(epsilon=0.2, epsilon_high=0.28, clip_ratio_c=3.0),
                dict(epsilon=0.2, epsilon_high=0.28, clip_ratio_c=3.0), "dppo_tv", "token-mean"),
    "dppo_kl": (dict(epsilon=0.05, epsilon_high=0.1, clip_ratio_c=3.0),
                dict(epsilon=0.05, epsilon_high=0.1, clip_ratio_c=3.0), "dppo_kl", "token-mean"),
    "kl_cov": (dict(kl_cov_ratio=0.1, kl_cov_coef=1.0), dict(kl_cov_ratio=0.1, ppo_kl_coef=1.0), "kl_cov", "token-mean"),
    "clip_cov": (dict(clip_cov_ratio=1.0, clip_cov_lb=-1e9, clip_cov_ub=1e9),
                 dict(clip_cov_ratio=1.0, clip_cov_lb=-1e9, clip_cov_ub=1e9), "clip_cov", "token-mean"),
}
ESTIMATORS = (("grpo", dict(scale="group")), ("grpo", dict(scale="none")), ("rloo", {}), ("remax", {}), ("gpg", {}),
              ("opo", {}), ("grpo_passk", dict(scale="group")), ("grpo_passk", dict(scale="none")),
              ("optimal_token_baseline", {}), ("reinforce_plus_plus", {}), ("reinforce_plus_plus_baseline", {}))
GRPO_EPS = ("verl divides by std + 1e-6; ours by std + 1e-4 (TRL's); group_advantages(eps=1e-6) is verl's "
            "(next row)")
RPP_WHITENING = ("verl whitens REINFORCE++ returns with the unbiased token variance (masked_whiten); ours follows "
                 "OpenRLHF, the paper's code: biased variance, clamped at 1e-8; with masked_whiten ours is verl's "
                 "(next row)")


def _empty_rows(loss_type: str, match: str) -> str:
    if loss_type == "dr_grpo":  # verl 0.9.1 divides by (rows with a token) x L; see the seq-mean-token-sum-norm rows
        return ("verl's seq-mean-token-sum-norm divides by the rows that have a token times L; Dr. GRPO's constant "
                "B x L (ours) counts all-masked rows too")
    return EMPTY_ROWS.format(ours=loss_type, norm=NORMS[loss_type], match=match)


def _on_empty(loss_type: str, match: Optional[str]):
    if match is None:
        return None
    return lambda case: _empty_rows(loss_type, match) if case == "empty" else None


def _k3_clamp(case: str) -> Optional[str]:
    return ("verl's k3 is clamped as its low_var_kl (log-ratio to [-20, 20], value to [-10, 10]); ours is "
            "DeepSeekMath's and TRL's k3 as written; our low_var_kl is verl's k3" if case == "far" else None)


def _policy(mode: str, agg: str = "token-mean", **config):
    """verl's policy loss ``mode`` aggregated by ``agg`` (seq-mean-token-sum-norm over the batch's width)."""

    def loss(b: Batch):
        scale = b.width if agg == "seq-mean-token-sum-norm" else None
        return verl.policy_loss(mode, b.logps, b.old_logps, b.advantages, b.mask, loss_agg_mode=agg,
                                loss_scale_factor=scale, **config)

    return loss


def _clipped(grid: Grid) -> None:
    """The clipped surrogate under each aggregation: verl's "vanilla" loss with its dual-clip floor out of reach;
    where verl drops all-masked rows, ours with its matching aggregation beside it."""
    for loss_type, match in MATCHING.items():
        mode, agg = verl.POLICY_LOSSES[loss_type]
        for eps, eps_high in CLIP_RANGES:
            theirs = _policy(mode, agg, epsilon=eps, epsilon_high=eps_high, clip_ratio_c=HUGE_C)
            ours = ours_loss(loss_type, epsilon=eps, epsilon_high=eps_high, max_completion_length="T")
            names = (f"{mode} + {agg}", knobs(epsilon=eps, epsilon_high=eps_high or eps))
            grid.add("policy_loss", loss_type, *names, loss_pair(ours, theirs), _on_empty(loss_type, match))
            if match and loss_type != "dr_grpo":  # the matching knob: our loss with verl's aggregation
                matched = ours_loss(loss_type, epsilon=eps, epsilon_high=eps_high, loss_aggregation=match)
                grid.add("policy_loss", f"{loss_type}(loss_aggregation={match})", *names, loss_pair(matched, theirs))


def _dual_clip(grid: Grid) -> None:
    """verl's default dual-clip floor c = 3 against the paper's clip (ours grpo has none; our dual_clip is verl's)."""
    grid.add("policy_loss", "bnpo", "vanilla (clip_ratio_c=3, default)", "epsilon=0.2",
             loss_pair(ours_loss("bnpo"), _policy("vanilla", clip_ratio_c=3.0)),
             lambda case: ("verl's vanilla loss is dual-clip PPO with c = 3 by default: a negative-advantage token's "
                           "loss is capped at -3A; ours bnpo/grpo is the paper's clip (loss_type dual_clip is verl's)")
             if case == "far" else None)
    for c in (3.0, 10.0):
        for eps, eps_high in CLIP_RANGES:
            grid.add("policy_loss", "dual_clip", "vanilla", knobs(epsilon=eps, epsilon_high=eps_high or eps, clip_ratio_c=c),
                     loss_pair(ours_loss("dual_clip", epsilon=eps, epsilon_high=eps_high, clip_ratio_c=c),
                               _policy("vanilla", epsilon=eps, epsilon_high=eps_high, clip_ratio_c=c)))


def _others(grid: Grid) -> None:
    """The other registered losses, each with verl's aggregation for it (SAPO's always seq-mean-token-mean)."""
    for loss_type, (ours_kw, theirs_kw, mode, agg) in OTHERS.items():
        theirs = _policy(mode, agg, **theirs_kw)
        reason = None
        if loss_type == "sapo":
            reason = _on_empty("sapo", "seq-mean-token-mean")
            grid.add("policy_loss", "sapo(loss_aggregation=seq-mean-token-mean)", mode, knobs(**ours_kw),
                     loss_pair(ours_loss(loss_type, loss_aggregation="seq-mean-token-mean", **ours_kw), theirs))
        grid.add("policy_loss", loss_type, mode, knobs(**ours_kw), loss_pair(ours_loss(loss_type, **ours_kw), theirs),
                 reason)


def _cispo_and_gspo(grid: Grid) -> None:
    """CISPO: verl clips the stop-gradient weight to [1 - eps, 1 + eps_high]; ours (MiniMax-M1, TRL) caps it at
    eps_high. GSPO: our sequence-level ratio (level="sequence") with verl's aggregation."""
    grid.add("policy_loss", "cispo", "cispo", "epsilon_high=5.0 vs clip_ratio_high=0.28",
             loss_pair(ours_loss("cispo", epsilon_high=5.0), _policy("cispo", epsilon=0.2, epsilon_high=0.28)),
             "verl's CISPO clips the IS weight to [1 - eps_low, 1 + eps_high] (two-sided); ours is MiniMax-M1's and "
             "TRL's, min(r, eps_high) with no lower bound; verl with clip_ratio_low=1, clip_ratio_high=eps_high-1 is ours")
    for cap in (5.0, 1.28):
        grid.add("policy_loss", "cispo", "cispo (clip_ratio_low=1.0)", knobs(epsilon_high=cap),
                 loss_pair(ours_loss("cispo", epsilon_high=cap), _policy("cispo", epsilon=1.0, epsilon_high=cap - 1.0)))
    for eps, eps_high in ((3e-4, 4e-4), (0.2, None)):
        grid.add("policy_loss", "grpo(level=sequence)", "gspo", knobs(epsilon=eps, epsilon_high=eps_high or eps),
                 loss_pair(ours_loss("grpo", level="sequence", epsilon=eps, epsilon_high=eps_high,
                                     loss_aggregation="seq-mean-token-mean"),
                           _policy("gspo", "seq-mean-token-mean", epsilon=eps, epsilon_high=eps_high)))


def _aggregations_and_kl(grid: Grid) -> None:
    """Aggregations: one per-token loss matrix, every verl loss_agg_mode. KL estimators, per token."""
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        grid.add("aggregation", agg, agg, "-", loss_pair(
            lambda b, agg=agg: policy_losses.LOSS_AGGREGATIONS[agg](b.logps.exp() * b.advantages.unsqueeze(-1),
                                                                    b.mask, None, None),
            lambda b, agg=agg: verl.agg_loss(b.logps.exp() * b.advantages.unsqueeze(-1), b.mask, agg)))
    for name, theirs_name in verl.KL.items():
        grid.add("kl", name, theirs_name, "-",
                 loss_pair(lambda b, n=name: kl.KL_PENALTIES[n](b.logps, b.ref_logps),
                           lambda b, n=theirs_name: verl.kl_penalty(b.logps, b.ref_logps, n)),
                 _k3_clamp if name in ("k3", "k3+") else None)


def _actor(loss_agg_mode: str, kl_type: str):
    """verl's ppo_loss: vanilla (no dual-clip floor) + 0.04 KL - 0.01 entropy, each aggregated by ``loss_agg_mode``."""
    return lambda b: verl.actor_loss("vanilla", b.logps, b.old_logps, b.advantages, b.mask,
                                     loss_agg_mode=loss_agg_mode, ref_logps=b.ref_logps, kl_loss_coef=0.04,
                                     kl_loss_type=kl_type, entropies=b.entropies, entropy_coeff=0.01,
                                     clip_ratio_c=HUGE_C)


def _actor_losses(grid: Grid) -> None:
    """The actor's loss: policy loss, KL loss and entropy bonus, as verl's ppo_loss composes them."""
    for kl_type in ("low_var_kl", "k1", "k2", "k3+"):
        ours = ours_loss("bnpo", beta=0.04, kl_loss_type=kl_type, entropy_coef=0.01, with_entropies=True)
        grid.add("actor_loss", "bnpo + beta*KL - entropy", f"ppo_loss (vanilla, {kl_type})",
                 knobs(beta=0.04, kl_loss_type=kl_type, entropy_coef=0.01),
                 loss_pair(ours, _actor("token-mean", kl_type)), _k3_clamp if kl_type == "k3+" else None)
    grid.add("actor_loss", "grpo + beta*KL - entropy", "ppo_loss (vanilla, seq-mean-token-mean)",
             "beta=0.04, kl_loss_type=low_var_kl, entropy_coef=0.01",
             loss_pair(ours_loss("grpo", beta=0.04, kl_loss_type="low_var_kl", entropy_coef=0.01, with_entropies=True,
                                 loss_aggregation="seq-mean-token-mean"), _actor("seq-mean-token-mean", "low_var_kl")),
             "verl aggregates the entropy bonus with the actor's loss_agg_mode; ours (TRL, OpenRLHF) takes the token "
             "mean whatever the aggregation; the two meet under token-mean (the rows above)")


def _estimator(name: str, kwargs: dict):
    return lambda b: estimators.advantages(
        name, b.rewards, group_size=b.group_size, lengths=b.lengths, baseline_rewards=b.baseline_rewards, mask=b.mask,
        old_logps=b.old_logps, sum_pi_squared=b.sum_pi_squared, **kwargs)


def _theirs_estimator(name: str, norm: bool = True):
    return lambda b: verl.advantages(name, b.rewards, b.mask, b.group_size, norm_adv_by_std_in_grpo=norm,
                                     baseline_rewards=b.baseline_rewards, old_logps=b.old_logps,
                                     sum_pi_squared=b.sum_pi_squared)[0]


def reinforce_pp_unbiased(b: Batch, baseline: bool):
    """REINFORCE++ as verl's (and SkyRL's, its port) estimator computes it: the cumulative return of the outcome
    reward, whitened with the unbiased token variance (``losses.masked_whiten``)."""
    scores = b.rewards
    if baseline:
        grouped = scores.view(-1, b.group_size)
        scores = (grouped - grouped.mean(1, keepdim=True)).masked_fill(losses.tied_rows(grouped), 0.0).reshape(-1)
    rewards = losses.kl_penalised_rewards(scores, torch.zeros_like(b.mask), b.mask, 0.0)
    return losses.masked_whiten(losses.cumulative_returns(rewards, b.mask), b.mask)


def _estimators(grid: Grid) -> None:
    """Every registered estimator verl has; where verl differs by design, ours with its knob beside it."""
    for name, kwargs in ESTIMATORS:
        norm = kwargs.get("scale", "group") != "none"
        by_design = None
        if name == "grpo" and norm:
            by_design = GRPO_EPS
        elif name in ("reinforce_plus_plus", "reinforce_plus_plus_baseline"):
            by_design = RPP_WHITENING
        grid.add("estimator", name, name, knobs(**kwargs),
                 value_pair(_estimator(name, kwargs), _theirs_estimator(name, norm)), by_design)
    grid.add("estimator", "group_advantages(eps=1e-6)", "grpo", "scale=group",
             value_pair(lambda b: losses.group_advantages(b.rewards, b.group_size, "group", eps=1e-6),
                        lambda b: verl.advantages("grpo", b.rewards, b.mask, b.group_size)[0]))
    for name, baseline in (("reinforce_plus_plus", False), ("reinforce_plus_plus_baseline", True)):
        grid.add("estimator", f"{name} (cumulative_returns + masked_whiten)", name, "-",
                 value_pair(lambda b, bl=baseline: reinforce_pp_unbiased(b, bl),
                            lambda b, n=name: verl.advantages(n, b.rewards, b.mask, b.group_size)[0]))


def _gae_and_rewards(grid: Grid) -> None:
    """PPO's GAE (with verl's whitening, and its returns) and the critic's KL in the reward."""
    add_gae(grid, verl.gae, ((1.0, 0.95), (0.99, 0.95), (1.0, 1.0)))
    for coef in (0.05, 0.2):
        grid.add("kl_in_reward", "kl_penalised_rewards", "compute_rewards (k1)", knobs(kl_coef=coef), value_pair(
            lambda b, c=coef: losses.kl_penalised_rewards(b.rewards, kl.kl_k1(b.old_logps, b.ref_logps), b.mask, c),
            lambda b, c=coef: verl.core().compute_rewards(verl.outcome_rewards(b.rewards, b.mask), b.old_logps,
                                                          b.ref_logps, c)))


def _ppo_losses(grid: Grid) -> None:
    """PPO's whitening, value loss and policy loss."""
    grid.add("whitening", "masked_whiten", "verl.utils.torch_functional.masked_whiten", "-",
             value_pair(lambda b: losses.masked_whiten(b.returns, b.mask), lambda b: verl.masked_whiten(b.returns, b.mask)))
    for clip in (0.2, 0.5):
        grid.add("value_loss", "ppo_value_loss", "compute_value_loss", knobs(value_clip=clip), loss_pair(
            lambda b, c=clip: losses.ppo_value_loss(b.values, b.old_values, b.returns, b.mask, c),
            lambda b, c=clip: verl.value_loss(b.values, b.old_values, b.returns, b.mask, c), wrt="values"))
    for eps, eps_high in CLIP_RANGES:
        grid.add("ppo_policy_loss", "ppo_policy_loss", "vanilla (clip_ratio_c=1e12)",
                 knobs(epsilon=eps, epsilon_high=eps_high or eps), loss_pair(
                     lambda b, e=eps, eh=eps_high: losses.ppo_policy_loss(b.logps, b.old_logps, token_adv(b), b.mask, e, eh),
                     lambda b, e=eps, eh=eps_high: verl.policy_loss("vanilla", b.logps, b.old_logps, token_adv(b), b.mask,
                                                                    epsilon=e, epsilon_high=eh, clip_ratio_c=HUGE_C)))


# Geo-RS bands, verl's "LOW_HIGH" on pi_rollout / pi_old (its preset 0.999_1.001 and two wider ones).
GEO_RS = ((0.999, 1.001), (0.99, 1.01), (0.97, 1.05))


def _rollout_correction(grid: Grid) -> None:
    """Rollout correction: Geo-RS (rollout_rs seq_mean_k1, the rejection mask) against our geometric-mean sequence
    mask with the reciprocal band; bypass mode (the rollout's log-probs as the old ones, PPO's clip) against our
    importance_sampling_mode bypass."""
    corrections = sampler_corrections()
    for low, high in GEO_RS:
        grid.add("sampler_correction", "sequence_geometric_mask", "rollout_rs=seq_mean_k1 (Geo-RS)",
                 knobs(rollout_rs_threshold=f"{low}_{high}"), value_pair(
                     ours_correction("sequence_geometric_mask", geo_mask_low=1 / high, geo_mask_high=1 / low),
                     lambda b, t=f"{low}_{high}": verl.rollout_rejection_mask(b.old_logps, b.sampling_logps, b.mask,
                                                                              "seq_mean_k1", t)),
                 skip=missing(corrections, "sequence_geometric_mask", "sampler correction"))
    skip = missing(corrections, "bypass", "sampler correction")
    for eps, eps_high in CLIP_RANGES:
        names = knobs(epsilon=eps, epsilon_high=eps_high or eps)
        grid.add("sampler_correction", "bypass (bnpo)", "bypass_mode (ppo_clip, clip_ratio_c=1e12)", names, loss_pair(
            ours_loss("bnpo", epsilon=eps, epsilon_high=eps_high, with_sampling=True, importance_sampling_mode="bypass"),
            lambda b, e=eps, eh=eps_high: verl.bypass_loss(b.logps, b.sampling_logps, b.advantages, b.mask, epsilon=e,
                                                           epsilon_high=eh, clip_ratio_c=HUGE_C)), skip=skip)
        grid.add("sampler_correction", "bypass (dual_clip)", "bypass_mode (ppo_clip)", f"{names}, clip_ratio_c=3.0",
                 loss_pair(ours_loss("dual_clip", epsilon=eps, epsilon_high=eps_high, clip_ratio_c=3.0,
                                     with_sampling=True, importance_sampling_mode="bypass"),
                           lambda b, e=eps, eh=eps_high: verl.bypass_loss(b.logps, b.sampling_logps, b.advantages,
                                                                          b.mask, epsilon=e, epsilon_high=eh)),
                 skip=skip)


@register_cases
class VerlCases(TensorCases):
    name, adapter = verl.FRAMEWORK, verl.Verl

    def add_configs(self, grid: Grid) -> None:
        for part in (_clipped, _dual_clip, _others, _cispo_and_gspo, _aggregations_and_kl, _actor_losses, _estimators,
                     _gae_and_rewards, _ppo_losses, _rollout_correction):
            part(grid)
