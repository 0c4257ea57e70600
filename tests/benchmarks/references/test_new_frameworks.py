"""The 2026 reference adapters against hand-computed values: SkyRL 0.4.0's maxrl and its sequence masks, ms-swift
4.6.0's REAL and FIPO (its trainer's methods compiled from its file), OpenRLHF 0.11.2's is_correction gate and
FlashREINFORCE, verl 0.9.1's Geo-RS and bypass mode, the install of the two new pinned frameworks and Tinker's
column. Each example is small enough to compute by hand, and chosen so that the plausible wrong reading (the std for
MaxRL's mean, the past for FIPO's future, the ratio for verl's reciprocal band) gives another number."""

import math

import pytest
import torch

from benchmarks.references import features, install, openrlhf, skyrl, swift, tinker, verl

D = torch.float64


@pytest.fixture(scope="module")
def frameworks():
    install.install(["verl", "openrlhf", "skyrl", "ms-swift"], log=lambda line: None)


def t(rows):
    return torch.tensor(rows, dtype=D)


# --------------------------------------------------------------------------------------------
# install
# --------------------------------------------------------------------------------------------


def test_skyrl_is_fetched_as_a_312_wheel_with_its_light_imports():
    command = install.install_command("skyrl")
    assert command[command.index("--python-version") + 1] == "3.12" and "--only-binary=:all:" in command
    assert command.index("skyrl==0.4.0") < command.index("jaxtyping==0.3.11") and "loguru==0.8.0" in command
    assert "--python-version" not in install.install_command("verl")


