"""PPO with a critic: the classic RLHF recipe (Schulman et al. 2017; Ziegler et al. 2019; Ouyang et al. 2022).

A value model of the policy's architecture -- a deep copy of the policy's transformer body with a
fresh scalar head -- predicts a value per completion token. The task's reward arrives on the final
token; every token also pays -kl_coef * (log pi_old - log pi_ref), the k1 KL estimate, as TRL's
PPOTrainer does. GAE(gamma, lambda) turns these into per-token advantages (whitened over the batch)
and value targets; then several epochs of minibatch updates: the clipped policy objective steps the
policy's optimizer, the clipped value loss steps the critic's own optimizer, so the critic learns
only from the value loss and the policy only from the policy loss.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import nn

from algorithms.base import Algorithm, AlgoConfig, Batch, StepLog, register_algorithm
from algorithms.kl import KL_PENALTIES
from algorithms.losses import (
    carries_signal, gae, masked_mean, masked_whiten, ppo_clip_fraction, ppo_policy_loss, ppo_value_loss,
)
from algorithms.rollout import Rollout, completion_outputs, sequence_inputs


MINIBATCH_ROWS = ("random", "groups")


@dataclass
class PPOConfig(AlgoConfig):
    samples_per_prompt: int = field(default=4, metadata={"help": "completions sampled per prompt"})
    # 2 x 2 rather than TRL's 4 x 1: as many updates per batch as 4 epochs of one, twice the policy refreshes per pass.
    epochs: int = field(default=2, metadata={"help": "passes over each batch (TRL: num_ppo_epochs 4)"})
    minibatches: int = field(default=2, metadata={"help": "minibatches per epoch; must divide the batch"})
    minibatch_rows: str = field(default="random", metadata={"help": "what a minibatch holds: random rows (TRL, OpenRLHF: the batch's rows in a fresh random order each epoch), or groups (verl's minibatches of whole prompts: each prompt's completions in one minibatch, the prompts in a fresh random order each epoch; a minibatch encodes each of its prompts once, so a pass encodes each prompt once, not once per minibatch); groups needs minibatches to divide prompts_per_step", "choices": MINIBATCH_ROWS})
    epsilon: float = field(default=0.2, metadata={"help": "policy clip range 1 +/- epsilon (PPO: 0.2)"})
    value_clip: float = field(default=0.2, metadata={"help": "value clip range around the old values (TRL: 0.2)"})
    gamma: float = field(default=1.0, metadata={"help": "discount over completion tokens (RLHF: 1.0)"})
    lam: float = field(default=0.95, metadata={"help": "GAE lambda (TRL: 0.95)"})
    kl_coef: float = field(default=0.05, metadata={"help": "per-token KL penalty in the reward (TRL: 0.05; 0 skips the reference)"})
    whiten_advantages: bool = field(default=True, metadata={"help": "standardise advantages over the batch's tokens"})
    # TRL 1.12, verl 0.9 and OpenRLHF 0.11 whiten unconditionally (a 1e-8 eps on the variance is their only
    # guard): when every reward ties, what is left is the critic's error, scaled to unit variance.
    skip_tied_batches: bool = field(default=False, metadata={"help": "when every reward of the batch ties (every rank's), zero the policy's advantages: no policy step, the critic still learns (off: TRL, verl and OpenRLHF, which whiten the critic's error to unit variance then)"})
    critic_learning_rate: Optional[float] = field(default=None, metadata={"help": "the critic's AdamW rate (default: 10x the policy's: its head starts from zero)"})

    def validate(self) -> None:
        super().validate()
        for name in ("samples_per_prompt", "epochs", "minibatches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.completions_per_step() % self.minibatches:
            raise ValueError(f"minibatches={self.minibatches} must divide the batch of {self.completions_per_step()} completions")
        if self.minibatch_rows not in MINIBATCH_ROWS:
            raise ValueError(f"minibatch_rows must be one of {', '.join(MINIBATCH_ROWS)}, got {self.minibatch_rows!r}")
        if self.minibatch_rows == "groups" and self.prompts_per_step % self.minibatches:
            raise ValueError(f"minibatch_rows=groups needs minibatches={self.minibatches} to divide prompts_per_step={self.prompts_per_step} (whole prompts per minibatch)")
        for name in ("epsilon", "value_clip", "gamma", "lam", "kl_coef"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.critic_learning_rate is not None and self.critic_learning_rate <= 0:
            raise ValueError(f"critic_learning_rate must be > 0, got {self.critic_learning_rate}")

    def completions_per_step(self) -> int:
        return self.prompts_per_step * self.group_size

    @property
    def group_size(self) -> int:
        """Completions per prompt, under the setting's name ``samples_per_prompt``."""
        return self.samples_per_prompt


