"""verl 0.9.1 as a reference: its registered advantage estimators and policy losses (``verl.trainer.ppo.core_algos``),
``agg_loss``, ``kl_penalty``, ``compute_value_loss`` and GAE, called on our tensors; no engine is imported.

Our tensors are the suite's: ``mask`` (B, T) by the mask convention, one reward per completion (verl reads it as the
token-level reward on the last active token and sums it back), advantages (B,) broadcast to (B, T) where verl
expects token advantages. Its actor composes the policy loss, the entropy bonus and the KL loss as
``verl.workers.utils.losses.ppo_loss`` does (``actor_loss``), each aggregated by ``agg_loss`` with the actor's
``loss_agg_mode``.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from benchmarks.references import install
from benchmarks.references.adapters import Adapter, register_adapter

FRAMEWORK = "verl"
VERSION = install.PINNED[FRAMEWORK].version

# Our advantage estimator (algorithms/estimators.py; "gae" is PPO's, algorithms/losses.gae) -> verl's registered name.
ESTIMATORS = {
    "grpo": "grpo", "rloo": "rloo", "reinforce_plus_plus": "reinforce_plus_plus",
    "reinforce_plus_plus_baseline": "reinforce_plus_plus_baseline", "remax": "remax", "gpg": "gpg", "opo": "opo",
    "grpo_passk": "grpo_passk", "optimal_token_baseline": "optimal_token_baseline", "gae": "gae",
}
# verl's estimators this suite does not have (for the feature table).
ESTIMATORS_THEIRS_ONLY = ("grpo_vectorized", "rloo_vectorized", "gdpo", "tir_optimal_token_baseline")

# Our policy loss (loss_type) -> (verl's registered loss_mode, its loss_agg_mode); None: verl's default there. The
# clipped surrogate is verl's "vanilla" (dual-clip with clip_ratio_c; a huge c turns the floor off).
POLICY_LOSSES = {
    "grpo": ("vanilla", "seq-mean-token-mean"), "bnpo": ("vanilla", "token-mean"), "dapo": ("vanilla", "token-mean"),
    "dr_grpo": ("vanilla", "seq-mean-token-sum-norm"), "luspo": ("vanilla", "seq-mean-token-sum"),
    "dual_clip": ("vanilla", "token-mean"), "gmpo": ("geo_mean", None), "clip_cov": ("clip_cov", "token-mean"),
    "kl_cov": ("kl_cov", "token-mean"), "sapo": ("sapo", "seq-mean-token-mean"), "cispo": ("cispo", "token-mean"),
    "dppo_tv": ("dppo_tv", "token-mean"), "dppo_kl": ("dppo_kl", "token-mean"),
}
POLICY_LOSSES_THEIRS_ONLY = ("gpg", "dro", "bypass_mode")
# GRPO's importance ratio per sequence (our level="sequence", TRL's importance_sampling_level) is verl's "gspo".
SEQUENCE_LEVEL_LOSS = "gspo"
# Our LOSS_AGGREGATIONS name -> verl's loss_agg_mode.
AGGREGATIONS = {"token-mean": "token-mean", "seq-mean-token-mean": "seq-mean-token-mean",
                "seq-mean-token-sum": "seq-mean-token-sum", "seq-mean-token-sum-norm": "seq-mean-token-sum-norm",
                "bnpo": "token-mean", "dapo": "token-mean"}
AGGREGATIONS_THEIRS_ONLY = ("token-sum",)
# Our KL_PENALTIES name -> verl's kl_penalty name. verl's "k3" is clamped exactly as its "low_var_kl" (our
# low_var_kl), so our unclamped k3 (DeepSeekMath's, TRL's) maps to it only up to that clamp.
KL = {"k1": "k1", "k2": "k2", "k3": "k3", "low_var_kl": "low_var_kl", "abs": "abs",
      "k1+": "k1+", "k2+": "k2+", "k3+": "k3+", "low_var_kl+": "low_var_kl+", "abs+": "abs+"}
# Our option (GRPOConfig / PPOConfig field) -> verl's config key.
KNOBS = {
    "epsilon": "actor.clip_ratio_low", "epsilon_high": "actor.clip_ratio_high", "clip_ratio_c": "actor.clip_ratio_c",
    "beta": "actor.kl_loss_coef (use_kl_loss)", "kl_loss_type": "actor.kl_loss_type",
    "loss_aggregation": "actor.loss_agg_mode", "entropy_coef": "actor.entropy_coeff",
    "scale_rewards": "algorithm.norm_adv_by_std_in_grpo (group / none)", "level": "policy_loss.loss_mode=gspo",
    "sapo_temperature_pos": "actor.tau_pos", "sapo_temperature_neg": "actor.tau_neg",
    "clip_cov_ratio": "policy_loss.clip_cov_ratio", "clip_cov_lb": "policy_loss.clip_cov_lb",
    "clip_cov_ub": "policy_loss.clip_cov_ub", "kl_cov_ratio": "policy_loss.kl_cov_ratio",
    "kl_cov_coef": "policy_loss.ppo_kl_coef", "importance_sampling_mode": "algorithm.rollout_correction.rollout_is",
    "overlong_buffer_len": "reward overlong_buffer (DAPO recipe)", "dynamic_sampling": "algorithm.filter_groups",
    "mu": "actor.ppo_epochs", "gamma": "algorithm.gamma", "lam": "algorithm.lam", "value_clip": "critic.cliprange_value",
    "whiten_advantages": "(always, in compute_gae_advantage_return)",
}
# Our sampler correction (importance_sampling_mode) -> verl's algorithm.rollout_correction.
CORRECTIONS = {"token_truncate": "rollout_is=token (TIS)", "sequence_truncate": "rollout_is=sequence",
               "token_mask": "rollout_is=token with LOW_HIGH (IcePop)",
               "sequence_geometric_mask": "rollout_rs=seq_mean_k1 (Geo-RS; its band on pi_rollout / pi_old)",
               "bypass": "bypass_mode=True, loss_type=ppo_clip"}
CORRECTIONS_THEIRS_ONLY = ("rollout_rs=token_k*/seq_sum_k*/seq_max_k*", "bypass loss_type=reinforce")
# The value loss, whitening and the critic's KL-in-reward, PPO's pieces.
PPO = {"gae": "compute_gae_advantage_return", "masked_whiten": "verl.utils.torch_functional.masked_whiten",
       "value_loss": "compute_value_loss", "policy_loss": "vanilla", "kl_in_reward": "compute_rewards (k1)"}


def core():
    """``verl.trainer.ppo.core_algos`` from the cache folder (MissingFramework when it is not there)."""
    return install.import_module(FRAMEWORK, "verl.trainer.ppo.core_algos")


def torch_functional():
    return install.import_module(FRAMEWORK, "verl.utils.torch_functional")


def actor_config(*, epsilon: float = 0.2, epsilon_high: Optional[float] = None, clip_ratio_c: float = 3.0,
                 loss_agg_mode: str = "token-mean", loss_scale_factor: Optional[int] = None, **fields):
    """A real ``verl.workers.config.ActorConfig`` (its policy losses assert the type) with our clip settings;
    ``fields``: other ActorConfig fields (tau_pos, entropy_coeff, ...) or ``policy_loss`` PolicyLossConfig fields."""
    config_module = install.import_module(FRAMEWORK, "verl.workers.config")
    loss_fields = {k: fields.pop(k) for k in list(fields) if k in ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub",
                                                                    "kl_cov_ratio", "ppo_kl_coef", "loss_mode",
                                                                    "rollout_correction")}
    return config_module.ActorConfig(
        strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio=epsilon, clip_ratio_low=epsilon,
        clip_ratio_high=epsilon if epsilon_high is None else epsilon_high, clip_ratio_c=clip_ratio_c,
        loss_agg_mode=loss_agg_mode, loss_scale_factor=loss_scale_factor,
        policy_loss=config_module.PolicyLossConfig(**loss_fields), **fields)


def algo_config(**fields):
    return install.import_module(FRAMEWORK, "verl.trainer.config").AlgoConfig(**fields)


def _token_advantages(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages) * mask


def policy_loss(loss_mode: str, logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, *, loss_agg_mode: str = "token-mean", **config) -> torch.Tensor:
    """verl's registered policy loss ``loss_mode`` (``get_policy_loss_fn``) on (B, T) tensors; ``advantages`` (B,)
    per completion or (B, T); ``config``: ``actor_config`` arguments. Returns the scalar loss."""
    fn = core().get_policy_loss_fn(loss_mode)
    loss, _ = fn(old_log_prob=old_logps, log_prob=logps, advantages=_token_advantages(advantages, mask),
                 response_mask=mask, loss_agg_mode=loss_agg_mode,
                 config=actor_config(loss_agg_mode=loss_agg_mode, **config))
    return loss


def rollout_correction(**fields):
    """A real ``RolloutCorrectionConfig`` (``rollout_is``, ``rollout_rs``, ``rollout_rs_threshold``, ``bypass_mode``,
    ``loss_type``); its default ``rollout_is="sequence"`` is turned off unless asked for."""
    module = install.import_module(FRAMEWORK, "verl.trainer.config.algorithm")
    return module.RolloutCorrectionConfig(**{"rollout_is": None, **fields})


def rollout_rejection_mask(old_logps: torch.Tensor, rollout_logps: torch.Tensor, mask: torch.Tensor, rollout_rs: str,
                           threshold) -> torch.Tensor:
    """``rollout_corr_helper.compute_rollout_rejection_mask`` on log(pi_old / pi_rollout): the (B, T) response mask
    with the rejected tokens (or sequences) zeroed. Geo-RS is ``rollout_rs="seq_mean_k1"`` with "LOW_HIGH" bounds on
    the geometric-mean ratio (its preset ``decoupled_geo_rs``)."""
    helper = install.import_module(FRAMEWORK, "verl.trainer.ppo.rollout_corr_helper")
    kept, _ = helper.compute_rollout_rejection_mask(old_logps - rollout_logps, mask, rollout_rs=rollout_rs,
                                                    rollout_rs_threshold=threshold)
    return kept


def bypass_loss(logps, rollout_logps, advantages, mask, *, loss_agg_mode: str = "token-mean",
                loss_type: str = "ppo_clip", rollout_rs: Optional[str] = None, rollout_rs_threshold=None, rollout_is: Optional[str] = None,
                rollout_is_threshold=2.0, **config) -> torch.Tensor:
    """verl's bypass mode (``apply_bypass_mode`` then ``compute_policy_loss_bypass_mode``): the rollout's log-probs
    stand for the old ones, its rejection mask (``rollout_rs``) applied, then PPO's clip ("ppo_clip") or REINFORCE
    with the IS weights ("reinforce")."""
    correction = rollout_correction(bypass_mode=True, loss_type=loss_type, rollout_rs=rollout_rs,
                                    rollout_rs_threshold=rollout_rs_threshold, rollout_is=rollout_is,
                                    rollout_is_threshold=rollout_is_threshold)
    return policy_loss("bypass_mode", logps, rollout_logps, advantages, mask, loss_agg_mode=loss_agg_mode,
                       rollout_correction=correction, **config)


def agg_loss(values: torch.Tensor, mask: torch.Tensor, mode: str, loss_scale_factor: Optional[int] = None) -> torch.Tensor:
    return core().agg_loss(loss_mat=values, loss_mask=mask, loss_agg_mode=mode, loss_scale_factor=loss_scale_factor)


def kl_penalty(logps: torch.Tensor, ref_logps: torch.Tensor, name: str) -> torch.Tensor:
    return core().kl_penalty(logps, ref_logps, name)


def actor_loss(loss_mode: str, logps, old_logps, advantages, mask, *, loss_agg_mode: str = "token-mean",
               ref_logps=None, kl_loss_coef: float = 0.0, kl_loss_type: str = "low_var_kl", entropies=None,
               entropy_coeff: float = 0.0, loss_scale_factor: Optional[int] = None, **config) -> torch.Tensor:
    """The actor's loss as ``verl.workers.utils.losses.ppo_loss`` composes it: policy loss, minus entropy_coeff times
    the entropy aggregated with loss_agg_mode, plus kl_loss_coef times the KL aggregated likewise."""
    loss = policy_loss(loss_mode, logps, old_logps, advantages, mask, loss_agg_mode=loss_agg_mode,
                       loss_scale_factor=loss_scale_factor, **config)
    if entropies is not None:
        loss = loss - entropy_coeff * agg_loss(entropies, mask, loss_agg_mode, loss_scale_factor)
    if kl_loss_coef:
        loss = loss + kl_loss_coef * agg_loss(kl_penalty(logps, ref_logps, kl_loss_type), mask, loss_agg_mode,
                                              loss_scale_factor)
    return loss


def outcome_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """verl's token_level_rewards of an outcome reward: the score on the last active token (position 0 of a row
    without one, where verl's sum reads it all the same)."""
    last = (mask.size(1) - 1 - mask.long().flip(1).argmax(1)).clamp(min=0)
    last = torch.where(mask.sum(1) > 0, last, torch.zeros_like(last))
    return torch.zeros_like(mask, dtype=rewards.dtype).scatter(1, last.unsqueeze(1), rewards.unsqueeze(1))