def test_a_dashed_distribution_is_installed_by_its_underscored_dist_info(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_BENCH_REFERENCES", str(tmp_path))
    assert not install.is_installed("ms-swift")
    (tmp_path / "ms-swift-4.6.0" / "ms_swift-4.6.0.dist-info").mkdir(parents=True)  # what pip writes
    assert install.is_installed("ms-swift")


# --------------------------------------------------------------------------------------------
# SkyRL
# --------------------------------------------------------------------------------------------


def test_skyrl_maxrl_divides_by_the_group_mean(frameworks):
    rewards, mask = t([0.0, 1.0, 1.0, 0.5]), torch.ones(4, 3, dtype=D)
    adv = skyrl.advantages("maxrl", rewards, mask, group_size=2)
    expected = t([-0.5 / (0.5 + 1e-6), 0.5 / (0.5 + 1e-6), 0.25 / (0.75 + 1e-6), -0.25 / (0.75 + 1e-6)])
    assert torch.allclose(adv, expected.unsqueeze(-1).expand(4, 3), atol=1e-12)  # the std would give +-0.707
    assert torch.equal(skyrl.advantages("maxrl", rewards, mask, group_size=1)[:, 0], rewards)  # a lone completion
    assert "maxrl" in skyrl.registered()["estimators"]


def _ratios():
    """pi_old / pi_sampler per token: row 0 (1.02, 0.98), row 1 (1.02, 1.02), row 2 (1.005, a padded 5.0)."""
    old = torch.zeros(3, 2, dtype=D)
    sampling = -torch.log(t([[1.02, 0.98], [1.02, 1.02], [1.005, 5.0]]))
    return old, sampling, t([[1, 1], [1, 1], [1, 0]])


def test_skyrl_sequence_masks_band_the_geometric_mean_the_product_and_each_token(frameworks):
    old, sampling, mask = _ratios()
    geometric = skyrl.sequence_mask(old, sampling, mask, "geometric", geo_mask_low=0.99, geo_mask_high=1.01)
    assert geometric.view(-1).tolist() == [1.0, 0.0, 1.0]  # padding does not count: row 2 is kept
    product = skyrl.sequence_mask(old, sampling, mask, "product", product_mask_low=0.99, product_mask_high=1.03)
    assert product.view(-1).tolist() == [1.0, 0.0, 1.0]  # row 1's product 1.0404 is out, its geometric mean too
    outlier = skyrl.outlier_token_mask(old, sampling, mask, low=0.99, high=1.01)
    assert outlier.view(-1).tolist() == [0.0, 0.0, 1.0]  # row 0's mean is fine, its tokens are not
    assert skyrl.outlier_token_mask(old, sampling, mask, high=1.01).view(-1).tolist() == [0.0, 0.0, 1.0]
    assert skyrl.outlier_token_mask(old, sampling, mask, low=0.99).view(-1).tolist() == [0.0, 1.0, 1.0]


def test_skyrl_policy_loss_applies_the_mask_after_scaling_by_every_token(frameworks):
    old, sampling, mask = _ratios()
    adv = t([1.0, 1.0, 1.0])
    plain = skyrl.policy_loss(old, old, sampling, adv, mask)
    masked = skyrl.policy_loss(old, old, sampling, adv, mask, sequence_mask_metric="geometric")
    assert plain.item() == pytest.approx(-1.0)  # ratio 1: the token mean of -A
    assert masked.item() == pytest.approx(-3 / 5)  # row 1's two tokens dropped, still divided by 5 tokens


# --------------------------------------------------------------------------------------------
# ms-swift
# --------------------------------------------------------------------------------------------


def test_swift_real_is_the_group_ranking_loss(frameworks):
    old = torch.zeros(2, 2, dtype=D)
    logps = t([[0.1, 0.3], [-0.2, 5.0]]).requires_grad_()
    mask, adv = t([[1, 1], [1, 0]]), t([1.0, -1.0])
    loss = swift.loss("real", logps, old, adv, mask, group_size=2, real_tau=0.5)
    # S_0 = 0.2 (positive), S_1 = -0.2 (negative): log(1 + e^{S_1/tau}) + log(1 + e^{-S_0/tau}), one group
    assert loss.item() == pytest.approx(2 * math.log1p(math.exp(-0.4)), abs=1e-12)
    (grad,) = torch.autograd.grad(loss, logps)
    assert grad[1, 1] == 0 and grad[0, 0] == pytest.approx(-0.5 * torch.sigmoid(t(-0.4)).item() / 0.5, abs=1e-12)
    loss_tau1 = swift.loss("real", logps, old, adv, mask, group_size=2, real_tau=1.0)
    assert loss_tau1.item() == pytest.approx(2 * math.log1p(math.exp(-0.2)), abs=1e-12)


def test_swift_fipo_weighs_each_token_by_its_future_kl(frameworks):
    old = torch.zeros(1, 2, dtype=D)
    logps, mask, adv = t([[0.1, -0.2]]), torch.ones(1, 2, dtype=D), t([1.0])
    raw = swift.fipo_influence(logps, old, adv, mask, fipo_decay_rate=1.0, fipo_clip_range=None,
                               fipo_safety_threshold=None)
    # gamma = 1/2: FKL_0 = 0.1 + 0.5 (-0.2) = 0, FKL_1 = -0.2 (the past would give 0.1 and -0.15)
    assert torch.allclose(raw, t([[1.0, math.exp(-0.2)]]), atol=1e-12)
    clipped = swift.fipo_influence(logps, old, adv, mask, fipo_decay_rate=1.0)
    assert torch.allclose(clipped, t([[1.0, 1.0]]))  # ms-swift's default clip to [1, 1.2]
    loss = swift.loss("fipo", logps, old, adv, mask, group_size=1, fipo_decay_rate=1.0, fipo_clip_range=None,
                      fipo_safety_threshold=None)
    ratio = torch.exp(logps)
    expected = -(torch.minimum(ratio, ratio.clamp(0.8, 1.2)) * raw).mean()  # dapo: the token mean
    assert loss.item() == pytest.approx(expected.item(), abs=1e-12)


def test_swift_methods_come_from_the_pinned_file(frameworks, monkeypatch):
    assert "_compute_fipo_influence" in swift.methods()
    monkeypatch.setattr(swift, "_cache", {})
    monkeypatch.setattr(swift, "METHODS", swift.METHODS + ("_no_such_method",))
    with pytest.raises(install.MissingFramework, match="not the pinned file"):
        swift.methods()


# --------------------------------------------------------------------------------------------
# OpenRLHF and verl
# --------------------------------------------------------------------------------------------


def test_openrlhf_gate_drops_out_of_band_tokens_and_keeps_the_others_is_weight(frameworks):
    old, sampling, mask = _ratios()
    logps, adv = old.clone(), t([1.0, 1.0, 1.0])
    plain = openrlhf.policy_loss(logps, old, adv, mask)
    gated = openrlhf.policy_loss(logps, old, adv, mask, rollout_logps=sampling, level="token", mode="mask",
                                 gating="ratio", threshold=(0.99, 1.01))
    assert plain.item() == pytest.approx(-1.0)
    # only row 2's first token (1.005) survives, weighted by its ratio; the token mean is over 5 tokens
    assert gated.item() == pytest.approx(-1.005 / 5)
    seq = openrlhf.policy_loss(logps, old, adv, mask, rollout_logps=sampling, level="seq", mode="mask",
                               gating="ratio", threshold=(0.99, 1.01))
    assert seq.item() == pytest.approx(-(1.02 + 0.98 + 1.005) / 5)  # rows 0 and 2 kept whole, at their IS weights
    nothing = openrlhf.policy_loss(logps, old, adv, mask, rollout_logps=sampling, level="seq", mode="mask",
                                   gating="binary_kl", threshold=(0.0, 0.0))
    assert nothing.item() == 0.0


def test_openrlhf_flash_reinforce_subtracts_the_batch_mean(frameworks):
    rewards, mask = t([0.0, 1.0, 1.0, 1.0]), torch.ones(4, 2, dtype=D)
    adv, _ = openrlhf.advantages("flash_reinforce", rewards, mask, group_size=2)
    assert torch.allclose(adv[:, 0], t([-0.75, 0.25, 0.25, 0.25]))  # a group mean would give -0.5, 0.5, 0, 0


def test_verl_geo_rs_bands_the_reciprocal_ratio(frameworks):
    old, sampling, mask = _ratios()
    kept = verl.rollout_rejection_mask(old, sampling, mask, "seq_mean_k1", "0.99_1.01")
    assert kept.sum(-1).tolist() == [2.0, 0.0, 1.0]
    # pi_rollout / pi_old in [0.97, 0.99]: row 1 (1/1.02 = 0.980) kept, row 2 (1/1.005) rejected
    reciprocal = verl.rollout_rejection_mask(old, sampling, mask, "seq_mean_k1", "0.97_0.99")
    assert reciprocal.sum(-1).tolist() == [0.0, 2.0, 0.0]


def test_verl_bypass_takes_the_rollout_as_the_old_policy(frameworks):
    old, sampling, mask = _ratios()
    logps, adv = old + 0.1, t([1.0, -1.0, 2.0])
    bypass = verl.bypass_loss(logps, sampling, adv, mask)
    assert bypass.item() == pytest.approx(verl.policy_loss("vanilla", logps, sampling, adv, mask).item(), abs=1e-15)
    assert bypass.item() != pytest.approx(verl.policy_loss("vanilla", logps, old, adv, mask).item())


# --------------------------------------------------------------------------------------------
# The feature table
# --------------------------------------------------------------------------------------------


def test_feature_table_has_the_new_columns_and_tinkers_menu():
    text = features.feature_report([])
    header = next(line for line in text.splitlines() if line.startswith("| name | this suite |"))
    for heading in ("SkyRL 0.4.0", "ms-swift 4.6.0", "Tinker (docs)"):
        assert heading in header
    kl_row = next(line for line in text.splitlines() if line.startswith("| `k1` |"))
    assert "kl_sample_train_v1" in kl_row
    assert "(importance_sampling)" in text and "(dro)" in text
    assert set(tinker.POLICY_LOSSES_THEIRS_ONLY) >= {"importance_sampling", "dro"}
