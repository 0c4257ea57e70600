"""SkyRL 0.4.0 as a reference: its registered advantage estimators (``compute_maxrl_advantage``, GRPO's, RLOO's,
REINFORCE++'s, GAE), ``compute_approx_kl``, the trainer's reward shaping (``apply_reward_kl_penalty``) and its
off-policy correction (``skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py``: the sequence masks of
``sequence_mask_metric`` product / geometric, the outlier-token rejection, the TIS ratio, and ``ppo_policy_loss``
with them applied), called on our tensors.

SkyRL 0.4.0 declares Python >= 3.12, but the two modules the adapter imports (``ppo_utils`` and
``off_policy_correction_utils``) use nothing newer than 3.11, so they run in this interpreter: its wheel is fetched
as a 3.12 wheel into its own folder (``install.PINNED["skyrl"]``, with jaxtyping and loguru beside it). No engine is
imported: the packages whose ``__init__`` pulls in the Tinker backends are registered bare, and ``skyrl_gym`` (whose
two environment configs the config module names) is a stand-in while the modules import. The trainer module (Ray
actors, inference engines) is not imported: its one method compared is compiled from its file, as ms-swift's are.

Our tensors are the suite's: ``mask`` (B, T), one reward per completion (on the last active token, where SkyRL's
token-level rewards put it), ``old_logps`` the trainer's log-probs before the update and ``rollout_logps`` the
sampler's.
"""

from __future__ import annotations

import ast
from types import SimpleNamespace
from typing import Any, Optional

import numpy as np
import torch

from benchmarks.references import install
from benchmarks.references.adapters import Adapter, register_adapter
from benchmarks.references.verl import outcome_rewards

FRAMEWORK = "skyrl"
VERSION = install.PINNED[FRAMEWORK].version

_cache: dict = {}
_BARE = ("skyrl.backends", "skyrl.backends.skyrl_train", "skyrl.backends.skyrl_train.utils")
_STAND_INS = ("skyrl_gym", "skyrl_gym.envs", "skyrl_gym.envs.search", "skyrl_gym.envs.search.env",
              "skyrl_gym.envs.sql", "skyrl_gym.envs.sql.env")

# Our advantage estimator -> SkyRL's registered name (AdvantageEstimatorRegistry).
ESTIMATORS = {"grpo": "grpo", "rloo": "rloo", "reinforce_plus_plus": "reinforce++", "maxrl": "maxrl", "gae": "gae"}
# Our policy loss (loss_type) -> SkyRL's policy_loss_type (PolicyLossRegistry).
POLICY_LOSSES = {"bnpo": "regular", "dapo": "regular", "dual_clip": "dual_clip", "cispo": "cispo", "sapo": "sapo",
                 "clip_cov": "clip_cov", "kl_cov": "kl_cov"}
POLICY_LOSSES_THEIRS_ONLY = ("rollout_is", "dppo", "cross_entropy", "importance_sampling")
SEQUENCE_LEVEL_LOSS = "gspo"
AGGREGATIONS = {"token-mean": "token_mean", "bnpo": "token_mean", "dapo": "token_mean",
                "seq-mean-token-mean": "sequence_mean", "seq-mean-token-sum-norm": "seq_mean_token_sum_norm"}
AGGREGATIONS_THEIRS_ONLY = ("prompt_mean",)
KL = {"k1": "k1", "k2": "k2", "k3": "k3 (clamped)", "low_var_kl": "k3", "abs": "abs"}
PPO = {"gae": "compute_gae_advantage_return", "masked_whiten": "masked_whiten (unbiased var)",
       "kl_in_reward": "apply_reward_kl_penalty (use_kl_in_reward)"}
KNOBS = {"epsilon": "algorithm.eps_clip_low", "epsilon_high": "algorithm.eps_clip_high",
         "clip_ratio_c": "algorithm.clip_ratio_c", "loss_aggregation": "algorithm.loss_reduction",
         "beta": "algorithm.kl_loss_coef (use_kl_loss)", "kl_loss_type": "algorithm.kl_estimator_type",
         "scale_rewards": "algorithm.grpo_norm_by_std", "level": "policy_loss_type=gspo"}
# Our sampler correction (importance_sampling_mode) -> SkyRL's algorithm.off_policy_correction.
CORRECTIONS = {"sequence_geometric_mask": "sequence_mask_metric=geometric (geo_mask_low/high)",
               "sequence_outlier_mask": "outlier_token_is_threshold_low/high",
               "token_truncate": "tis_ratio_type=token", "sequence_truncate": "tis_ratio_type=sequence"}
CORRECTIONS_THEIRS_ONLY = ("sequence_mask_metric=product (0/1)", "token_mask_is_threshold_low/high")


