"""RLOO: REINFORCE Leave-One-Out (Ahmadian et al. 2024, "Back to Basics"; Kool et al. 2019), as TRL 1.16's
RLOOTrainer defines it.

No critic: each prompt gets G completions and a completion's baseline is the mean reward of the other
G - 1. The KL to the reference is TRL's: the k1 estimate summed over the completion's tokens and
subtracted from its reward (beta 0.05), not a loss term. The loss is PPO's clip on the *sequence*
ratio, averaged over completions; at mu = 1 it is REINFORCE with the leave-one-out baseline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from algorithms.base import Algorithm, AlgoConfig, register_algorithm
from algorithms.kl import KL_PENALTIES
from algorithms.losses import (
    carries_signal, masked_mean_per_sequence, rloo_advantages, rloo_clip_fraction, rloo_loss, sequence_logps,
)


@dataclass
class RLOOConfig(AlgoConfig):
    group_size: int = field(default=2, metadata={"help": "G, completions per prompt, >= 2 (TRL's num_generations: 2; the paper: 2 and 4)"})
    mu: int = field(default=1, metadata={"help": "policy updates per generation batch (TRL's num_iterations: 1)"})
    epsilon: float = field(default=0.2, metadata={"help": "lower clip range of the sequence ratio, 1 - epsilon (TRL: 0.2)"})
    epsilon_high: Optional[float] = field(default=None, metadata={"help": "upper clip range 1 + epsilon_high (TRL: default epsilon)"})
    beta: float = field(default=0.05, metadata={"help": "k1 KL to the reference, summed per completion, subtracted from its reward (TRL: 0.05; 0 skips the reference)"})
    normalize_advantages: bool = field(default=False, metadata={"help": "standardise advantages over the batch (TRL: off)"})
    reward_clip_min: Optional[float] = field(default=None, metadata={"help": "clip rewards from below before the baseline (TRL's reward_clip_range: none)"})
    reward_clip_max: Optional[float] = field(default=None, metadata={"help": "clip rewards from above before the baseline (TRL's reward_clip_range: none)"})
    mask_truncated: bool = field(default=False, metadata={"help": "drop completions without EOS from the loss (TRL's mask_truncated_completions: off)"})

    def validate(self) -> None:
        super().validate()
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 for a leave-one-out baseline, got {self.group_size}")
        if self.mu < 1:
            raise ValueError(f"mu must be >= 1, got {self.mu}")
        for name in ("epsilon", "epsilon_high", "beta"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        low, high = self.reward_clip_min, self.reward_clip_max
        if low is not None and high is not None and low > high:
            raise ValueError(f"reward_clip_min ({low}) must be <= reward_clip_max ({high})")

    def completions_per_step(self) -> int:
        return self.prompts_per_step * self.group_size


@register_algorithm
class RLOO(Algorithm):
    name = "rloo"
    Config = RLOOConfig

    def train_step(self, prompts: list[str]) -> dict[str, float]:
        c: RLOOConfig = self.config
        rollout = self.generate(prompts, c.group_size)  # 1 generate
        rewards = self.score(rollout)  # 2 score
        mask = rollout.loss_mask(c.mask_truncated)
        ref_logps = self.frozen_logps(self.ref_policy, rollout) if c.beta > 0 else None  # 3 reference log-probs

        old_logps, metrics = None, {}
        for iteration in range(1, c.mu + 1):  # 5 update(s); the first forward also gives the old log-probs
            with self.timer("update"):
                if iteration == 1:
                    logps, entropy = self.logps(self.policy, rollout, with_entropy=True)
                    first_logps = logps.detach()
                    # (B,): k1 summed over each completion's tokens
                    kl = None if ref_logps is None else sequence_logps(KL_PENALTIES["k1"](first_logps, ref_logps), mask)
                    # 4 advantages, from the batch as sampled; normalised over the global batch (every rank's)
                    advantages = self.on_global_batch(
                        lambda rewards, kl: rloo_advantages(
                            rewards, c.group_size, kl=None if ref_logps is None else kl, beta=c.beta,
                            normalize=c.normalize_advantages, reward_clip_min=c.reward_clip_min,
                            reward_clip_max=c.reward_clip_max),
                        rewards, torch.zeros_like(rewards) if kl is None else kl)
                    if c.mu > 1:
                        old_logps = first_logps
                    # The KL is in them: none, no step (AdamW would move). Decided over every rank: a rank that
                    # skipped the gradient all-reduce would hang the others.
                    signal = self.any_rank(carries_signal(advantages, mask))
                else:
                    logps = self.logps(self.policy, rollout)
                loss = rloo_loss(logps, old_logps, advantages, mask, epsilon=c.epsilon, epsilon_high=c.epsilon_high)
                grad_norm = self.update(loss) if signal else 0.0
            metrics[f"loss/iter{iteration}"] = loss.item()
            metrics[f"grad_norm/iter{iteration}"] = grad_norm
            metrics[f"clipfrac/iter{iteration}"] = rloo_clip_fraction(
                logps, first_logps if old_logps is None else old_logps, advantages, mask,
                epsilon=c.epsilon, epsilon_high=c.epsilon_high).item()

        metrics.update(self.kl_metrics(first_logps, ref_logps, mask, "k1"))  # 6 metrics; k1 sits in its reward
        metrics["entropy"] = masked_mean_per_sequence(entropy, mask).mean().item()
        metrics.update(self.rollout_metrics(rollout, rewards))
        metrics.update(self.advantage_metrics(advantages))
        self.mean_over_updates(metrics, c.mu)
        metrics["loss/policy"] = metrics["loss"]  # the KL is in the advantages: the loss is all policy
        metrics["skipped_update"] = float(not signal)
        return metrics
