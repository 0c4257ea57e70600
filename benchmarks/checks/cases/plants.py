"""The planted errors of the float64 reference checks: each replaces one of our functions (a clip, GAE, whitening, a
KL estimator, an aggregation, an estimator) for a re-run of the agreeing configurations of its groups, in every
framework that compares them; each must make at least one of them fail (``engine.run_plant``)."""

from __future__ import annotations

import torch

from algorithms import estimators, kl, losses, policy_losses
from benchmarks.checks.engine import Plant, patched, together


def _plant_clip_sign(self, x):
    clipped = torch.clamp(x.ratio, 1 - x.epsilon, 1 + x.epsilon_high)
    return -torch.max(x.ratio * x.adv, clipped * x.adv)  # max instead of min: the pessimistic bound turned optimistic


def _plant_clip_range(self, x):
    clipped = torch.clamp(x.ratio, 1 - x.epsilon_high, 1 + x.epsilon)  # the two clip bounds swapped
    return -torch.min(x.ratio * x.adv, clipped * x.adv)


def _plant_gae_off_by_one(rewards, values, mask, gamma=1.0, lam=0.95):
    shifted = torch.cat([values[:, 1:], torch.zeros_like(values[:, :1])], 1)  # V(s_{t+1}) read at t+2
    return _REAL["gae"](rewards, shifted * mask, mask, gamma, lam)


def _plant_whiten_biased(values, mask, eps=1e-8):
    mask = mask.to(values.dtype)
    n = mask.sum()
    mean = (values * mask).sum() / n
    var = (((values - mean) ** 2) * mask).sum() / n  # biased: n, not n - 1
    return (values - mean) * torch.rsqrt(var + eps) * mask


def _plant_k3_reversed(logps, ref_logps):
    delta = logps - ref_logps  # KL[pi_ref || pi]'s estimator, not KL[pi || pi_ref]'s
    return torch.exp(delta) - delta - 1


def _plant_value_unclipped(values, old_values, returns, mask, clip=0.2, num_tokens=None):
    return _REAL["ppo_value_loss"](values, old_values, returns, mask, 1e12, num_tokens)


def _plant_token_mean_padding(per_token, mask, max_len, n_items):
    return (per_token * mask).sum() / mask.numel()  # padding counted in the mean


def _plant_group_std_biased(rewards, group_size, scale="group", eps=1e-4):
    grouped = rewards.view(-1, group_size)
    centred = (grouped - grouped.mean(1, keepdim=True)).masked_fill(losses.tied_rows(grouped), 0.0)
    if scale == "none":
        return centred.view(-1)
    return (centred / (grouped.std(1, unbiased=False, keepdim=True) + eps)).view(-1)


def _plant_rloo_self(self, x):
    grouped = x.rewards.view(-1, x.group_size)
    return (grouped - grouped.mean(1, keepdim=True)).view(-1)  # the baseline includes the completion itself


def _plant_ppo_unclipped(logps, old_logps, advantages, mask, epsilon=0.2, epsilon_high=None, num_tokens=None):
    return _REAL["ppo_policy_loss"](logps, old_logps, advantages, mask, 1e12, 1e12, num_tokens)  # no trust region


def _plant_kl_reward_sign(scores, kl, mask, kl_coef, clip_min=None, clip_max=None):
    return _REAL["kl_penalised_rewards"](scores, -kl, mask, kl_coef, clip_min, clip_max)  # the KL rewarded, not paid


_REAL = {"gae": losses.gae, "ppo_value_loss": losses.ppo_value_loss, "ppo_policy_loss": losses.ppo_policy_loss,
         "kl_penalised_rewards": losses.kl_penalised_rewards}


PLANTS = (
    Plant("clip-sign", "the clipped surrogate takes max(r A, clip(r) A) instead of min", ("policy_loss", "actor_loss"),
          lambda: patched(policy_losses.GRPOClip, "objective", _plant_clip_sign)),
    Plant("clip-bounds-swapped", "clip(r, 1 - eps_high, 1 + eps): the two bounds swapped (seen only when they differ)",
          ("policy_loss",), lambda: patched(policy_losses.GRPOClip, "objective", _plant_clip_range)),
    Plant("gae-off-by-one", "GAE bootstraps from V(s_{t+2}) instead of V(s_{t+1})", ("gae",),
          lambda: patched(losses, "gae", _plant_gae_off_by_one)),
    Plant("whiten-biased-std", "masked_whiten divides by the biased variance (n, not n - 1)", ("gae", "whitening", "estimator"),
          lambda: patched(losses, "masked_whiten", _plant_whiten_biased)),
    Plant("k3-reversed", "k3 estimates KL[pi_ref || pi] (the log-ratio's sign flipped)", ("kl", "actor_loss"),
          lambda: patched(kl.KL_PENALTIES, "k3", _plant_k3_reversed, item=True)),
    Plant("ppo-clip-dropped", "PPO's policy loss without its clip (the plain importance-weighted surrogate)",
          ("ppo_policy_loss",), lambda: patched(losses, "ppo_policy_loss", _plant_ppo_unclipped)),
    Plant("kl-penalty-sign", "the KL penalty in the token rewards added instead of subtracted",
          ("kl_in_reward", "gae", "estimator"), lambda: patched(losses, "kl_penalised_rewards", _plant_kl_reward_sign)),
    Plant("value-clip-dropped", "the value loss forgets the clipped term", ("value_loss",),
          lambda: patched(losses, "ppo_value_loss", _plant_value_unclipped)),
    Plant("token-mean-counts-padding", "token-mean divides by every position, padding included", ("aggregation", "policy_loss", "actor_loss"),
          together(lambda: patched(policy_losses.LOSS_AGGREGATIONS, "token-mean", _plant_token_mean_padding, item=True),
                 lambda: patched(policy_losses.LOSS_AGGREGATIONS, "bnpo", _plant_token_mean_padding, item=True))),
    Plant("group-std-biased", "group advantages divide by the biased group std", ("estimator",),
          together(lambda: patched(losses, "group_advantages", _plant_group_std_biased),
                 lambda: patched(estimators, "group_advantages", _plant_group_std_biased))),
    Plant("rloo-includes-self", "RLOO's baseline is the group mean, the completion itself included", ("estimator",),
          lambda: patched(estimators.RLOOEstimator, "advantages", _plant_rloo_self)),
)
