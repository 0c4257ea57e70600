"""DPO: Direct Preference Optimization (Rafailov et al. 2023, Eq. 7).

No sampling during training and no reward calls: the task labels a fixed set of (prompt, chosen,
rejected) pairs once, from completions of the starting policy (``task.preference_pairs``), and each
step takes the next minibatch of pairs. Building the pairs samples completions (many more than the pairs where
rewards tie: 8192 for 256 pairs on chain_sum at a 15% start); with ``count_pair_samples`` they count against the
budget, as every other algorithm's generated completions do: the pairs come from at most the budget's samples
(``completions_allowed``), drawn at the first step, and the run then takes its planned steps over them. The loss is the sigmoid loss of
the policy's log-ratio margin against the frozen reference, scaled by beta. The prompts the harness passes to ``step`` are unused.

What a step computes, and no more: a pair's chosen and rejected rows sit together, a run of one prompt, so the
log-probs encode its prompt once (as a GRPO group's); the reference is frozen and the pairs fixed, so each pair's
reference log-probs are computed once, at the first batch that holds it, and kept (in the checkpoint too). The same
function as computing both every step with the prompt encoded per row; other rounding.

Under data parallelism every rank builds the same pairs (rank 0's seed) and takes its share of rank 0's draw of
each step's pairs (``pairs_per_step`` a multiple of the ranks): the one-process step on the global batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from algorithms.base import Algorithm, AlgoConfig, Batch, StepLog, register_algorithm
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


@dataclass
class PairBatch(Batch):
    """A DPO step's batch: ``pairs`` the indices of its pairs; ``ref_logps`` (n, 2) sequence log-probs."""

    pairs: list[int] = field(default_factory=list)


@register_algorithm
class DPO(Algorithm):
    name = "dpo"
    Config = DPOConfig

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pairs: Optional[dict] = None  # built at the first step, from the policy as it starts
        self.order: list[int] = []
        self.pairs_counted = False  # whether the pairs' samples were counted as generated completions
        # (prompt, chosen, rejected) -> (2,) the frozen reference's log-probs of the chosen and the rejected completion
        self.reference: dict[tuple[str, str, str], torch.Tensor] = {}

    @classmethod
    def needs_reference(cls, config) -> bool:
        return True

    def collect(self, prompts: list[str]) -> PairBatch:
        """Steps 1 and 2: the next minibatch of pairs, each pair's chosen row, then its rejected row (2n, T). The task
        samples and labels the pairs once, at the first step: no rewards."""
        c: DPOConfig = self.config
        if self.pairs is None:
            with self.timer("generate"):
                # Rank 0's seed on every rank: under data parallelism every rank builds the same pairs.
                seed = int(self.from_first_rank(torch.randint(0, 2**31 - 1, (1,), generator=self.generator,
                                                              device=self.device)))
                # With count_pair_samples the pairs come from at most the samples the budget leaves: the
                # completions every other algorithm samples over its run, sampled here up front.
                cap = self.completions_allowed if c.count_pair_samples else None
                self.pairs = self.task.preference_pairs(self.policy, c.pairs, seed=seed,
                                                        **({"max_samples": cap} if cap is not None else {}))
        idx = self._next_pairs(c.pairs_per_step)
        if self.data_parallel is not None:  # rank 0's draw, this rank's share of it: the one-process batch, split
            idx = self.data_parallel.shard(self.from_first_rank(torch.tensor(idx, device=self.device)).tolist())
        rollout = rollout_from_text(
            self.tokenizer, [self.pairs["prompts"][i] for i in idx for _ in range(2)],
            [text for i in idx for text in (self.pairs["chosen"][i], self.pairs["rejected"][i])], self.device,
            group_size=2,
        )
        return PairBatch(rollout, None, self.loss_mask(rollout), pairs=idx)

    def reference_logps(self, batch: PairBatch) -> torch.Tensor:
        """Step 3: (n, 2) the frozen reference's sequence log-probs of the batch's pairs (chosen, rejected), those of
        pairs not seen before computed on their rows and kept."""
        keys = [(self.pairs["prompts"][i], self.pairs["chosen"][i], self.pairs["rejected"][i]) for i in batch.pairs]
        new = list(dict.fromkeys(k for k in keys if k not in self.reference))
        if new:
            first = [keys.index(k) for k in new]
            rows = batch.rollout.select(torch.tensor([2 * k + j for k in first for j in range(2)]), grouped=True)
            values = sequence_logps(self.frozen_logps(self.ref_policy, rows), rows.completion_mask).view(-1, 2)
            self.reference.update(zip(new, values.clone().unbind(0)))
        return torch.stack([self.reference[k] for k in keys])

    def learn(self, batch: PairBatch, log: StepLog) -> None:
        c: DPOConfig = self.config
        # 4 no advantages. A pair whose two completions are the same text prefers nothing: its margin's gradient
        # is 0 (up to rounding), and a batch of only such pairs takes no step.
        signal = self.any_rank(any(self.pairs["chosen"][i] != self.pairs["rejected"][i] for i in batch.pairs))
        with self.timer("update"):  # 5 one update
            seq = sequence_logps(self.policy_logps(batch), batch.mask).view(-1, 2)
            ref_seq = batch.ref_logps
            loss = dpo_loss(seq[:, 0], seq[:, 1], ref_seq[:, 0], ref_seq[:, 1], beta=c.beta)
            update = self.policy_update(loss, signal)
        log.add_update({"loss": loss.item(), "loss/policy": loss.item(), **update})
        chosen, rejected = (seq - ref_seq).detach().unbind(1)  # the log-ratios to the reference
        margin = c.beta * (chosen - rejected)
        log.add({"dpo/chosen_logratio": chosen.mean().item(), "dpo/rejected_logratio": rejected.mean().item(),
                 "dpo/margin": margin.mean().item(), "dpo/accuracy": (margin > 0).float().mean().item()})

    def step_metrics(self, batch: PairBatch, log: StepLog) -> dict[str, float]:
        """Step 6. No "kl": the pairs are not samples of the current policy, so k3 on them estimates nothing; no
        rewards and no advantages."""
        metrics = {**log.metrics(), "entropy": masked_mean_per_sequence(batch.entropy, batch.mask).mean().item(),
                   "pairs": float(len(self.pairs["chosen"])), "pairs/samples": float(self.pairs["samples"]),
                   "pairs/ties_dropped": float(self.pairs["ties_dropped"]), "completions": float(2 * len(batch.pairs))}
        if self.config.count_pair_samples:  # what was generated: the pairs' samples, at the first step only
            metrics["completions"] = 0.0 if self.pairs_counted else float(self.pairs["samples"])
            self.pairs_counted = True
        return metrics

    def set_data_parallel(self, data_parallel) -> None:
        if data_parallel is not None and self.config.pairs_per_step % data_parallel.world_size:
            raise ValueError(f"pairs_per_step {self.config.pairs_per_step} does not split over "
                             f"{data_parallel.world_size} ranks; use a multiple of {data_parallel.world_size}")
        super().set_data_parallel(data_parallel)

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
        return {**super().state_dict(), "pairs": self.pairs, "order": list(self.order), "pairs_counted": self.pairs_counted,
                "reference": dict(self.reference)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.pairs, self.order = state["pairs"], list(state["order"])
        self.pairs_counted = state.get("pairs_counted", self.pairs is not None)
        self.reference = dict(state.get("reference", {}))  # a checkpoint from before the cache: computed again
