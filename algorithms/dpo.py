"""DPO: Direct Preference Optimization (Rafailov et al. 2023, Eq. 7).

No sampling during training and no reward calls: the task labels a fixed set of (prompt, chosen,
rejected) pairs once, from completions of the starting policy (``task.preference_pairs``), and each
step takes the next minibatch of pairs. Building the pairs samples completions (many more than the pairs where
rewards tie: 8192 for 256 pairs on chain_sum at a 15% start); with ``count_pair_samples`` they count against the
budget, as every other algorithm's generated completions do: the pairs come from at most the budget's samples
(``completions_allowed``), drawn at the first step, and the run then takes its planned steps over them. The loss is the sigmoid loss of
the policy's log-ratio margin against the frozen reference, scaled by beta. The prompts the harness passes to ``step`` are unused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from algorithms.base import Algorithm, AlgoConfig, register_algorithm
from algorithms.losses import dpo_loss, masked_mean_per_sequence, sequence_logps
from algorithms.rollout import rollout_from_text


@dataclass
class DPOConfig(AlgoConfig):
    beta: float = field(default=0.1, metadata={"help": "DPO's beta: strength of the implicit KL to the reference (paper: 0.1-0.5)"})
    pairs: int = field(default=256, metadata={"help": "preference pairs the task builds once from the starting policy"})
    pairs_per_step: int = field(default=16, metadata={"help": "pairs per training step (DPO ignores --prompts-per-step)"})
    count_pair_samples: bool = field(default=False, metadata={"help": "count the completions sampled to build the pairs against the budget, as every other algorithm's generated completions count (off in the matrices run before it existed)"})

    def validate(self) -> None:
        super().validate()
        if self.beta <= 0:
            raise ValueError(f"beta must be > 0, got {self.beta}")
        if self.pairs < 1 or self.pairs_per_step < 1:
            raise ValueError(f"pairs and pairs_per_step must be >= 1, got {self.pairs} and {self.pairs_per_step}")

    def completions_per_step(self) -> int:
        return 2 * self.pairs_per_step


@register_algorithm
class DPO(Algorithm):
    name = "dpo"
    Config = DPOConfig

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pairs: Optional[dict] = None  # built at the first step, from the policy as it starts
        self.order: list[int] = []
        self.pairs_counted = False  # whether the pairs' samples were counted as generated completions

    @classmethod
    def needs_reference(cls, config) -> bool:
        return True

    def train_step(self, prompts: list[str]) -> dict[str, float]:
        c: DPOConfig = self.config
        if self.pairs is None:  # 1 generate: once, the task samples and labels the pairs
            with self.timer("generate"):
                seed = int(torch.randint(0, 2**31 - 1, (1,), generator=self.generator, device=self.device))
                # With count_pair_samples the pairs come from at most the samples the budget leaves: the
                # completions every other algorithm samples over its run, sampled here up front.
                cap = self.completions_allowed if c.count_pair_samples else None
                self.pairs = self.task.preference_pairs(self.policy, c.pairs, seed=seed,
                                                        **({"max_samples": cap} if cap is not None else {}))
        idx = self._next_pairs(c.pairs_per_step)  # 2 score: the pairs came labelled
        n = len(idx)
        batch = rollout_from_text(
            self.tokenizer, [self.pairs["prompts"][i] for i in idx] * 2,
            [self.pairs["chosen"][i] for i in idx] + [self.pairs["rejected"][i] for i in idx], self.device,
        )  # chosen rows first, then rejected: (2n, T)
        mask = batch.completion_mask
        ref_logps = self.frozen_logps(self.ref_policy, batch)  # 3 reference log-probs
        ref_seq = sequence_logps(ref_logps, mask)

        # 4 no advantages. A pair whose two completions are the same text prefers nothing: its margin's
        # gradient is 0 (up to rounding), and a batch of only such pairs takes no step.
        signal = any(self.pairs["chosen"][i] != self.pairs["rejected"][i] for i in idx)
        with self.timer("update"):  # 5 one update
            logps, entropy = self.logps(self.policy, batch, with_entropy=True)
            seq = sequence_logps(logps, mask)
            loss = dpo_loss(seq[:n], seq[n:], ref_seq[:n], ref_seq[n:], beta=c.beta)
            grad_norm = self.update(loss) if signal else 0.0

        margin = c.beta * ((seq[:n] - ref_seq[:n]) - (seq[n:] - ref_seq[n:])).detach()  # 6 metrics
        metrics = {
            "loss": loss.item(),
            "loss/policy": loss.item(),
            "grad_norm": grad_norm,
            "skipped_update": float(not signal),
            # No "kl": the pairs are not samples of the current policy, so k3 on them estimates nothing.
            "dpo/chosen_logratio": (seq[:n] - ref_seq[:n]).mean().item(),
            "dpo/rejected_logratio": (seq[n:] - ref_seq[n:]).mean().item(),
            "entropy": masked_mean_per_sequence(entropy, mask).mean().item(),
            "dpo/margin": margin.mean().item(),
            "dpo/accuracy": (margin > 0).float().mean().item(),
            "pairs": float(len(self.pairs["chosen"])),
            "pairs/samples": float(self.pairs["samples"]),
            "pairs/ties_dropped": float(self.pairs["ties_dropped"]),
            "completions": float(2 * n),
        }
        if c.count_pair_samples:  # what was generated: the pairs' samples, at the first step; no step after it samples
            metrics["completions"] = 0.0 if self.pairs_counted else float(self.pairs["samples"])
            self.pairs_counted = True
        return metrics

    def generates_more(self) -> bool:
        """With count_pair_samples, once the pairs are built no step samples again: the budget they spent does not
        end the run, which takes its planned steps over them."""
        return not (self.config.count_pair_samples and self.pairs is not None)

    def _next_pairs(self, k: int) -> list[int]:
        """The next k pair indices, reshuffling (seeded) after every pass over the pairs."""
        out: list[int] = []
        if not self.pairs["chosen"]:  # a task that returned no pair (its samples all tied) has nothing to train on
            raise ValueError(f"DPO: the task built no preference pairs from {self.pairs['samples']} samples "
                             f"({self.pairs['ties_dropped']} tied)")
        while len(out) < k:
            if not self.order:
                n = len(self.pairs["chosen"])
                self.order = torch.randperm(n, generator=self.generator, device=self.device).tolist()
            out.append(self.order.pop())
        return out

    def state_dict(self) -> dict:
        return {**super().state_dict(), "pairs": self.pairs, "order": list(self.order), "pairs_counted": self.pairs_counted}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.pairs, self.order = state["pairs"], list(state["order"])
        self.pairs_counted = state.get("pairs_counted", self.pairs is not None)
