"""Loose ends in algorithms/: one metrics wrap-up for every algorithm's step (the base's ``step`` adds the
phase timings to ``train_step``'s metrics, ``advantage_metrics`` writes advantage/mean and advantage/std), one KL
table (OpenRLHF's ``approx_kl`` is a view of ``KL_PENALTIES``, equal bit for bit, gradients included, to the
if-branches it replaced), and one PHASES."""

from __future__ import annotations

import copy

import pytest
import torch

from algorithms import ALGORITHMS, Algorithm, Sampling
from algorithms.kl import KL_ESTIMATORS, KL_PENALTIES, approx_kl, k3_kl_bounded
from algorithms.losses import masked_mean


def _replaced_approx_kl(logps, ref_logps, estimator="k1"):
    """``approx_kl`` as it was before it became a view of the table (one if-branch per estimator), kept to show the
    view computes the same bits."""
    log_ratio = logps.float() - ref_logps.float()
    if estimator == "k1":
        kl = log_ratio
    elif estimator == "k2":
        kl = log_ratio ** 2 / 2.0
    else:
        bounded = log_ratio.clamp(min=-10.0)
        kl = torch.exp(-bounded) - 1 + bounded
    return kl.clamp(min=-10.0, max=10.0)


def _pair(scale: float, dtype: torch.dtype, n: int = 4096):
    g = torch.Generator().manual_seed(int(scale * 100))
    logps = (torch.randn(n, generator=g) * scale).to(dtype)
    ref = (torch.randn(n, generator=g) * scale).to(dtype)
    # the edges: the clamp's bounds, log r past -10 (k3's exp bounded) and far past it (exp would overflow)
    logps[:6] = torch.tensor([0.0, -10.0, 10.0, -10.0, -100.0, 100.0], dtype=dtype)
    ref[:6] = torch.tensor([0.0, 0.0, 0.0, 10.0, 0.0, 0.0], dtype=dtype)
    return logps, ref


@pytest.mark.parametrize("estimator", KL_ESTIMATORS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scale", [0.05, 2.0, 40.0])
def test_approx_kl_is_the_replaced_code_bit_for_bit(estimator, dtype, scale):
    results = []
    for fn in (approx_kl, _replaced_approx_kl):
        logps, ref = (t.clone().requires_grad_(True) for t in _pair(scale, dtype))
        kl = fn(logps, ref, estimator)
        (kl * torch.linspace(-1.0, 2.0, kl.numel())).sum().backward()
        results.append((kl.detach(), logps.grad, ref.grad))
    for ours, before in zip(*results):
        assert ours.dtype == before.dtype and torch.equal(ours, before)


def test_approx_kl_reads_the_one_table(monkeypatch):
    logps, ref = _pair(2.0, torch.float32)
    for name in ("k1", "k2"):  # the table's estimator, clamped
        assert torch.equal(approx_kl(logps, ref, name), KL_PENALTIES[name](logps, ref).clamp(-10.0, 10.0))
    # k3: the table's k3 in OpenRLHF's form (log r bounded before the exp; the same value up to rounding)
    assert torch.equal(approx_kl(logps, ref, "k3"), k3_kl_bounded(logps, ref).clamp(-10.0, 10.0))
    assert torch.allclose(approx_kl(logps, ref, "k3"), KL_PENALTIES["k3"](logps, ref).clamp(-10.0, 10.0), atol=1e-5)
    # no second list of estimators: a different entry in the table is what approx_kl computes
    monkeypatch.setitem(KL_PENALTIES, "k1", lambda lp, r: 2 * (lp - r))
    assert torch.equal(approx_kl(logps, ref, "k1"), (2 * (logps - ref)).clamp(-10.0, 10.0))
    assert set(KL_ESTIMATORS) <= set(KL_PENALTIES)
    with pytest.raises(ValueError, match="unknown KL estimator 'k9'"):
        approx_kl(logps, ref, "k9")


def test_advantage_metrics_are_the_formulas_each_step_wrote():
    g = torch.Generator().manual_seed(0)
    per_completion = torch.randn(8, generator=g)
    per_token, mask = torch.randn(4, 6, generator=g), torch.ones(4, 6)
    mask[1:, 3:] = 0
    assert Algorithm.advantage_metrics(per_completion) == {"advantage/mean": per_completion.mean().item(),
                                                           "advantage/std": per_completion.std().item()}
    assert Algorithm.advantage_metrics(per_token, mask) == {"advantage/mean": masked_mean(per_token, mask).item(),
                                                            "advantage/std": per_token[mask.bool()].std().item()}
    # one value: std 0, as REINFORCE and REINFORCE++ logged it (torch's std of one value is NaN)
    assert Algorithm.advantage_metrics(torch.tensor([0.5]))["advantage/std"] == 0.0
    one = torch.zeros(1, 3)
    one[0, 0] = 1
    assert Algorithm.advantage_metrics(torch.ones(1, 3), one) == {"advantage/mean": 1.0, "advantage/std": 0.0}


@pytest.fixture(scope="module")
def pizza():
    from tasks import make_task

    return make_task("pizza")


@pytest.mark.parametrize("name, options", [
    ("grpo", {"group_size": 2}), ("ppo", {"samples_per_prompt": 2}), ("dpo", {"pairs": 4, "pairs_per_step": 2}),
    ("reinforce", {"samples_per_prompt": 2}), ("reinforce_pp", {"samples_per_prompt": 2}), ("rloo", {}),
])
def test_every_step_is_its_train_step_and_the_timings(pizza, name, options):
    torch.manual_seed(0)
    cls = ALGORITHMS[name]
    policy = pizza.load_policy(torch.device("cpu"))
    config = cls.Config(learning_rate=1e-2, prompts_per_step=1, **options)
    ref = copy.deepcopy(policy).requires_grad_(False) if cls.needs_reference(config) else None
    algo = cls(policy, ref, pizza, config, Sampling(max_new_tokens=pizza.generation.max_new_tokens), seed=0)
    assert "step" not in vars(cls)  # the wrap-up is the base's, written once
    # and so is the step's skeleton: an algorithm holds its difference, ``learn`` (GRPO's step is still its own)
    assert ("train_step" in vars(cls)) == (name == "grpo") and ("learn" in vars(cls)) == (name != "grpo")
    seen = []
    real = algo.train_step
    algo.train_step = lambda prompts: seen.append(dict(real(prompts))) or dict(seen[-1])
    metrics = algo.step(pizza.train_prompts()[:1])
    (inner,) = seen
    assert not any(k.startswith("time/") for k in inner)
    timings = {k: v for k, v in metrics.items() if k.startswith("time/")}
    assert metrics == {**inner, **timings} and list(metrics) == [*inner, *timings]
    assert {"time/update"} <= set(timings) and all(v >= 0 for v in timings.values())
    if name == "ppo":  # the critic's share of the update, timed inside it
        assert 0 < timings["time/critic"] < timings["time/update"]
    else:
        assert "time/critic" not in timings
    assert algo.timer.pop() == {}  # popped by the step
    if name != "dpo":
        assert {"advantage/mean", "advantage/std"} <= set(metrics)