# ``time/critic``: the critic's forward, value loss and step inside the update (``time/update`` includes it); its
# forward for the old values is in ``time/logprobs``.
CRITIC_PHASE = "critic"


class ValueModel(nn.Module):
    """The critic: a copy of the policy (initialised from the policy's weights) whose output layer is a fresh scalar
    head, zero-initialised so that the first values are 0 rather than noise. It stays the policy's module type, so
    its values take the log-probs' own route (``completion_outputs``): each prompt encoded once with its completions
    packed after it, on the whole batch and on the grouped minibatches alike."""

    def __init__(self, policy):
        super().__init__()
        head = nn.Linear(policy.config.hidden_size, 1)
        nn.init.zeros_(head.weight)
        nn.init.zeros_(head.bias)
        # A LoRA policy (a PEFT model: get_base_model) is trained to leave its base weights as they are, so a
        # full copy of them would defeat it: its critic is this head on the policy's own adapted trunk, read
        # without gradient (a value head on shared features; the trunk learns from the policy loss only).
        self.shared = hasattr(policy, "get_base_model")
        if self.shared:
            base = policy.get_base_model()
            object.__setattr__(self, "trunk", getattr(base, base.base_model_prefix))  # not a submodule: not the critic's weights
            self.value_head = head
        else:
            self.lm = copy.deepcopy(policy)  # e.g. LlamaForCausalLM; a tied output layer is replaced, not copied
            self.lm.requires_grad_(True)
            self.lm.set_output_embeddings(head)

    @property
    def head(self) -> nn.Linear:
        return self.value_head if self.shared else self.lm.get_output_embeddings()

    @property
    def body(self) -> nn.Module:
        """The copied transformer body (e.g. LlamaModel)."""
        return getattr(self.lm, self.lm.base_model_prefix)

    def forward(self, rollout: Rollout) -> torch.Tensor:
        """(B, T) V(s_t): the value of the state *before* completion token t, read where its logits are."""
        if self.shared:
            with torch.no_grad():
                hidden = self.trunk(**sequence_inputs(rollout)).last_hidden_state  # (B, P+T, H)
            T = rollout.completion_ids.size(1)
            return self.head(hidden[:, -T - 1:-1]).squeeze(-1).float()  # (B, T)
        values, row_of = completion_outputs(self.lm, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids,
                                            rollout.completion_mask, group_size=rollout.group_size,
                                            group_counts=rollout.group_counts)  # (R, 1), (B, T)
        return values.squeeze(-1)[row_of].float()  # (B, T)


