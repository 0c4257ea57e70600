"""ms-swift 4.6.0's adapter against hand-computed values: REAL's group ranking loss and its gradient, FIPO's
future-KL weight (the future, not the past) and loss; its methods come from the pinned file or not at all."""

import math

import pytest
import torch

from benchmarks.references import install, swift
from tests.benchmarks.references.conftest import t


def test_swift_real_is_the_group_ranking_loss(frameworks):
    old = torch.zeros(2, 2, dtype=torch.float64)
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
    old = torch.zeros(1, 2, dtype=torch.float64)
    logps, mask, adv = t([[0.1, -0.2]]), torch.ones(1, 2, dtype=torch.float64), t([1.0])
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