def ppo_utils():
    """``skyrl.backends.skyrl_train.utils.ppo_utils`` from the cache folder (MissingFramework when absent)."""
    return install.import_module(FRAMEWORK, "skyrl.backends.skyrl_train.utils.ppo_utils", stand_ins=_STAND_INS,
                                 bare_packages=_BARE)


def correction_utils():
    return install.import_module(FRAMEWORK, "skyrl.backends.skyrl_train.utils.off_policy_correction_utils",
                                 stand_ins=_STAND_INS, bare_packages=_BARE)


def _config_module():
    ppo_utils()  # imports skyrl.train.config under the stand-ins first
    return install.import_module(FRAMEWORK, "skyrl.train.config", stand_ins=_STAND_INS, bare_packages=_BARE)


def off_policy_config(**fields):
    """A real ``OffPolicyCorrectionConfig`` (SkyRL's defaults, ``fields`` over them)."""
    return _config_module().OffPolicyCorrectionConfig(**fields)


def algorithm_config(*, epsilon: float = 0.2, epsilon_high: Optional[float] = None, clip_ratio_c: float = 3.0,
                     policy_loss_type: str = "regular", **correction):
    """A real ``AlgorithmConfig`` with our clip settings and the off-policy correction ``correction``."""
    module = _config_module()
    return module.AlgorithmConfig(
        policy_loss_type=policy_loss_type, eps_clip_low=epsilon,
        eps_clip_high=epsilon if epsilon_high is None else epsilon_high, clip_ratio_c=clip_ratio_c,
        off_policy_correction=module.OffPolicyCorrectionConfig(**correction))


