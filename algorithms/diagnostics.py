"""What a practitioner reads when a run goes wrong, computed from a scored rollout, the same for every
algorithm: whether groups carry a learning signal, how rewards spread within groups, completion
lengths (overall, for correct and for incorrect completions) and truncation; and, where the sampler recorded its
own log-probs, how far the sampler's distribution is from the trainer's (``sampler_mismatch``)."""

from __future__ import annotations

from typing import Optional

import torch

from algorithms.rollout import Rollout


def batch_diagnostics(rollout: Rollout, rewards: torch.Tensor, success_threshold: Optional[float] = None) -> dict[str, float]:
    """Per-step diagnostics (the shared metric vocabulary).

    groups/tied_fraction  share of groups whose rewards are all equal: no group-relative signal
    reward/group_std      mean over groups of the reward's standard deviation within the group
    length/mean           completion tokens (EOS included) per completion
    length/correct, length/incorrect
                          the same over completions whose reward reaches ``success_threshold`` and
                          over the rest (absent when the task states no threshold or a side is empty)
    truncated/fraction    share of completions that hit the length cap without an EOS
    """
    lengths = rollout.completion_mask.sum(-1).to(torch.float32)  # (B,)
    out = {"length/mean": lengths.mean().item(), "truncated/fraction": rollout.truncated.float().mean().item()}
    g = rollout.group_size
    if g > 1 and rewards.numel() % g == 0:
        grouped = rewards.view(-1, g)  # (n_prompts, G)
        out["groups/tied_fraction"] = (grouped.max(dim=1).values == grouped.min(dim=1).values).float().mean().item()
        out["reward/group_std"] = grouped.std(dim=1).mean().item()
    if success_threshold is not None:
        correct = rewards.double() >= success_threshold  # float64: a threshold just above 0 must not round to 0
        if correct.any():
            out["length/correct"] = lengths[correct].mean().item()
        if (~correct).any():
            out["length/incorrect"] = lengths[~correct].mean().item()
    return out


# A sampled token's trainer/sampler probability ratio outside this band counts in ``mismatch/ratio_outside``.
RATIO_BAND = (0.9, 1.1)


def sampler_mismatch(trainer_logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """How far the sampler that drew the tokens is from the trainer that scores them (Tinker's diagnostics), over
    the completion tokens (``mask`` 1), from the log-probs of the sampled tokens, (B, T) each:

    mismatch/kl_v1           mean over tokens of (log p_sampler - log p_trainer): the k1 estimate of
                             KL(sampler || trainer), since the tokens are the sampler's
    mismatch/kl_v2           mean over tokens of 0.5 * (log p_sampler - log p_trainer)^2: the k2 estimate
    mismatch/ratio_outside   share of tokens whose ratio exp(log p_trainer - log p_sampler) leaves [0.9, 1.1]

    Each is exactly 0 where the two log-probs agree bit for bit, and 0 when no token is active; a NaN sampler
    log-prob (a token the sampler did not score) counts as no mismatch, as the sampler corrections count it.
    Computed in float64, so that a gap of one fp32 rounding step still shows."""
    active = mask.bool()
    diff = torch.nan_to_num(sampling_logps.double() - trainer_logps.detach().double(), nan=0.0)[active]
    if diff.numel() == 0:
        return {"mismatch/kl_v1": 0.0, "mismatch/kl_v2": 0.0, "mismatch/ratio_outside": 0.0}
    ratio = torch.exp(-diff)
    low, high = RATIO_BAND
    return {"mismatch/kl_v1": diff.mean().item(), "mismatch/kl_v2": (0.5 * diff.square()).mean().item(),
            "mismatch/ratio_outside": ((ratio < low) | (ratio > high)).double().mean().item()}
