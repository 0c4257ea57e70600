"""The planted errors of the float64 reference checks: each replaces one of our functions (a clip, GAE, whitening, a
KL estimator, an aggregation, an estimator, a loss, a sampler correction) for a re-run of the agreeing
configurations of its groups, in every framework that compares them; each must make at least one of them fail
(``engine.run_plant``). A planted error in a member this suite does not have yet is left out."""

from __future__ import annotations

import dataclasses

import torch

from algorithms import estimators, kl, losses, policy_losses
from benchmarks.checks.engine import Plant, patched, together
from benchmarks.references.features import sampler_corrections


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


def _plant_maxrl_std(self, x):
    grouped = x.rewards.view(-1, x.group_size)  # GRPO's std where MaxRL divides by the group mean
    centred = grouped - grouped.mean(1, keepdim=True)
    return (centred / (grouped.std(1, keepdim=True, correction=0) + 1e-6)).view(-1)


def _plant_flash_group_mean(self, x):
    grouped = x.rewards.view(-1, x.group_size)  # the group's mean as the baseline, not the batch's
    return (grouped - grouped.mean(1, keepdim=True)).view(-1)


def _flipped(x, length: int):
    """The inputs with time reversed (every (..., T) tensor flipped along its last axis)."""
    flip = {f.name: getattr(x, f.name).flip(-1) for f in dataclasses.fields(x)
            if isinstance(getattr(x, f.name), torch.Tensor) and getattr(x, f.name).size(-1) == length > 1}
    return dataclasses.replace(x, **flip)


def _plant_past(objective):
    """A token-local objective's weight read from the past: run it on the reversed sequence, reverse it back (FIPO's
    future KL becomes the KL of the tokens before)."""
    def wrong(self, x):
        length = x.mask.size(-1)
        return objective(self, _flipped(x, length)).flip(-1)

    return wrong


def _plant_signs(objective):
    def wrong(self, x):
        return objective(self, dataclasses.replace(x, adv=-x.adv))  # REAL ranks the negatives above the positives

    return wrong


def _plant_sum_not_mean(self, old_logps, sampling_logps, mask, clip_min=None, clip_max=None):
    log_ratio = (old_logps - sampling_logps) * mask  # the product of the ratios, not their geometric mean
    geometric = torch.exp(log_ratio.sum(-1, keepdim=True))
    return ((geometric >= self.options.geo_mask_low) & (geometric <= self.options.geo_mask_high)).to(mask.dtype)


def _plant_outlier_tokens(self, old_logps, sampling_logps, mask, clip_min=None, clip_max=None):
    o = self.options  # the outlier token alone dropped, its sequence kept
    ratio = torch.exp(old_logps - sampling_logps)
    low = 0.0 if o.outlier_token_is_threshold_low is None else o.outlier_token_is_threshold_low
    high = float("inf") if o.outlier_token_is_threshold_high is None else o.outlier_token_is_threshold_high
    return ((ratio >= low) & (ratio <= high)).to(mask.dtype)


def _plant_gate_unweighted(weights):
    def wrong(self, old_logps, sampling_logps, mask, clip_min=None, clip_max=None):
        w = weights(self, old_logps, sampling_logps, mask, clip_min, clip_max)
        return None if w is None else (w != 0).to(w.dtype)  # the survivors' IS weight dropped (1, not rho)

    return wrong


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


def _new_members() -> tuple[Plant, ...]:
    """The planted errors of the 2026 members: each where this suite has the member."""
    estimators_, losses_ = estimators.ADVANTAGE_ESTIMATORS, policy_losses.POLICY_LOSSES
    corrections = sampler_corrections()
    candidates = (
        (estimators_, "maxrl", Plant(
            "maxrl-divides-by-std", "MaxRL divides the centred reward by the group's std (GRPO's), not its mean",
            ("estimator",), lambda: patched(estimators_["maxrl"], "advantages", _plant_maxrl_std), ("maxrl",))),
        (estimators_, "flash_reinforce", Plant(
            "flash-reinforce-group-mean", "FlashREINFORCE's baseline is the group's mean, not the batch's",
            ("estimator",), lambda: patched(estimators_["flash_reinforce"], "advantages", _plant_flash_group_mean),
            ("flash_reinforce",))),
        (losses_, "real", Plant(
            "real-signs-swapped", "REAL ranks the non-positive-advantage completions above the positive ones",
            ("policy_loss",), lambda: patched(losses_["real"], "objective", _plant_signs(losses_["real"].objective)),
            ("real",))),
        (losses_, "fipo", Plant(
            "fipo-past-kl", "FIPO weighs a token by the discounted KL of the tokens before it, not after",
            ("policy_loss",), lambda: patched(losses_["fipo"], "objective", _plant_past(losses_["fipo"].objective)),
            ("fipo",))),
        (corrections, "sequence_geometric_mask", Plant(
            "geometric-mask-product", "the geometric-mean sequence mask bands the product of the ratios instead",
            ("sampler_correction",),
            lambda: patched(corrections["sequence_geometric_mask"], "weights", _plant_sum_not_mean),
            ("sequence_geometric_mask", "sequence_geometric_mask (bnpo)"))),
        (corrections, "sequence_outlier_mask", Plant(
            "outlier-token-only", "outlier rejection drops the outlier token alone, not its whole sequence",
            ("sampler_correction",),
            lambda: patched(corrections["sequence_outlier_mask"], "weights", _plant_outlier_tokens),
            ("sequence_outlier_mask", "sequence_outlier_mask (bnpo)"))),
        (corrections, "gated", Plant(
            "gate-drops-is-weight", "OpenRLHF's gate keeps a surviving token at weight 1 instead of its IS ratio",
            ("sampler_correction",),
            lambda: patched(corrections["gated"], "weights", _plant_gate_unweighted(corrections["gated"].weights)),
            ("gated (bnpo)",))),
        (corrections, "bypass", Plant(
            "bypass-keeps-old-logps", "bypass mode keeps the trainer's old log-probs instead of the sampler's",
            ("sampler_correction",), lambda: patched(corrections["bypass"], "bypass", False),
            ("bypass (bnpo)", "bypass (dual_clip)"))),
    )
    return tuple(plant for registry, name, plant in candidates if name in registry)


PLANTS = PLANTS + _new_members()
