"""What a practitioner reads when a run goes wrong, computed from a scored rollout, the same for every
algorithm: whether groups carry a learning signal, how rewards spread within groups, completion
lengths (overall, for correct and for incorrect completions) and truncation."""

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
