"""REINFORCE with a baseline (Williams 1992; Ahmadian et al. 2024, "Back to Basics", for LLMs).

No critic, no groups, no clipping: every completion's sequence log-prob is pushed up in proportion to
its reward minus a baseline. The baseline is a moving average of past batches' mean reward (options:
batch_mean, this batch's own mean reward, which with one sample per prompt is OpenRLHF's FlashREINFORCE,
``flash_reinforce`` in algorithms/estimators.py; none, plain REINFORCE). An optional k3 KL penalty keeps the
policy near the reference.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from algorithms.base import Algorithm, AlgoConfig, Batch, StepLog, register_algorithm
from algorithms.estimators import batch_mean_advantages
from algorithms.losses import carries_signal, reinforce_loss

BASELINES = ("moving_average", "batch_mean", "none")


@dataclass
class REINFORCEConfig(AlgoConfig):
    samples_per_prompt: int = field(default=4, metadata={"help": "completions sampled per prompt (each scored on its own)"})
    baseline: str = field(default="moving_average", metadata={"help": "b in (r - b): moving average of past batches' mean rewards, batch_mean (this batch's mean: with samples_per_prompt 1, OpenRLHF's FlashREINFORCE), or none", "choices": BASELINES})
    baseline_decay: float = field(default=0.9, metadata={"help": "b <- decay * b + (1 - decay) * mean(r) after every batch"})
    beta: float = field(default=0.0, metadata={"help": "k3 KL penalty weight to the reference, per sequence (0 skips the reference)"})

    def validate(self) -> None:
        super().validate()
        if self.samples_per_prompt < 1:
            raise ValueError(f"samples_per_prompt must be >= 1, got {self.samples_per_prompt}")
        if self.baseline not in BASELINES:
            raise ValueError(f"unknown baseline {self.baseline!r}; choose from {', '.join(BASELINES)}")
        if not 0 <= self.baseline_decay < 1:
            raise ValueError(f"baseline_decay must be in [0, 1), got {self.baseline_decay}")
        if self.beta < 0:
            raise ValueError(f"beta must be >= 0, got {self.beta}")

    def completions_per_step(self) -> int:
        return self.prompts_per_step * self.group_size

    @property
    def group_size(self) -> int:
        """Completions per prompt, under the setting's name ``samples_per_prompt``."""
        return self.samples_per_prompt

    @property
    def kl_coef(self) -> float:
        """The KL coefficient, under the setting's name ``beta``."""
        return self.beta


@register_algorithm
class REINFORCE(Algorithm):
    name = "reinforce"
    Config = REINFORCEConfig

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.baseline: Optional[float] = None  # set from the first batch, so its advantages are centred

    def learn(self, batch: Batch, log: StepLog) -> None:
        c: REINFORCEConfig = self.config
        batch.advantages = self.advantages(batch.rewards)  # 4 advantages; none and no KL term: no step
        signal = self.any_rank(c.kl_coef > 0 or carries_signal(batch.advantages, batch.mask))
        with self.timer("update"):  # 5 one update
            logps = self.policy_logps(batch)
            loss, parts = reinforce_loss(logps, batch.advantages, batch.mask, batch.ref_logps, kl_coef=c.kl_coef,
                                         return_parts=True)
            update = self.policy_update(loss, signal)
        log.add_update({"loss": loss.item(), **{f"loss/{part}": value for part, value in parts.items()}, **update})
        log.add({"baseline": self.baseline if self.baseline is not None else 0.0})

    def advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        """Step 4: (B,) the rewards less the baseline."""
        if self.config.baseline != "batch_mean":
            return rewards - self._baseline(rewards)
        # the global batch's mean, as one process would take it; this rank's rows of the result
        found = rewards if self.data_parallel is None else self.data_parallel.gather(rewards)
        advantages = batch_mean_advantages(found)
        self.baseline = (found.mean() if advantages.any() else found[0]).item()  # what was subtracted: the metric
        if self.data_parallel is None:
            return advantages
        return advantages.view(self.world_size, -1)[self.data_parallel.rank]

    def _baseline(self, rewards: torch.Tensor) -> float:
        """The baseline for this batch (from earlier batches only, except the first), then fold this batch in."""
        if self.config.baseline == "none":
            return 0.0
        if self.data_parallel is not None:  # the global batch's mean, as one process would take it
            rewards = self.data_parallel.gather(rewards)
        tied = bool((rewards == rewards[0]).all())
        mean = rewards[0].item() if tied else rewards.mean().item()  # a tied batch's float32 mean can be off by 1 ulp
        current = mean if self.baseline is None else self.baseline
        decay = self.config.baseline_decay
        self.baseline = decay * current + (1 - decay) * mean
        return current

    def state_dict(self) -> dict:
        return {**super().state_dict(), "baseline": self.baseline}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.baseline = state["baseline"]
