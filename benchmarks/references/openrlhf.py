"""OpenRLHF 0.11.2 as a reference: ``PolicyLoss``, ``ValueLoss`` and ``aggregate_loss`` (``openrlhf/models/loss.py``),
``compute_approx_kl`` and ``compute_reward`` (``openrlhf/models/utils.py``) and the advantage code of
``RemoteExperienceMaker.compute_advantages_and_returns`` (``openrlhf/trainer/ppo_utils/experience_maker.py``), called
on our tensors. No engine is imported: DeepSpeed and the Ray launcher are stand-ins while those modules import, and
the packages whose ``__init__`` pulls in the actor model are registered bare (``install.import_module``).

The experience maker's method is the framework's own code, run on an instance built without ``__init__``: it reads
``self.strategy.args`` (a namespace holding the few settings it needs), ``self.kl_ctl.value`` and
``self.advantage_estimator``, and experiences that carry ``rewards``, ``kl``, ``action_mask``, ``values``, ``index``
and ``info``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

import torch

from benchmarks.references import install
from benchmarks.references.adapters import Adapter, register_adapter

FRAMEWORK = "openrlhf"
VERSION = install.PINNED[FRAMEWORK].version

_BARE = ("openrlhf", "openrlhf.models", "openrlhf.trainer", "openrlhf.trainer.ppo_utils", "openrlhf.trainer.ray",
         "openrlhf.utils")
_STAND_INS = ("deepspeed", "openrlhf.trainer.ray.launcher")

# Our advantage estimator (algorithms/estimators.py; "gae": algorithms/losses.gae) -> OpenRLHF's
# --advantage_estimator. Its group_norm is GRPO's group standardisation (eps 1e-9), dr_grpo the same without the std.
ESTIMATORS = {"reinforce_plus_plus": "reinforce", "reinforce_plus_plus_baseline": "reinforce_baseline",
              "rloo": "rloo", "grpo": "group_norm", "grpo(scale=none)": "dr_grpo", "gae": "gae",
              "flash_reinforce": "flash_reinforce"}
# Our policy loss (loss_type) -> (OpenRLHF's policy_loss_type, its aggregation): token_level_loss True is our
# token-mean, False the mean of per-sequence token means over the sequences that have a token.
POLICY_LOSSES = {"bnpo": ("ppo", "token"), "dapo": ("ppo", "token"), "dual_clip": ("ppo + dual_clip", "token"),
                 "grpo": ("ppo", "sequence")}
SEQUENCE_LEVEL_LOSS = "gspo"
AGGREGATIONS = {"token-mean": "token_level_loss=True", "bnpo": "token_level_loss=True",
                "dapo": "token_level_loss=True", "seq-mean-token-mean": "token_level_loss=False"}
# Our KL_PENALTIES name -> OpenRLHF's kl_estimator (values clamped to [-10, 10]; "+": unbiased_gradient, k2's gradient).
KL = {"k1": "k1", "k2": "k2", "k3": "k3", "k1+": "k1 (unbiased_gradient)", "k2+": "k2 (unbiased_gradient)",
      "k3+": "k3 (unbiased_gradient)"}
# Our sampler correction (importance_sampling_mode) -> OpenRLHF's algo.advantage.is_correction_*.
CORRECTIONS = {"gated": "is_correction_level / _mode / _gating (ratio, binary_kl, tv) / _threshold",
               "token_truncate": "is_correction_level=token, mode=clip (TIS)",
               "token_mask": "is_correction_level=token, mode=mask (ICEPOP; keeps the IS weight)"}
KNOBS = {"epsilon": "eps_clip_low_high", "epsilon_high": "eps_clip_low_high", "clip_ratio_c": "dual_clip",
         "kl_coef": "init_kl_coef", "kl_loss_type": "kl_estimator", "beta": "init_kl_coef (use_kl_loss)",
         "value_clip": "value_clip", "gamma": "gamma", "lam": "lambd", "whiten_advantages": "(always, gae/reinforce)",
         "reward_clip_min": "reward.clip_range[0]", "reward_clip_max": "reward.clip_range[1]",
         "advantage_std_norm": "not algo.advantage.no_std_norm", "group_baseline": "advantage_estimator=reinforce_baseline", "overlong_buffer_len": "overlong_buffer_len",
         "level": "policy_loss_type=gspo"}


def loss_module():
    return install.import_module(FRAMEWORK, "openrlhf.models.loss", stand_ins=_STAND_INS, bare_packages=_BARE)


def utils_module():
    return install.import_module(FRAMEWORK, "openrlhf.models.utils", stand_ins=_STAND_INS, bare_packages=_BARE)


def experience_module():
    return install.import_module(FRAMEWORK, "openrlhf.trainer.ppo_utils.experience_maker", stand_ins=_STAND_INS,
                                 bare_packages=_BARE)


def policy_loss(logps, old_logps, advantages, mask, *, epsilon: float = 0.2, epsilon_high: Optional[float] = None,
                dual_clip: Optional[float] = None, token_level_loss: bool = True, policy_loss_type: str = "ppo",
                rollout_logps=None, **is_correction) -> torch.Tensor:
    """``PolicyLoss(...)(log_probs, old_log_probs, advantages, action_mask, rollout_log_probs)``; ``advantages`` (B,)
    or (B, T). ``is_correction``: its train/rollout mismatch correction, ``level`` (token / seq), ``mode`` (mask /
    clip), ``gating`` (ratio / binary_kl / tv) and ``threshold`` (low, high): the ``is_correction_*`` arguments."""
    fn = loss_module().PolicyLoss(clip_eps_low=epsilon, clip_eps_high=epsilon if epsilon_high is None else epsilon_high,
                                  dual_clip=dual_clip, token_level_loss=token_level_loss,
                                  policy_loss_type=policy_loss_type,
                                  **{f"is_correction_{k}": v for k, v in is_correction.items()})
    token_advantages = advantages.unsqueeze(-1) * mask if advantages.dim() == 1 else advantages
    return fn(logps, old_logps, token_advantages, action_mask=mask, rollout_log_probs=rollout_logps)[0]


def value_loss(values, old_values, returns, mask, clip: Optional[float], token_level_loss: bool = True) -> torch.Tensor:
    return loss_module().ValueLoss(clip_eps=clip, token_level_loss=token_level_loss)(values, old_values, returns,
                                                                                     action_mask=mask)


def approx_kl(logps, ref_logps, estimator: str = "k1", unbiased_gradient: bool = False, old_logps=None) -> torch.Tensor:
    return utils_module().compute_approx_kl(logps, ref_logps, log_probs_old=old_logps, kl_estimator=estimator,
                                            unbiased_gradient=unbiased_gradient)


def compute_reward(scores, kl_coef: float, kl, mask, clip_range=None) -> torch.Tensor:
    return utils_module().compute_reward(scores, kl_coef, kl, action_mask=mask, reward_clip_range=clip_range)


def advantages(estimator: str, scores: torch.Tensor, mask: torch.Tensor, group_size: int, *, kl=None,
               kl_coef: float = 0.0, values=None, gamma: float = 1.0, lambd: float = 0.95,
               clip_range=(-10.0, 10.0), no_std_norm: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``RemoteExperienceMaker.compute_advantages_and_returns`` on one experience holding the batch: the reward
    shaping of ``estimator`` (rloo / reinforce_baseline / group_norm / dr_grpo / ...), ``compute_reward`` (the score
    on the last active token, ``-kl_coef * kl`` on every token, the reward clip), GAE or the cumulative return, and
    the batch whitening of gae / reinforce / reinforce_baseline. Returns (advantages, returns), (B, T) each."""
    module = experience_module()
    maker = object.__new__(module.RemoteExperienceMaker)
    args = SimpleNamespace(
        algo=SimpleNamespace(advantage=SimpleNamespace(estimator=estimator, gamma=gamma, lambd=lambd,
                                                       no_std_norm=no_std_norm)),
        rollout=SimpleNamespace(n_samples_per_prompt=group_size, max_new_tokens=mask.size(1)),
        reward=SimpleNamespace(clip_range=clip_range, overlong_buffer_len=None, stop_properly_penalty_coef=None),
        data=SimpleNamespace(max_len=mask.size(1)))
    maker.strategy = SimpleNamespace(args=args)
    maker.args = args
    maker.advantage_estimator = estimator
    maker.kl_ctl = SimpleNamespace(value=kl_coef)
    experience = SimpleNamespace(
        rewards=scores.clone(), index=list(range(scores.numel())), info={}, action_mask=mask,
        kl=torch.zeros_like(mask, dtype=scores.dtype) if kl is None else kl,
        values=torch.zeros_like(mask, dtype=scores.dtype) if values is None else values,
        response_length=mask.sum(-1), truncated=None)
    (done,) = maker.compute_advantages_and_returns([experience])
    return done.advantages, done.returns


@register_adapter
class OpenRLHF(Adapter):
    """OpenRLHF in the feature table."""

    name, column, heading = FRAMEWORK, "OpenRLHF", f"OpenRLHF {VERSION}"
    has = {"estimators": ESTIMATORS, "policy_losses": POLICY_LOSSES, "aggregations": AGGREGATIONS, "kl": KL,
           "corrections": CORRECTIONS}
    cells = {
        "algorithms": {"grpo": "advantage_estimator=group_norm", "ppo": "advantage_estimator=gae + critic",
                       "rloo": "advantage_estimator=rloo",
                       "reinforce_pp": "advantage_estimator=reinforce / reinforce_baseline", "dpo": "DPOTrainer"},
        "policy_losses": {ours: f"PolicyLoss({mode}, {agg}-level)" for ours, (mode, agg) in POLICY_LOSSES.items()},
        "ppo": {"gae": "get_advantages_and_returns", "masked_whiten": "batch whitening (biased var)",
                "value_loss": "ValueLoss", "policy_loss": "PolicyLoss(ppo)", "kl_in_reward": "compute_reward"},
    }
    options = KNOBS
    sequence_level = f"policy_loss_type={SEQUENCE_LEVEL_LOSS}"