def advantages(name: str, rewards: torch.Tensor, mask: torch.Tensor, group_size: int, *, epsilon: float = 1e-6,
               norm_adv_by_std_in_grpo: bool = True, gamma: float = 1.0, baseline_rewards=None, old_logps=None,
               sum_pi_squared=None) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's registered estimator ``name`` (``get_adv_estimator_fn``) on one reward per completion, grouped
    ``group_size`` rows at a time; returns its (advantages, returns), (B, T) each."""
    mask = mask.to(rewards.dtype)
    index = np.repeat(np.arange(rewards.numel() // group_size), group_size)
    fn = core().get_adv_estimator_fn(name)
    config = algo_config(gamma=gamma, norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo)
    token_rewards = outcome_rewards(rewards, mask)
    if name == "remax":
        return fn(token_level_rewards=token_rewards, reward_baselines=baseline_rewards, response_mask=mask, config=config)
    if name == "reinforce_plus_plus":
        return fn(token_level_rewards=token_rewards, response_mask=mask, config=config)
    if name in ("optimal_token_baseline", "tir_optimal_token_baseline"):
        return fn(token_level_rewards=token_rewards, response_mask=mask, index=index, old_log_probs=old_logps,
                  sum_pi_squared=sum_pi_squared)
    if name in ("grpo", "grpo_vectorized"):
        return fn(token_level_rewards=token_rewards, response_mask=mask, index=index, epsilon=epsilon,
                  norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo, config=config)
    return fn(token_level_rewards=token_rewards, response_mask=mask, index=index, epsilon=epsilon, config=config)


def gae(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float):
    """``compute_gae_advantage_return``: (advantages whitened over the batch's tokens, returns)."""
    return core().compute_gae_advantage_return(token_level_rewards=token_rewards, values=values, response_mask=mask,
                                               gamma=gamma, lam=lam)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch_functional().masked_whiten(values, mask)


def value_loss(values, old_values, returns, mask, clip: float, loss_agg_mode: str = "token-mean") -> torch.Tensor:
    loss, _ = core().compute_value_loss(vpreds=values, returns=returns, values=old_values, response_mask=mask,
                                        cliprange_value=clip, loss_agg_mode=loss_agg_mode)
    return loss


def registered() -> dict[str, list[str]]:
    """verl's own registries as installed (a check that the mapping tables above name real entries)."""
    module = core()
    return {"estimators": sorted(module.ADV_ESTIMATOR_REGISTRY), "policy_losses": sorted(module.POLICY_LOSS_REGISTRY)}


@register_adapter
class Verl(Adapter):
    """verl in the feature table."""

    name, column, heading = FRAMEWORK, "verl", f"verl {VERSION}"
    has = {"estimators": ESTIMATORS, "policy_losses": POLICY_LOSSES, "aggregations": AGGREGATIONS, "kl": KL,
           "corrections": CORRECTIONS}
    theirs_only = {"estimators": ESTIMATORS_THEIRS_ONLY, "policy_losses": POLICY_LOSSES_THEIRS_ONLY,
                   "aggregations": AGGREGATIONS_THEIRS_ONLY, "corrections": CORRECTIONS_THEIRS_ONLY}
    cells = {
        "algorithms": {"grpo": "algorithm.adv_estimator=grpo", "ppo": "algorithm.adv_estimator=gae + critic",
                       "rloo": "algorithm.adv_estimator=rloo",
                       "reinforce_pp": "algorithm.adv_estimator=reinforce_plus_plus(_baseline)"},
        "policy_losses": {ours: f"{mode} + {agg or 'its own mean'}" for ours, (mode, agg) in POLICY_LOSSES.items()},
        "ppo": PPO,
    }
    options = KNOBS
    sequence_level = f"loss_mode={SEQUENCE_LEVEL_LOSS}"
