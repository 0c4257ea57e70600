"""Issue #46's loose ends in algorithms/: one metrics wrap-up for every algorithm's step (the base's ``step`` adds the
phase timings to ``train_step``'s metrics, ``advantage_metrics`` writes advantage/mean and advantage/std)."""

from __future__ import annotations

import copy

import pytest
import torch

from algorithms import ALGORITHMS, Algorithm, Sampling
from algorithms.losses import masked_mean


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
    assert "step" not in vars(cls) and "train_step" in vars(cls)  # the wrap-up is the base's, written once
    seen = []
    real = algo.train_step
    algo.train_step = lambda prompts: seen.append(dict(real(prompts))) or dict(seen[-1])
    metrics = algo.step(pizza.train_prompts()[:1])
    (inner,) = seen
    assert not any(k.startswith("time/") for k in inner)
    timings = {k: v for k, v in metrics.items() if k.startswith("time/")}
    assert metrics == {**inner, **timings} and list(metrics) == [*inner, *timings]
    assert {"time/update"} <= set(timings) and all(v >= 0 for v in timings.values())
    assert algo.timer.pop() == {}  # popped by the step
    if name != "dpo":
        assert {"advantage/mean", "advantage/std"} <= set(metrics)

