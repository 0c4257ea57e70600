"""GRPO's configured loss (``GRPOConfig.loss()``) gives the loss, the parts and the gradients the loss gave before it
was one object, on every loss type and on the masks, corrections and terms around them: the expected numbers below
were computed by the earlier function, ``grpo_loss(..., **options)``, at the same settings as a GRPO step passed them.
A wrong setting reaching the loss (a default, an option of a member, the aggregation) moves them far beyond 1e-6."""

from __future__ import annotations

import math
import pytest
import torch

from algorithms.grpo import GRPOConfig

T = 5
NAN = float("nan")

# name -> (GRPOConfig settings, on-policy (old_logps None), with the sampler's log-probs, num_items_in_batch)
CONFIGS = {
    "paper": ({}, False, False, None),
    "on-policy": ({"mu": 1}, True, False, None),
    "gspo-bnpo-k1-bias": ({"level": "sequence", "loss_type": "bnpo", "epsilon_high": 0.28, "delta": 1.5,
                           "kl_bias_correction": True, "kl_loss_type": "k1"}, False, False, None),
    "dr_grpo-entropy": ({"loss_type": "dr_grpo", "beta": 0.0, "entropy_coef": 0.01, "top_entropy_quantile": 0.5},
                        False, False, None),
    "dapo-truncate-offpolicy": ({"loss_type": "dapo", "beta": 0.0, "off_policy_mask_threshold": 0.05,
                                 "importance_sampling_mode": "token_truncate", "importance_sampling_clip_min": 0.5,
                                 "importance_sampling_clip_max": 2.0}, False, True, 20.0),
    "cispo-token_mask": ({"loss_type": "cispo", "beta": 0.0, "epsilon_high": 5.0,
                          "importance_sampling_mode": "token_mask"}, False, True, None),
    "sapo-low_var_kl": ({"loss_type": "sapo", "sapo_temperature_neg": 1.5, "kl_loss_type": "low_var_kl"},
                        False, False, None),
    "vespo-token_truncate": ({"loss_type": "vespo", "beta": 0.0, "vespo_k_pos": 1.5,
                              "importance_sampling_mode": "token_truncate"}, False, True, None),
    "dual_clip-seq-mean-token-sum-norm": ({"loss_type": "dual_clip", "beta": 0.0, "clip_ratio_c": 2.0,
                                           "loss_aggregation": "seq-mean-token-sum-norm"}, False, False, None),
    "clip_cov": ({"loss_type": "clip_cov", "beta": 0.0, "clip_cov_ratio": 0.3, "clip_cov_lb": -10.0,
                  "clip_cov_ub": 10.0}, False, False, None),
    "kl_cov-k2": ({"loss_type": "kl_cov", "kl_cov_ratio": 0.2, "kl_loss_type": "k2"}, False, False, None),
    "gmpo": ({"loss_type": "gmpo", "beta": 0.0, "epsilon": 0.4, "epsilon_high": 0.4}, False, False, None),
    "dppo_tv": ({"loss_type": "dppo_tv", "beta": 0.0, "clip_ratio_c": 1.2, "epsilon": 0.05}, False, False, None),
    "dppo_kl": ({"loss_type": "dppo_kl", "beta": 0.0, "epsilon": 0.01, "epsilon_high": 0.02}, False, False, None),
    "real": ({"loss_type": "real", "beta": 0.0, "group_size": 2, "real_tau": 0.7}, False, False, None),
    "fipo": ({"loss_type": "fipo", "beta": 0.0, "epsilon_high": 0.28, "delta": 1.5, "fipo_decay_rate": 2.0,
              "fipo_clip_high_only": False}, False, False, None),
    "luspo-geometric": ({"loss_type": "luspo", "level": "sequence", "beta": 0.0,
                         "importance_sampling_mode": "sequence_geometric_mask", "geo_mask_low": 0.9,
                         "geo_mask_high": 1.1}, False, True, None),
    "gated-seq": ({"importance_sampling_mode": "gated", "is_correction_level": "seq",
                   "is_correction_threshold_low": 0.8, "is_correction_threshold_high": 1.25}, False, True, None),
    "outlier": ({"loss_type": "bnpo", "beta": 0.0, "importance_sampling_mode": "sequence_outlier_mask",
                 "outlier_token_is_threshold_high": 1.1}, False, True, None),
    "bypass-on-policy": ({"importance_sampling_mode": "bypass", "beta": 0.0}, True, True, None),
    "sequence_mask-off": ({"importance_sampling_correction": False}, False, True, None),
}

