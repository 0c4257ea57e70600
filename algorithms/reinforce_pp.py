"""REINFORCE++ (Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language
Models"), as OpenRLHF implements it (``--algo.advantage.estimator reinforce`` / ``reinforce_baseline``).

PPO's tricks without a critic: every token pays -kl_coef * KL(pi_old || pi_ref) (k1 by default) and the
last token also gets the score; a token's return is the sum of the rewards from it to the end (gamma 1);
the returns are whitened over every token of the batch, and PPO's clipped surrogate is averaged over
tokens. REINFORCE++-baseline (``group_baseline``) first subtracts each prompt's mean score over its
group, which makes it robust to the reward's scale (OpenRLHF's choice for verifiable rewards).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from algorithms.base import Algorithm, AlgoConfig, register_algorithm
from algorithms.kl import KL_ESTIMATORS, approx_kl
from algorithms.losses import (
    carries_signal, masked_mean, masked_mean_per_sequence, ppo_clip_fraction, ppo_policy_loss,
    reinforce_pp_advantages,
)
from algorithms.policy_losses import aggregate_token_mean


@dataclass
class REINFORCEPPConfig(AlgoConfig):
    samples_per_prompt: int = field(default=4, metadata={"help": "completions per prompt (OpenRLHF n_samples_per_prompt: 1; 4 like this suite's REINFORCE and PPO)"})
    group_baseline: bool = field(default=False, metadata={"help": "REINFORCE++-baseline: subtract each prompt's mean score first (OpenRLHF reinforce_baseline; needs samples_per_prompt >= 2)"})
    mu: int = field(default=1, metadata={"help": "policy updates per generation batch (OpenRLHF max_epochs: 1)"})
    epsilon: float = field(default=0.2, metadata={"help": "lower clip range 1 - epsilon (OpenRLHF eps_clip: 0.2)"})
    epsilon_high: Optional[float] = field(default=None, metadata={"help": "upper clip range 1 + epsilon_high (OpenRLHF eps_clip_low_high: default epsilon)"})
    kl_coef: float = field(default=0.01, metadata={"help": "KL penalty weight (OpenRLHF kl.init_coef: 0.01; 0 skips the reference)"})
    kl_estimator: str = field(default="k1", metadata={"help": "per-token KL estimator (OpenRLHF: k1; k2 or k3 with kl_in_loss)", "choices": KL_ESTIMATORS})
    kl_in_loss: bool = field(default=False, metadata={"help": "add kl_coef * mean token KL to the loss instead of the reward (OpenRLHF kl.use_loss: off)"})
    gamma: float = field(default=1.0, metadata={"help": "discount of the per-token return (OpenRLHF: 1.0; must be 1 with group_baseline)"})
    reward_clip_min: Optional[float] = field(default=-10.0, metadata={"help": "clip the (baseline-subtracted) score from below (OpenRLHF reward.clip_range: -10)"})
    reward_clip_max: Optional[float] = field(default=10.0, metadata={"help": "clip the (baseline-subtracted) score from above (OpenRLHF reward.clip_range: 10)"})
    advantage_std_norm: bool = field(default=True, metadata={"help": "divide the whitened advantages by their std (OpenRLHF: on; --algo.advantage.no_std_norm turns it off)"})

    def validate(self) -> None:
        super().validate()
        if self.samples_per_prompt < 1:
            raise ValueError(f"samples_per_prompt must be >= 1, got {self.samples_per_prompt}")
        if self.group_baseline and self.samples_per_prompt < 2:
            raise ValueError(f"group_baseline needs samples_per_prompt >= 2, got {self.samples_per_prompt}")
        if self.group_baseline and self.gamma != 1.0:
            raise ValueError(f"group_baseline needs gamma = 1.0 (OpenRLHF forces it), got {self.gamma}")
        if self.mu < 1:
            raise ValueError(f"mu must be >= 1, got {self.mu}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"unknown kl_estimator {self.kl_estimator!r}; choose from {', '.join(KL_ESTIMATORS)}")
        for name in ("epsilon", "epsilon_high", "kl_coef"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        low, high = self.reward_clip_min, self.reward_clip_max
        if low is not None and high is not None and low >= high:
            raise ValueError(f"reward_clip_min ({low}) must be less than reward_clip_max ({high})")

    def completions_per_step(self) -> int:
        return self.prompts_per_step * self.samples_per_prompt


@register_algorithm
class REINFORCEPP(Algorithm):
    name = "reinforce_pp"
    Config = REINFORCEPPConfig

    @classmethod
    def needs_reference(cls, config) -> bool:
        return config.kl_coef > 0

    def train_step(self, prompts: list[str]) -> dict[str, float]:
        c: REINFORCEPPConfig = self.config
        rollout = self.generate(prompts, c.samples_per_prompt)  # 1 generate
        scores = self.score(rollout)  # 2 score
        mask = rollout.completion_mask.float()
        ref_logps = self.frozen_logps(self.ref_policy, rollout) if c.kl_coef > 0 else None  # 3 reference log-probs

        old_logps, sums = None, {"loss/policy": 0.0, "loss/kl": 0.0, "clipfrac": 0.0, "grad_norm": 0.0}
        for iteration in range(1, c.mu + 1):  # 5 update(s); the first forward also gives the old log-probs
            with self.timer("update"):
                if iteration == 1:
                    logps, entropy = self.logps(self.policy, rollout, with_entropy=True)
                    old_logps = logps.detach()
                    in_reward = ref_logps is not None and not c.kl_in_loss
                    kl = approx_kl(old_logps, ref_logps, c.kl_estimator) if in_reward else torch.zeros_like(old_logps)
                    # 4 advantages, from the batch as sampled, whitened over the global batch (every rank's tokens)
                    advantages, returns = self.on_global_batch(
                        lambda scores, kl, mask: reinforce_pp_advantages(
                            scores, kl, mask, kl_coef=c.kl_coef, group_size=c.samples_per_prompt,
                            group_baseline=c.group_baseline, gamma=c.gamma, reward_clip_min=c.reward_clip_min,
                            reward_clip_max=c.reward_clip_max, std_norm=c.advantage_std_norm),
                        scores, kl, mask)
                    # No signal (every advantage 0, no KL loss): no step, which AdamW's momentum would still take.
                    # Decided over every rank: a rank that skipped the gradient all-reduce would hang the others.
                    kl_term = c.kl_in_loss and ref_logps is not None and bool(mask.any())
                    signal = self.any_rank(kl_term or carries_signal(advantages, mask))
                    # Token means over the global batch's active tokens (None in one process: this mask's).
                    num_tokens = self.data_parallel_token_count(mask)
                else:
                    logps = self.logps(self.policy, rollout)
                policy_loss = ppo_policy_loss(logps, old_logps, advantages, mask, c.epsilon, c.epsilon_high,
                                              num_tokens=num_tokens)
                kl_loss = (aggregate_token_mean(approx_kl(logps, ref_logps, c.kl_estimator), mask, None, num_tokens)
                           if c.kl_in_loss and ref_logps is not None else torch.zeros_like(policy_loss))
                loss = policy_loss + c.kl_coef * kl_loss
                if signal:
                    sums["grad_norm"] += self.update(loss)
            sums["loss/policy"] += policy_loss.item()
            sums["loss/kl"] += c.kl_coef * kl_loss.item()  # as it enters the loss (0 where the KL is in the reward)
            sums["clipfrac"] += ppo_clip_fraction(logps, old_logps, advantages, mask, c.epsilon, c.epsilon_high).item()

        metrics = {k: v / c.mu for k, v in sums.items()}  # 6 metrics
        metrics["loss"] = metrics["loss/policy"] + metrics["loss/kl"]
        if not (c.kl_in_loss and ref_logps is not None):
            del metrics["loss/kl"]  # the KL sits in the reward: no part of the loss
        metrics["skipped_update"] = float(not signal)
        metrics.update(self.kl_metrics(old_logps, ref_logps, mask, c.kl_estimator))
        metrics["entropy"] = masked_mean_per_sequence(entropy, mask).mean().item()
        metrics.update(self.rollout_metrics(rollout, scores))
        metrics.update(self.advantage_metrics(advantages, mask))
        metrics["return/mean"] = masked_mean(returns, mask).item()
        return metrics
