"""GRPO: Group Relative Policy Optimization (Shao et al. 2024, "DeepSeekMath", Sec. 4, Eq. 21).

No critic: each prompt gets G completions, and a completion's advantage is its reward standardised
within its group. The defaults are GRPO as the paper defines it: token-level ratios, per-completion
mean then mean over completions (loss_type "grpo"), epsilon 0.2, beta 0.04 with the k3 estimator,
group-std scaling. The variants (GSPO's sequence-level ratio, bnpo/dr_grpo/dapo aggregation,
clip-higher, Dr. GRPO's unscaled advantages, DAPO's overlong masking) are options, not defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from algorithms.base import Algorithm, AlgoConfig, register_algorithm
from algorithms.losses import (
    ADVANTAGE_SCALES, GRPO_LEVELS, GRPO_LOSS_TYPES, clip_fraction, group_advantages, grpo_loss, k3_kl,
    masked_mean_per_sequence,
)


@dataclass
class GRPOConfig(AlgoConfig):
    group_size: int = field(default=8, metadata={"help": "G, completions per prompt (>= 2; the paper uses 64)"})
    mu: int = field(default=1, metadata={"help": "policy updates per generation batch (TRL's num_iterations)"})
    level: str = field(default="token", metadata={"help": "importance ratio per token, or per sequence (GSPO)", "choices": GRPO_LEVELS})
    loss_type: str = field(default="grpo", metadata={"help": "token aggregation: grpo (paper), bnpo, dr_grpo, dapo", "choices": GRPO_LOSS_TYPES})
    epsilon: float = field(default=0.2, metadata={"help": "lower clip range 1 - epsilon (PPO/GRPO: 0.2)"})
    epsilon_high: Optional[float] = field(default=None, metadata={"help": "upper clip range 1 + epsilon_high (default epsilon; DAPO: 0.28)"})
    beta: float = field(default=0.04, metadata={"help": "k3 KL penalty weight to the reference (paper: 0.04; 0 skips the reference)"})
    scale_rewards: str = field(default="group", metadata={"help": "advantage scale: group std (paper), batch std, none (Dr. GRPO)", "choices": ADVANTAGE_SCALES})
    advantage_clip: Optional[float] = field(default=None, metadata={"help": "clip advantages to +/- this (the seed notebook: 2.0)"})
    kl_bias_correction: bool = field(default=False, metadata={"help": "weight the KL term by the importance ratio (TRL's use_bias_correction_kl)"})
    mask_truncated: bool = field(default=False, metadata={"help": "drop completions without EOS from the loss (DAPO overlong filtering)"})

    def validate(self) -> None:
        super().validate()
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 for group-relative advantages, got {self.group_size}")
        if self.mu < 1:
            raise ValueError(f"mu must be >= 1, got {self.mu}")
        if self.level not in GRPO_LEVELS:
            raise ValueError(f"unknown level {self.level!r}; choose from {', '.join(GRPO_LEVELS)}")
        if self.loss_type not in GRPO_LOSS_TYPES:
            raise ValueError(f"unknown loss_type {self.loss_type!r}; choose from {', '.join(GRPO_LOSS_TYPES)}")
        if self.scale_rewards not in ADVANTAGE_SCALES:
            raise ValueError(f"unknown scale_rewards {self.scale_rewards!r}; choose from {', '.join(ADVANTAGE_SCALES)}")
        for name in ("epsilon", "epsilon_high", "beta", "advantage_clip"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")

    def completions_per_step(self) -> int:
        return self.prompts_per_step * self.group_size


@register_algorithm
class GRPO(Algorithm):
    name = "grpo"
    Config = GRPOConfig

    def step(self, prompts: list[str]) -> dict[str, float]:
        c: GRPOConfig = self.config
        rollout = self.generate(prompts, c.group_size)  # 1 generate
        rewards = self.score(rollout)  # 2 score
        mask = rollout.loss_mask(c.mask_truncated)
        # 3 reference log-probs. The old (sampling-policy) ones need no pass of their own: until the first
        # update the policy *is* the sampling policy, so they are the first iteration's log-probs, detached
        # (the same numbers as a separate no-grad pass, bit for bit: tested).
        ref_logps = self.frozen_logps(self.ref_policy, rollout) if c.beta > 0 else None
        old_logps = None
        advantages = group_advantages(rewards, c.group_size, c.scale_rewards)  # 4 advantages
        if c.advantage_clip is not None:
            advantages = advantages.clamp(-c.advantage_clip, c.advantage_clip)

        metrics: dict[str, float] = {}
        for iteration in range(1, c.mu + 1):  # 5 update(s) on the same batch
            with self.timer("update"):
                if iteration == 1:  # entropy is a metric of the batch as sampled: the first iteration's
                    logps, entropy = self.logps(self.policy, rollout, with_entropy=True)
                    if c.mu > 1:
                        old_logps = logps.detach()
                else:
                    logps = self.logps(self.policy, rollout)
                loss = grpo_loss(
                    logps, old_logps, ref_logps, advantages, mask, level=c.level, loss_type=c.loss_type,
                    epsilon=c.epsilon, epsilon_high=c.epsilon_high, beta=c.beta,
                    max_completion_length=self.sampling.max_new_tokens, kl_bias_correction=c.kl_bias_correction,
                )
                grad_norm = self.update(loss)
            metrics[f"loss/iter{iteration}"] = loss.item()
            metrics[f"grad_norm/iter{iteration}"] = grad_norm
            metrics[f"clipfrac/iter{iteration}"] = clip_fraction(
                logps, logps.detach() if old_logps is None else old_logps, advantages, mask,
                level=c.level, epsilon=c.epsilon, epsilon_high=c.epsilon_high,
            ).item()
            if iteration == 1:  # 6 metrics describe the batch as sampled
                kl = k3_kl(logps.detach(), ref_logps) if ref_logps is not None else torch.zeros_like(logps)
                metrics["kl"] = masked_mean_per_sequence(kl, mask).mean().item()
                metrics["entropy"] = masked_mean_per_sequence(entropy, mask).mean().item()

        metrics.update(self.rollout_metrics(rollout, rewards))
        metrics["advantage/mean"] = advantages.mean().item()
        metrics["advantage/std"] = advantages.std().item()
        metrics["loss"] = sum(metrics[f"loss/iter{i}"] for i in range(1, c.mu + 1)) / c.mu
        metrics["loss/policy"] = metrics["loss"]
        metrics["grad_norm"] = sum(metrics[f"grad_norm/iter{i}"] for i in range(1, c.mu + 1)) / c.mu
        metrics["clipfrac"] = sum(metrics[f"clipfrac/iter{i}"] for i in range(1, c.mu + 1)) / c.mu
        metrics.update(self.timer.pop())
        return metrics
