"""TRL 1.12.0's PPO cases: steps 4-6 of PPOTrainer.train (the KL in the reward, GAE, the whitening) and its minibatch
loss (the clipped surrogate, the clipped value loss), run from TRL's own lines (benchmarks/references/trl_ppo.py).

TRL 1.12 puts a completion's score one token past its end, where the critic also predicts and the value loss also
counts; ours puts it on the last active token. Each such row differs by design, and ours on TRL's layout agrees
beside it."""

from __future__ import annotations

import torch

from algorithms import kl, losses
from benchmarks.checks.cases.tensors import DTYPE, Batch, Grid, TensorCases, knobs, loss_pair, token_adv, value_pair
from benchmarks.checks.engine import register_cases
from benchmarks.references import trl_ppo

TRL_LAYOUT = ("TRL 1.12 puts the score on the token after the last one (sequence_lengths_p1), where the critic also "
              "predicts and the value loss also counts, unless the completion fills the width; ours on the last "
              "active token (verl, OpenRLHF). Ours on TRL's layout agrees (the row beside it)")
VALUE_MASK = ("TRL's value loss also counts the token after each completion (padding_mask_p1), where it puts the "
              "score; ours counts the completion's tokens; on TRL's mask ours agrees (next row)")
STEPS = "PPOTrainer.train steps 4-6"


def _trl_p1(b: Batch) -> torch.Tensor:
    """TRL's value mask: one token past each completion's end (0 past the width)."""
    lengths = (b.lengths + 1).clamp(max=b.width)
    return (torch.arange(b.width).unsqueeze(0) < lengths.unsqueeze(1)).to(DTYPE)


def _ours_on_trl_layout(b: Batch, gamma: float, lam: float, estimator: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Our gae on TRL's layout: the score one past the end (on the last token when the completion fills the width),
    the KL on active tokens, values kept on the extra token; whitened over the active tokens."""
    p1 = _trl_p1(b)
    kl_tokens = kl.KL_PENALTIES[estimator](b.old_logps, b.ref_logps)
    rewards = losses.kl_penalised_rewards(torch.zeros_like(b.rewards), kl_tokens, b.mask, 0.05)  # the KL part only
    last = (p1.sum(-1).long() - 1).clamp(min=0)
    rewards = rewards + torch.zeros_like(rewards).scatter(1, last.unsqueeze(1), b.rewards.unsqueeze(1))
    advantages, returns = losses.gae(rewards, b.old_values, p1, gamma, lam)
    return losses.masked_whiten(advantages, b.mask), returns


def _theirs(gamma: float = 1.0, lam: float = 0.95, est: str = "k1"):
    """Steps 4-6 on the batch: TRL's namespace (advantages, returns, kl, ...)."""
    return lambda b: trl_ppo.advantages(b.rewards, b.old_logps, b.ref_logps, b.old_values, b.mask, gamma=gamma,
                                        lam=lam, kl_coef=0.05, kl_estimator=est)


def _gae(grid: Grid, gamma: float, lam: float, est: str) -> None:
    """GAE with TRL's whitening: ours as it is (by design), on TRL's layout, and the returns on TRL's layout."""
    theirs = _theirs(gamma, lam, est)

    def ours(b):
        return losses.gae(losses.kl_penalised_rewards(b.rewards, kl.KL_PENALTIES[est](b.old_logps, b.ref_logps),
                                                      b.mask, 0.05), b.old_values, b.mask, gamma, lam)

    names = (STEPS, knobs(gamma=gamma, lam=lam, kl_estimator=est))
    grid.add("gae", "gae + masked_whiten", *names,
             value_pair(lambda b: losses.masked_whiten(ours(b)[0], b.mask), lambda b: theirs(b)["advantages"]),
             TRL_LAYOUT)
    grid.add("gae", "gae + masked_whiten (TRL's layout)", *names,
             value_pair(lambda b: _ours_on_trl_layout(b, gamma, lam, est)[0], lambda b: theirs(b)["advantages"]))
    grid.add("gae", "gae returns (TRL's layout)", *names,
             value_pair(lambda b: _ours_on_trl_layout(b, gamma, lam, est)[1], lambda b: theirs(b)["returns"]))


def _advantages_and_kl(grid: Grid) -> None:
    for gamma, lam in ((1.0, 0.95), (0.99, 0.95)):
        for est in ("k1", "k3"):
            _gae(grid, gamma, lam, est)
        est = "k1" if gamma == 1.0 else "k3"
        grid.add("kl", est, "PPOTrainer.train step 4 (kl)", "-",
                 value_pair(lambda b, e=est: kl.KL_PENALTIES[e](b.old_logps, b.ref_logps),
                            lambda b, e=est: _theirs(est=e)(b)["kl"]))
    grid.add("whitening", "masked_whiten", "masked_whiten", "-",
             value_pair(lambda b: losses.masked_whiten(b.returns, b.mask),
                        lambda b: trl_ppo.masked_whiten(b.returns, b.mask.bool())))


def _losses(grid: Grid, clip: float) -> None:
    """The minibatch loss: pg_loss, and vf_loss on our mask (by design) and on TRL's."""

    def theirs(b):
        return trl_ppo.losses(b.logps, b.old_logps, token_adv(b), b.values, b.old_values, b.returns, b.mask,
                              cliprange=clip, cliprange_value=clip)

    def ours_on_trl_mask(b):
        p1 = _trl_p1(b)
        return losses.ppo_value_loss(b.values * p1, b.old_values * p1, b.returns, p1, clip)

    grid.add("ppo_policy_loss", "ppo_policy_loss", "PPOTrainer.train pg_loss", knobs(epsilon=clip),
             loss_pair(lambda b: losses.ppo_policy_loss(b.logps, b.old_logps, token_adv(b), b.mask, clip),
                       lambda b: theirs(b)["pg_loss"]))
    grid.add("value_loss", "ppo_value_loss", "PPOTrainer.train vf_loss", knobs(value_clip=clip),
             loss_pair(lambda b: losses.ppo_value_loss(b.values, b.old_values, b.returns, b.mask, clip),
                       lambda b: theirs(b)["vf_loss"], wrt="values"), VALUE_MASK)
    grid.add("value_loss", "ppo_value_loss (TRL's value mask)", "PPOTrainer.train vf_loss", knobs(value_clip=clip),
             loss_pair(ours_on_trl_mask, lambda b: theirs(b)["vf_loss"], wrt="values"))


@register_cases
class TrlPpoCases(TensorCases):
    name, adapter = trl_ppo.FRAMEWORK, trl_ppo.TrlPpo

    def add_configs(self, grid: Grid) -> None:
        _advantages_and_kl(grid)
        for clip in (0.2, 0.05):
            _losses(grid, clip)
