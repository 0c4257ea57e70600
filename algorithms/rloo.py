"""RLOO: REINFORCE Leave-One-Out (Ahmadian et al. 2024, "Back to Basics"; Kool et al. 2019), as TRL 1.16's
RLOOTrainer defines it.

No critic: each prompt gets G completions and a completion's baseline is the mean reward of the other
G - 1. The KL to the reference is TRL's: the k1 estimate summed over the completion's tokens and
subtracted from its reward (kl_coef 0.05, the setting ``beta``), not a loss term. The loss is PPO's clip
on the *sequence* ratio, averaged over completions; at mu = 1 it is REINFORCE with the leave-one-out baseline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from algorithms.base import Algorithm, AlgoConfig, Batch, StepLog, register_algorithm
from algorithms.kl import KL_PENALTIES
from algorithms.losses import carries_signal, rloo_advantages, rloo_clip_fraction, rloo_loss, sequence_logps


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

    @property
    def kl_coef(self) -> float:
        """The KL coefficient, under the setting's name ``beta`` (TRL's)."""
        return self.beta


@register_algorithm
class RLOO(Algorithm):
    name = "rloo"
    Config = RLOOConfig
    kl_estimator = "k1"  # in its reward
    per_update_metrics = ("loss", "grad_norm", "clipfrac")

    def learn(self, batch: Batch, log: StepLog) -> None:
        c: RLOOConfig = self.config
        for iteration in range(1, c.mu + 1):  # 5 update(s); the first forward also gives the old log-probs
            with self.timer("update"):
                logps = self.policy_logps(batch, iteration)
                if iteration == 1:  # 4 advantages, from the batch as sampled; the KL is in them: none, no step
                    batch.advantages = self.advantages(batch)
                    signal = self.any_rank(carries_signal(batch.advantages, batch.mask))
                loss = rloo_loss(logps, batch.logps, batch.advantages, batch.mask, epsilon=c.epsilon,
                                 epsilon_high=c.epsilon_high)
                update = self.policy_update(loss, signal)
            clipfrac = rloo_clip_fraction(logps, batch.logps, batch.advantages, batch.mask, epsilon=c.epsilon,
                                          epsilon_high=c.epsilon_high)
            # the KL is in the advantages: the loss is all policy
            log.add_update({"loss": loss.item(), "loss/policy": loss.item(), **update, "clipfrac": clipfrac.item()})

    def advantages(self, batch: Batch) -> torch.Tensor:
        """Step 4: (B,) leave-one-out advantages of the rewards less kl_coef times the k1 KL summed over each
        completion's tokens, normalised (where asked) over the global batch (every rank's)."""
        c: RLOOConfig = self.config
        kl = (torch.zeros_like(batch.rewards) if batch.ref_logps is None
              else sequence_logps(KL_PENALTIES["k1"](batch.logps, batch.ref_logps), batch.mask))  # (B,)
        return self.on_global_batch(
            lambda rewards, kl: rloo_advantages(
                rewards, c.group_size, kl=kl, kl_coef=c.kl_coef, normalize=c.normalize_advantages,
                reward_clip_min=c.reward_clip_min, reward_clip_max=c.reward_clip_max),
            batch.rewards, kl)