# name -> (loss, {part: value}, sum of d loss / d logps x PROBE, sum of |d loss / d logps|, sum of d loss / d entropies)
EXPECTED = {
    'paper': (-0.003756493330001831, {'policy': -0.004224851727485657, 'kl': 0.0004683727747760713},
              -0.13352204859256744, 0.6443725824356079, 0.0),
    'on-policy': (0.0004683583974838257, {'policy': 0.0, 'kl': 0.0004683727747760713},
                  -0.22388359904289246, 0.7527999877929688, 0.0),
    'gspo-bnpo-k1-bias': (-0.29206231236457825, {'policy': -0.2920054793357849, 'kl': -5.682529081241228e-05},
                          -0.33066534996032715, 0.7645694017410278, 0.0),
    'dr_grpo-entropy': (-0.024517305195331573, {'policy': -0.009218066930770874, 'entropy': -0.015299237333238125},
                        -0.1151701807975769, 0.2298477292060852, -0.009999999776482582),
    'dapo-truncate-offpolicy': (-0.3147401511669159, {'policy': -0.3147401511669159},
                                -0.13610827922821045, 0.34054017066955566, 0.0),
    'cispo-token_mask': (0.31113526225090027, {'policy': 0.31113526225090027},
                         -0.37349623441696167, 0.7695441842079163, 0.0),
    'sapo-low_var_kl': (-0.25986576080322266, {'policy': -0.2603340744972229, 'kl': 0.0004683727747760713},
                        -0.204911470413208, 0.7381441593170166, 0.0),
    'vespo-token_truncate': (0.49804818630218506, {'policy': 0.49804818630218506},
                             -0.40818679332733154, 0.7877288460731506, 0.0),
    'dual_clip-seq-mean-token-sum-norm': (-0.18740715086460114, {'policy': -0.18740715086460114},
                                          -0.1808171272277832, 0.43942293524742126, 0.0),
    'clip_cov': (-0.09033529460430145, {'policy': -0.09033529460430145},
                 -0.10866452008485794, 0.47805190086364746, 0.0),
    'kl_cov-k2': (-0.2637525200843811, {'policy': -0.26416704058647156, 'kl': 0.0004144894774071872},
                  -0.31665343046188354, 0.8225299119949341, 0.0),
    'gmpo': (-0.008604556322097778, {'policy': -0.008604556322097778},
             -0.18745997548103333, 0.7410383224487305, 0.0),
    'dppo_tv': (0.3935970664024353, {'policy': 0.3935970664024353},
                -0.2995818555355072, 0.6047911047935486, 0.0),
    'dppo_kl': (0.36020293831825256, {'policy': 0.36020293831825256},
                -0.27818018198013306, 0.6760352849960327, 0.0),
    'real': (1.4005773067474365, {'policy': 1.4005773067474365},
             -0.19872508943080902, 1.431913137435913, 0.0),
    'fipo': (-0.33150821924209595, {'policy': -0.33150821924209595},
             -0.32962727546691895, 0.7163805961608887, 0.0),
    'luspo-geometric': (-0.9490177035331726, {'policy': -0.9490177035331726},
                        -1.1169894933700562, 2.5324578285217285, 0.0),
    'gated-seq': (-0.011256232857704163, {'policy': -0.011724576354026794, 'kl': 0.0004683727747760713},
                  -0.14017266035079956, 0.6236776113510132, 0.0),
    'outlier': (0.08483358472585678, {'policy': 0.08483358472585678},
                -0.0018035601824522018, 0.3028830289840698, 0.0),
    'bypass-on-policy': (0.000900954008102417, {'policy': 0.000900954008102417},
                         -0.15130358934402466, 0.6295113563537598, 0.0),
    'sequence_mask-off': (-0.003756493330001831, {'policy': -0.004224851727485657, 'kl': 0.0004683727747760713},
                          -0.13352204859256744, 0.6443725824356079, 0.0),
}


def _batch():
    """Two groups of two completions, ragged (lengths 5, 3, 4, 1), with a NaN sampler log-prob (unscored)."""
    g = torch.Generator().manual_seed(7)
    logps = -torch.rand(4, T, generator=g) * 2 - 0.05
    old = logps + 0.15 * torch.randn(4, T, generator=g)
    ref = logps + 0.2 * torch.randn(4, T, generator=g)
    sampling = old + 0.1 * torch.randn(4, T, generator=g)
    sampling[1, 0] = NAN
    entropies = torch.rand(4, T, generator=g) * 2
    probe = torch.randn(4, T, generator=g)
    mask = torch.tensor([[1.0] * 5, [1.0] * 3 + [0.0] * 2, [1.0] * 4 + [0.0], [1.0] + [0.0] * 4])
    return logps, old, ref, sampling, torch.tensor([1.0, -1.0, 0.5, -0.5]), mask, entropies, probe


def _loss(name: str):
    settings, on_policy, sampled, num_items = CONFIGS[name]
    logps, old, ref, sampling, adv, mask, entropies, probe = _batch()
    logps.requires_grad_(True)
    entropies.requires_grad_(True)
    loss, parts = GRPOConfig(**settings).loss(max_completion_length=T)(
        logps, None if on_policy else old, ref, adv, mask, entropies=entropies,
        sampling_logps=sampling if sampled else None, num_items_in_batch=num_items,
        generator=torch.Generator().manual_seed(3), return_parts=True)
    loss.backward()
    entropy_grad = 0.0 if entropies.grad is None else entropies.grad.sum().item()
    return loss.item(), parts, (logps.grad * probe).sum().item(), logps.grad.abs().sum().item(), entropy_grad


@pytest.mark.parametrize("name", CONFIGS)
def test_the_configured_loss_gives_the_earlier_function_s_loss_parts_and_gradients(name):
    loss, parts, probe, size, entropy = _loss(name)
    want_loss, want_parts, want_probe, want_size, want_entropy = EXPECTED[name]
    assert all(math.isfinite(v) for v in (loss, probe, size, entropy))
    assert loss == pytest.approx(want_loss, rel=1e-6, abs=1e-9)
    assert parts == pytest.approx(want_parts, rel=1e-6, abs=1e-9)
    assert (probe, size, entropy) == pytest.approx((want_probe, want_size, want_entropy), rel=1e-6, abs=1e-9)
