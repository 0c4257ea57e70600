"""The sampler/trainer mismatch corrections: SkyRL's geometric-mean and outlier-token sequence masks, OpenRLHF's
gate, verl's bypass mode, and the registry that makes each an importance_sampling_mode with its own options.

Expected values are worked by hand from the log-ratios log(pi_old / pi_sampler) chosen below, at the band's
edges, so a product instead of the geometric mean, a padding leak, or a weight of 1 instead of the token's own
IS weight fails.
"""

import math

import pytest
import torch

from algorithms.grpo import GRPOConfig
from algorithms.sampler_corrections import SAMPLER_CORRECTIONS, sampler_correction

NAN = float("nan")


def weights(mode, log_ratio, mask, old=None, **options):
    """The correction's weights for the given log(pi_old / pi_sampler); the sampler's log-probs NaN on padding."""
    log_ratio, mask = torch.tensor(log_ratio), torch.tensor(mask)
    old = torch.full_like(log_ratio, -1.0) if old is None else torch.tensor(old)
    sampler = torch.where(mask.bool(), old - log_ratio, torch.full_like(old, NAN))
    return sampler_correction(mode).with_options(options).weights(old, sampler, mask)


def test_geometric_mask_bounds_the_mean_log_ratio_by_hand():
    # row 0: mean(0.01, -0.005, 0.011) = 0.005333, e^ = 1.00535: kept (its product e^0.016 = 1.0161 would not be)
    # row 1: mean(0.02, 0.01) = 0.015, e^ = 1.0151 > 1.01: rejected (the padding's NaN does not count)
    # row 2: e^-0.0101 = 0.98995 < 0.99: rejected;  row 3: e^-0.0099 = 0.99015: kept
    got = weights("sequence_geometric_mask", [[0.01, -0.005, 0.011], [0.02, 0.01, 0.0], [-0.0101, 0.0, 0.0],
                                              [-0.0099, 0.0, 0.0]],
                  [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    assert got.tolist() == [[1.0], [0.0], [0.0], [1.0]]
    wide = weights("sequence_geometric_mask", [[0.02, 0.01]], [[1.0, 1.0]], geo_mask_low=0.9, geo_mask_high=1.1)
    assert wide.tolist() == [[1.0]]


def test_outlier_mask_rejects_a_sequence_with_one_outlier_token():
    # ratios: e^-10 = 4.5e-5 < 1e-4; e^4.7 = 109.9 > 100; e^4.5 = 90 and e^-9 = 1.2e-4 inside; the last row's
    # outlier (e^9) sits on padding and does not count
    got = weights("sequence_outlier_mask", [[0.0, -10.0], [4.7, 0.1], [4.5, -9.0], [0.0, 9.0]],
                  [[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    assert got.tolist() == [[0.0], [0.0], [1.0], [1.0]]
    assert weights("sequence_outlier_mask", [[4.7, -10.0]], [[1.0, 1.0]], outlier_token_is_threshold_low=None,
                   outlier_token_is_threshold_high=None).tolist() == [[1.0]]  # unbounded both sides


def test_gated_ratio_token_seq_mask_and_clip_by_hand():
    e = math.exp
    # token, mask, [0.5, 5]: e^-1 = 0.368 < 0.5 -> 0; e^1 = 2.718 kept with its own weight; e^2 = 7.39 > 5 -> 0
    got = weights("gated", [[0.0, -1.0, 1.0, 2.0]], [[1.0, 1.0, 1.0, 1.0]])
    assert got[0].tolist() == pytest.approx([1.0, 0.0, e(1.0), 0.0])
    # token, clip: clamp(ratio, 0.5, 5)
    got = weights("gated", [[0.0, -1.0, 1.0, 2.0]], [[1.0, 1.0, 1.0, 1.0]], is_correction_mode="clip")
    assert got[0].tolist() == pytest.approx([1.0, 0.5, e(1.0), 5.0])
    # seq, mask: row 0 mean(-1, 1, 0.3) = 0.1, e^0.1 in band: each token keeps its OWN ratio; row 1 mean -1: 0
    got = weights("gated", [[-1.0, 1.0, 0.3], [-1.0, -1.0, 0.0]], [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]],
                  is_correction_level="seq")
    assert got[0].tolist() == pytest.approx([e(-1.0), e(1.0), e(0.3)]) and got[1, :2].tolist() == [0.0, 0.0]
    assert weights("gated", [[3.0]], [[1.0]], is_correction_level="off") is None


def test_gated_binary_kl_and_tv_trust_regions():
    # sampler p = 0.5, trainer q = 0.4: binary KL = 0.5 ln(0.5/0.4) + 0.5 ln(0.5/0.6) = 0.020411, tv = 0.1;
    # kept, a token's weight is its ratio q / p = 0.8
    old, log_ratio = [[math.log(0.4)]], [[math.log(0.4) - math.log(0.5)]]
    kl = dict(is_correction_gating="binary_kl", is_correction_level="seq", is_correction_threshold_low=0.0)
    assert weights("gated", log_ratio, [[1.0]], old, is_correction_threshold_high=0.0204, **kl).tolist() == [[0.0]]
    assert weights("gated", log_ratio, [[1.0]], old, is_correction_threshold_high=0.0205,
                   **kl)[0].tolist() == pytest.approx([0.8])
    tv = dict(kl, is_correction_gating="tv")
    assert weights("gated", log_ratio, [[1.0]], old, is_correction_threshold_high=0.099, **tv).tolist() == [[0.0]]
    assert weights("gated", log_ratio, [[1.0]], old, is_correction_threshold_high=0.101,
                   **tv)[0].tolist() == pytest.approx([0.8])


@pytest.mark.parametrize("options, message", [
    ({"is_correction_mode": "clip", "is_correction_level": "seq"}, "clip needs is_correction_level token"),
    ({"is_correction_gating": "binary_kl"}, "takes an upper bound only"),
    ({"is_correction_gating": "nope"}, "unknown is_correction_gating 'nope'"),
    ({"geo_mask_low": 1.02}, "geo_mask_low must be > 0 and <= geo_mask_high"),
    ({"outlier_token_is_threshold_low": 200.0}, "must be <= _high"),
])
def test_impossible_options_are_refused_naming_the_field(options, message):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(learning_rate=1e-3, **options).validate()


def test_bypass_uses_the_sampler_as_the_old_policy_and_applies_no_weight():
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    logps = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], requires_grad=True)
    sampler = torch.tensor([[-1.3, -1.8], [-0.4, NAN]])
    adv = torch.tensor([1.0, -1.0])
    bypass = GRPOConfig(beta=0.0, importance_sampling_mode="bypass").loss()(logps, None, None, adv, mask,
                                                                              sampling_logps=sampler)
    # at mu = 1 the ratio is pi_theta / pi_sampler: row 0 e^0.3 (clipped at 1.2 for A > 0), e^-0.2; row 1 e^-0.1
    want = ((-min(math.exp(0.3), 1.2) - math.exp(-0.2)) / 2 + max(math.exp(-0.1), 0.8)) / 2
    assert bypass.item() == pytest.approx(want, rel=1e-6)
    paper = GRPOConfig(beta=0.0).loss()
    same = paper(logps, torch.where(torch.isnan(sampler), logps.detach(), sampler), None, adv, mask)
    assert bypass.item() == pytest.approx(same.item(), rel=1e-7)
    weighted = paper(logps, None, None, adv, mask, sampling_logps=sampler)  # TRL's default mode
    assert not math.isclose(weighted.item(), bypass.item(), rel_tol=1e-3)


def test_a_mode_s_options_reach_the_correction_through_the_configured_loss():
    mask, logps = torch.ones(1, 2), torch.tensor([[-1.0, -1.0]])
    sampler = logps - 0.015  # geometric mean e^0.015: outside SkyRL's band, inside [0.9, 1.1]
    kw = dict(beta=0.0, importance_sampling_mode="sequence_geometric_mask")
    adv = torch.tensor([1.0])
    assert GRPOConfig(**kw).loss()(logps, logps, None, adv, mask, sampling_logps=sampler).item() == 0.0
    wide = GRPOConfig(geo_mask_low=0.9, geo_mask_high=1.1, **kw).loss()
    assert wide(logps, logps, None, adv, mask, sampling_logps=sampler).item() == -1.0


def test_vespo_folds_only_token_level_weights():
    base = dict(learning_rate=1e-3, loss_type="vespo", sampling_precision="bf16")
    for mode in ("sequence_geometric_mask", "sequence_outlier_mask"):
        with pytest.raises(ValueError, match="needs importance_sampling_mode token_truncate or token_mask or gated"):
            GRPOConfig(importance_sampling_mode=mode, **base).validate()
    GRPOConfig(importance_sampling_mode="gated", **base).validate()
    assert {n for n, c in SAMPLER_CORRECTIONS.items() if c.sequence_level} == {
        "sequence_truncate", "sequence_mask", "sequence_geometric_mask", "sequence_outlier_mask"}


def test_run_help_lists_each_mode_s_options_under_it(run_cli, capsys):
    with pytest.raises(SystemExit):
        run_cli("run", "--algo", "grpo", "--help")
    out = capsys.readouterr().out

    def section(heading):
        start = out.index(heading)
        return out[start:out.find("\n\n", start)]

    assert "--geo-mask-low" in section("grpo options of importance_sampling_mode sequence_geometric_mask:")
    outlier = section("grpo options of importance_sampling_mode sequence_outlier_mask:")
    assert "--outlier-token-is-threshold-high" in outlier
    gated = section("grpo options of importance_sampling_mode gated:")
    for flag in ("--is-correction-level", "--is-correction-mode", "--is-correction-gating",
                 "--is-correction-threshold-low", "--is-correction-threshold-high"):
        assert flag in gated
    assert "bypass" in out and "sequence_geometric_mask" in out[:out.index("grpo options of")]
