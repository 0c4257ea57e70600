"""Timings of every loss in algorithms.losses and algorithms.policy_losses on one batch (forward + backward), grouped to read side by side."""

import pytest
import torch

from algorithms import losses, policy_losses
from algorithms.grpo import GRPOConfig

B, T = 64, 64  # completions, completion tokens


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()  # (B, T), ragged completions
    logps = (-torch.rand(B, T, generator=g) * 3).requires_grad_()
    old = (logps.detach() + 0.05 * torch.randn(B, T, generator=g))
    ref = (logps.detach() + 0.05 * torch.randn(B, T, generator=g))
    advantages = torch.randn(B, generator=g)
    return logps, old, ref, advantages, mask


def _loss_fn(name):
    return getattr(losses, name)


def _forward_backward(benchmark, loss_of):
    def run():
        loss = loss_of()
        loss.backward()
        return loss

    loss = benchmark(run)
    assert torch.isfinite(loss)


@pytest.mark.parametrize("level", policy_losses.GRPO_LEVELS)
@pytest.mark.parametrize("loss_type", policy_losses.GRPO_LOSS_TYPES)
def test_grpo_loss(benchmark, level, loss_type):
    benchmark.group = "loss (64 x 64 tokens, forward + backward)"
    logps, old, ref, adv, mask = _batch()
    loss = GRPOConfig(level=level, loss_type=loss_type, epsilon=0.2, epsilon_high=None, beta=0.04).loss(T)
    _forward_backward(benchmark, lambda: loss(logps, old, ref, adv, mask))


def test_dpo_loss(benchmark):
    benchmark.group = "loss (64 x 64 tokens, forward + backward)"
    fn = _loss_fn("dpo_loss")
    logps, old, ref, _, mask = _batch()
    seq = lambda x: (x * mask).sum(-1)  # noqa: E731  (B,) sequence log-probs
    half = B // 2
    _forward_backward(benchmark, lambda: fn(seq(logps)[:half], seq(logps)[half:], seq(ref)[:half], seq(ref)[half:], beta=0.1))


def test_reinforce_loss(benchmark):
    benchmark.group = "loss (64 x 64 tokens, forward + backward)"
    fn = _loss_fn("reinforce_loss")
    logps, _, ref, adv, mask = _batch()
    _forward_backward(benchmark, lambda: fn(logps, adv, mask, ref, 0.04))


def test_ppo_policy_and_value_loss(benchmark):
    benchmark.group = "loss (64 x 64 tokens, forward + backward)"
    policy_loss, value_loss, gae = _loss_fn("ppo_policy_loss"), _loss_fn("ppo_value_loss"), _loss_fn("gae")
    logps, old, _, _, mask = _batch()
    g = torch.Generator().manual_seed(1)
    values = torch.randn(B, T, generator=g).requires_grad_()
    rewards = torch.randn(B, T, generator=g) * mask

    def loss():
        advantages, returns = gae(rewards, values.detach(), mask, 1.0, 0.95)  # GAE is part of PPO's loss cost
        return policy_loss(logps, old, advantages, mask, 0.2) + 0.5 * value_loss(values, values.detach(), returns, mask, 0.2)

    _forward_backward(benchmark, loss)
