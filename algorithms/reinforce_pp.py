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

from algorithms.base import Algorithm, AlgoConfig, Batch, StepLog, register_algorithm
from algorithms.kl import KL_ESTIMATORS, approx_kl
from algorithms.losses import carries_signal, masked_mean, ppo_clip_fraction, ppo_policy_loss, reinforce_pp_advantages
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
        return self.prompts_per_step * self.group_size

    @property
    def group_size(self) -> int:
        """G, completions per prompt, under the setting's name ``samples_per_prompt`` (OpenRLHF's)."""
        return self.samples_per_prompt


@register_algorithm
class REINFORCEPP(Algorithm):
    name = "reinforce_pp"
    Config = REINFORCEPPConfig

    @property
    def kl_estimator(self) -> str:
        return self.config.kl_estimator

    def learn(self, batch: Batch, log: StepLog) -> None:
        c: REINFORCEPPConfig = self.config
        kl_in_loss = c.kl_in_loss and batch.ref_logps is not None
        for iteration in range(1, c.mu + 1):  # 5 update(s); the first forward also gives the old log-probs
            with self.timer("update"):
                logps = self.policy_logps(batch, iteration)
                if iteration == 1:  # 4 advantages, from the batch as sampled; none and no KL loss: no step
                    batch.advantages, returns = self.advantages(batch, kl_in_loss)
                    signal = self.any_rank((kl_in_loss and bool(batch.mask.any()))
                                           or carries_signal(batch.advantages, batch.mask))
                    # Token means over the global batch's active tokens (None in one process: this mask's).
                    num_tokens = self.data_parallel_token_count(batch.mask)
                policy_loss = ppo_policy_loss(logps, batch.logps, batch.advantages, batch.mask, c.epsilon,
                                              c.epsilon_high, num_tokens=num_tokens)
                loss = policy_loss
                if kl_in_loss:
                    kl_loss = aggregate_token_mean(approx_kl(logps, batch.ref_logps, c.kl_estimator), batch.mask,
                                                   None, num_tokens)
                    loss = policy_loss + c.kl_coef * kl_loss
                update = self.policy_update(loss, signal)
            clipfrac = ppo_clip_fraction(logps, batch.logps, batch.advantages, batch.mask, c.epsilon, c.epsilon_high)
            log.add_update({"loss/policy": policy_loss.item(),
                            # as it enters the loss; where the KL is in the reward it is no part of the loss
                            **({"loss/kl": c.kl_coef * kl_loss.item()} if kl_in_loss else {}),
                            "clipfrac": clipfrac.item(), **update})
        log.add({"return/mean": masked_mean(returns, batch.mask).item()})

    def advantages(self, batch: Batch, kl_in_loss: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Step 4: (B, T) token advantages and returns of the rewards less, where the KL is in the reward, kl_coef
        times the per-token KL, whitened over the global batch (every rank's tokens)."""
        c: REINFORCEPPConfig = self.config
        in_reward = batch.ref_logps is not None and not kl_in_loss
        kl = approx_kl(batch.logps, batch.ref_logps, c.kl_estimator) if in_reward else torch.zeros_like(batch.logps)
        return self.on_global_batch(
            lambda rewards, kl, mask: reinforce_pp_advantages(
                rewards, kl, mask, kl_coef=c.kl_coef, group_size=c.group_size, group_baseline=c.group_baseline,
                gamma=c.gamma, reward_clip_min=c.reward_clip_min, reward_clip_max=c.reward_clip_max,
                std_norm=c.advantage_std_norm),
            batch.rewards, kl, batch.mask)