def advantages(name: str, rewards: torch.Tensor, mask: torch.Tensor, group_size: int, **options) -> torch.Tensor:
    """SkyRL's registered estimator ``name`` (``AdvantageEstimatorRegistry.get``) on one reward per completion (on
    the last active token, as verl's ``outcome_rewards`` puts it; the outcome estimators sum it back), grouped
    ``group_size`` rows at a time; its (B, T) advantages."""
    fn = ppo_utils().AdvantageEstimatorRegistry.get(name)
    index = np.repeat(np.arange(rewards.numel() // group_size), group_size)
    mask = mask.to(rewards.dtype)
    adv, _ = fn(token_level_rewards=outcome_rewards(rewards.clone(), mask), response_mask=mask, index=index,
                **{"gamma": 1.0, **options})
    return adv


def gae(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float):
    """``compute_gae_advantage_return``: (advantages whitened over the batch's tokens, returns)."""
    return ppo_utils().compute_gae_advantage_return(token_level_rewards=token_rewards, values=values,
                                                    response_mask=mask, gamma=gamma, lambd=lam)


def sequence_mask(old_logps: torch.Tensor, rollout_logps: torch.Tensor, mask: torch.Tensor, metric: str,
                  **bounds) -> torch.Tensor:
    """``compute_sequence_mask`` (metric "geometric": exp(mean log-ratio) in [geo_mask_low, geo_mask_high];
    "product": exp(sum) in [product_mask_low, product_mask_high]): (B, 1), 1 where a sequence is kept."""
    kept, _ = correction_utils().compute_sequence_mask(old_logps, rollout_logps, mask, metric,
                                                      off_policy_config(sequence_mask_metric=metric, **bounds))
    return kept


def outlier_token_mask(old_logps: torch.Tensor, rollout_logps: torch.Tensor, mask: torch.Tensor, *,
                       low: Optional[float] = None, high: Optional[float] = None) -> torch.Tensor:
    """``compute_outlier_token_mask``: (B, 1), 0 for a sequence with any active token's ratio outside [low, high]."""
    kept, _ = correction_utils().compute_outlier_token_mask(
        old_logps, rollout_logps, mask,
        off_policy_config(outlier_token_is_threshold_low=low, outlier_token_is_threshold_high=high))
    return kept


def policy_loss(logps, old_logps, rollout_logps, advantages, mask, *, epsilon: float = 0.2,
                epsilon_high: Optional[float] = None, reduction: str = "token_mean", **correction) -> torch.Tensor:
    """``ppo_policy_loss`` ("regular") with the off-policy correction ``correction``, its advantages first scaled by
    ``apply_loss_reduction_to_advantages_minibatch`` (so its sum is the ``reduction``'s mean) as its trainer does;
    ``advantages`` (B,) or (B, T). The scaling reads the mask before the correction; the sum, the mask after."""
    module = ppo_utils()
    token_adv = (advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages) * mask
    scaled = module.apply_loss_reduction_to_advantages_minibatch(token_adv, mask, reduction, mask.size(0),
                                                                 mask.size(1))
    config = algorithm_config(epsilon=epsilon, epsilon_high=epsilon_high, **correction)
    loss, _ = module.ppo_policy_loss(logps, old_logps, scaled, config, loss_mask=mask, rollout_logprobs=rollout_logps)
    return loss


def approx_kl(logps: torch.Tensor, ref_logps: torch.Tensor, estimator: str, mask=None) -> torch.Tensor:
    """``compute_approx_kl`` (k1, k2, k3 clamped as verl's low_var_kl, abs), per token."""
    return ppo_utils().compute_approx_kl(logps, ref_logps, loss_mask=mask, kl_estimator_type=estimator)


_TRAINER = "skyrl/train/trainer.py"
_REWARD_KL = "apply_reward_kl_penalty"


def _reward_kl_method():
    """``RayPPOTrainer.apply_reward_kl_penalty`` compiled from its file (the trainer module imports Ray's actors and
    the inference engines): the reward shaping of ``use_kl_in_reward``."""
    if _REWARD_KL not in _cache:
        tree = ast.parse(install.source_file(FRAMEWORK, _TRAINER).read_text())
        found = [node for cls in tree.body if isinstance(cls, ast.ClassDef) for node in cls.body
                 if isinstance(node, ast.FunctionDef) and node.name == _REWARD_KL]
        if len(found) != 1:
            raise install.MissingFramework(f"{install.PINNED[FRAMEWORK].label}'s {_TRAINER} has no one "
                                           f"{_REWARD_KL}: not the pinned file")
        module = ppo_utils()
        namespace = {"torch": torch, "Any": Any, "TrainingInputBatch": Any, "compute_approx_kl": module.compute_approx_kl,
                     "masked_mean": module.masked_mean}
        exec(compile(ast.Module(body=found, type_ignores=[]), str(install.source_file(FRAMEWORK, _TRAINER)), "exec"),
             namespace)
        _cache[_REWARD_KL] = namespace[_REWARD_KL]
    return _cache[_REWARD_KL]


class _Batch(dict):
    """The trainer's TrainingInputBatch as the method reads it: tensors by key, and ``metadata``."""

    metadata: dict


def reward_kl_penalty(scores: torch.Tensor, logps: torch.Tensor, ref_logps: torch.Tensor, mask: torch.Tensor,
                      kl_coef: float, estimator: str = "k1") -> torch.Tensor:
    """``apply_reward_kl_penalty`` on our tensors: the outcome reward on the last active token, minus kl_coef times
    ``compute_approx_kl`` on every token (its fixed KL controller: ``kl_loss_coef``). (B, T)."""
    data = _Batch(loss_mask=mask, rewards=outcome_rewards(scores, mask), base_action_log_probs=ref_logps,
                  action_log_probs=logps)
    data.metadata = {}
    trainer = SimpleNamespace(reward_kl_controller=None, all_metrics={}, cfg=SimpleNamespace(trainer=SimpleNamespace(
        algorithm=SimpleNamespace(kl_estimator_type=estimator, kl_loss_coef=kl_coef))))
    return _reward_kl_method()(trainer, data)["rewards"]


def registered() -> dict[str, list[str]]:
    """SkyRL's own registries as installed (a check that the mapping tables above name real entries)."""
    module = ppo_utils()
    return {"estimators": sorted(module.AdvantageEstimatorRegistry.list_available()),
            "policy_losses": sorted(module.PolicyLossRegistry.list_available())}


@register_adapter
class SkyRL(Adapter):
    """SkyRL in the feature table."""

    name, column, heading = FRAMEWORK, "SkyRL", f"SkyRL {VERSION}"
    has = {"estimators": ESTIMATORS, "policy_losses": POLICY_LOSSES, "aggregations": AGGREGATIONS, "kl": KL,
           "corrections": CORRECTIONS}
    theirs_only = {"policy_losses": POLICY_LOSSES_THEIRS_ONLY, "aggregations": AGGREGATIONS_THEIRS_ONLY,
                   "corrections": CORRECTIONS_THEIRS_ONLY}
    cells = {
        "algorithms": {"grpo": "advantage_estimator=grpo", "ppo": "advantage_estimator=gae + critic",
                       "rloo": "advantage_estimator=rloo", "reinforce_pp": "advantage_estimator=reinforce++"},
        "policy_losses": {ours: f"policy_loss_type={theirs}" for ours, theirs in POLICY_LOSSES.items()},
        "ppo": PPO,
    }
    options = KNOBS
    sequence_level = f"policy_loss_type={SEQUENCE_LEVEL_LOSS}"