@register_algorithm
class PPO(Algorithm):
    name = "ppo"
    Config = PPOConfig
    kl_estimator = "k1"  # in its reward

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.critic = ValueModel(self.policy).to(self.device)
        self.critic_optimizer = self.make_optimizer(
            self.critic.parameters(), self.config.critic_learning_rate or 10 * self.config.learning_rate)

    def trainable_modules(self) -> list[nn.Module]:
        return [self.policy, self.critic]

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.optimizer, self.critic_optimizer]

    def whiten(self, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Advantages whitened over the global batch: under data parallelism every rank's tokens, as one
        process would whiten them (then this rank's rows back)."""
        if self.data_parallel is None:
            return masked_whiten(advantages, mask)
        everything = masked_whiten(self.data_parallel.gather_padded(advantages),
                                   self.data_parallel.gather_padded(mask))
        rows = advantages.size(0)
        return everything[self.data_parallel.rank * rows:(self.data_parallel.rank + 1) * rows, :advantages.size(1)]

    def batch_tied(self, rewards: torch.Tensor) -> bool:
        """Every reward of the global batch equal (under data parallelism, every rank's)."""
        everything = rewards if self.data_parallel is None else self.data_parallel.gather(rewards)
        return bool((everything == everything[0]).all())

    def gae_advantages(self, batch: Batch, old_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float, bool]:
        """Step 4: GAE(gamma, lambda) advantages and returns (B, T) of the KL-penalised token rewards (every token pays
        kl_coef x k1, the last also gets the reward), whitened over the batch, or zeroed when its rewards all tie and
        skip_tied_batches asks; with the advantages' std before whitening and whether the rewards all tie."""
        c: PPOConfig = self.config
        mask = batch.mask
        ref_logps = batch.logps if batch.ref_logps is None else batch.ref_logps  # no reference: no KL
        token_rewards = -c.kl_coef * (KL_PENALTIES["k1"](batch.logps, ref_logps) * mask)
        last = mask.sum(1).long() - 1  # (B,)
        token_rewards[torch.arange(token_rewards.size(0), device=self.device), last] += batch.rewards
        advantages, returns = gae(token_rewards, old_values, mask, c.gamma, c.lam)
        raw_std = advantages[mask.bool()].std().item()
        tied = self.batch_tied(batch.rewards)
        if c.skip_tied_batches and tied:
            advantages = torch.zeros_like(advantages)
        elif c.whiten_advantages:
            advantages = self.whiten(advantages, mask)
        return advantages, returns, raw_std, tied

    def minibatch_indices(self, rollout: Rollout) -> list[torch.Tensor]:
        """One epoch's minibatches, each its row indices sorted (each group's rows together, in group order: its
        log-probs and values encode each of its prompts once). ``random``: a random permutation of the rows split
        in ``minibatches``; ``groups``: a random permutation of the groups, split likewise, so a prompt's rows share
        one minibatch."""
        c: PPOConfig = self.config
        if c.minibatch_rows == "random":
            order = torch.randperm(rollout.num_completions, generator=self.generator, device=self.device)
            return [idx.sort().values for idx in order.split(rollout.num_completions // c.minibatches)]
        group = rollout.group_of_rows()
        groups = int(group.max()) + 1
        if groups % c.minibatches:  # under data parallelism, this rank's share of the prompts
            raise ValueError(f"minibatch_rows=groups: {groups} prompts do not split into {c.minibatches} minibatches")
        order = torch.randperm(groups, generator=self.generator, device=self.device)
        return [torch.isin(group, chosen).nonzero().squeeze(1) for chosen in order.split(groups // c.minibatches)]

    def learn(self, batch: Batch, log: StepLog) -> None:
        c: PPOConfig = self.config
        rollout, mask = batch.rollout, batch.mask
        batch.logps = old_logps = self.frozen_logps(self.policy, rollout)  # 3 old log-probs and old values
        with torch.no_grad(), self.timer("logprobs"), self.autocast():
            old_values = self.critic(rollout) * mask

        batch.advantages, returns, raw_std, tied = self.gae_advantages(batch, old_values)  # 4 advantages
        advantages = batch.advantages

        for _ in range(c.epochs):  # 5 epochs x minibatches
            for idx in self.minibatch_indices(rollout):
                mb, mb_mask = rollout.select(idx, grouped=True), mask[idx]
                with self.timer("update"):
                    logps, entropy = self.logps(self.policy, mb, with_entropy=True)
                    num_tokens = self.data_parallel_token_count(mb_mask)
                    policy_loss = ppo_policy_loss(logps, old_logps[idx], advantages[idx], mb_mask, c.epsilon,
                                                  num_tokens=num_tokens)
                    # Every advantage 0: no policy step. The critic still learns the returns.
                    update = self.policy_update(policy_loss, self.any_rank(carries_signal(advantages[idx], mb_mask)))
                    with self.timer(CRITIC_PHASE):  # a part of the update: what the separate critic costs
                        with self.autocast():
                            values = self.critic(mb)
                        value_loss = ppo_value_loss(values, old_values[idx], returns[idx], mb_mask, c.value_clip,
                                                    num_tokens=num_tokens)
                        self.update(value_loss, self.critic_optimizer, self.critic.parameters())
                clipfrac = ppo_clip_fraction(logps, old_logps[idx], advantages[idx], mb_mask, c.epsilon)
                # entropy: a token mean per minibatch, as it is trained on
                log.add_update({"loss/policy": policy_loss.item(), "loss/value": value_loss.item(),
                                "clipfrac": clipfrac.item(), **update, "entropy": masked_mean(entropy, mb_mask).item()})
        log.add({"advantage/raw_std": raw_std,  # before whitening: the signal whitening scales up
                 "tied_batch": float(tied), "value/mean": masked_mean(old_values, mask).item()})
