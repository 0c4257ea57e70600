"""Every non-GRPO algorithm's step computes what it computed when ``base_step_recorded.json`` was written: a few seeded
steps on the pizza task per variant, each step's metrics (the timings aside) and the policy's (and critic's) weights
after them, compared exactly. A change of the step's code that is meant to keep its behaviour must keep these bits;
one meant to change it records the file again: ``python -m tests.algorithms.test_base_step_recorded``.

The numbers are those of one torch build on one CPU kind, one thread (the file's ``host``): on another the same
code rounds differently, so there the test is skipped with one line saying so rather than failing. The variants reach each step's branches
(the KL in the reward or in the loss, several updates per batch, minibatches by rows or by prompts, a moving or a
batch baseline, DPO's pairs counted or not)."""

from __future__ import annotations

import copy
import hashlib
import json
import sys
from pathlib import Path

import pytest
import torch

from algorithms import ALGORITHMS
from algorithms.base import Sampling

RECORDED = Path(__file__).with_name("base_step_recorded.json")
STEPS = 4

# name -> (algorithm, settings); settings that tell the algorithm's branches apart, on a batch of 2 prompts
VARIANTS = {
    "rloo": ("rloo", {}),
    "rloo_mu2_options": ("rloo", {"group_size": 4, "mu": 2, "normalize_advantages": True, "mask_truncated": True,
                                  "reward_clip_max": 3.0, "epsilon_high": 0.3}),
    "rloo_no_kl": ("rloo", {"beta": 0.0, "mu": 2}),
    "reinforce_pp": ("reinforce_pp", {}),
    "reinforce_pp_baseline_kl_loss": ("reinforce_pp", {"group_baseline": True, "kl_in_loss": True,
                                                       "kl_estimator": "k3", "mu": 2, "kl_coef": 0.05}),
    "reinforce_pp_gamma": ("reinforce_pp", {"gamma": 0.9, "advantage_std_norm": False, "mu": 2}),
    "reinforce": ("reinforce", {}),
    "reinforce_kl_batch_mean": ("reinforce", {"beta": 0.05, "baseline": "batch_mean"}),
    "ppo": ("ppo", {}),
    "ppo_groups_no_kl": ("ppo", {"minibatch_rows": "groups", "kl_coef": 0.0, "skip_tied_batches": True}),
    "dpo": ("dpo", {"pairs": 8, "pairs_per_step": 4}),
    "dpo_counted": ("dpo", {"pairs": 8, "pairs_per_step": 4, "count_pair_samples": True, "beta": 0.3}),
}


@pytest.fixture(scope="module")
def pizza():
    from tasks import make_task

    return make_task("pizza")


def weights_digest(algo) -> str:
    """sha256 of every trainable module's weights, in order: the update itself, bit for bit."""
    digest = hashlib.sha256()
    for module in algo.trainable_modules():
        for name, tensor in module.state_dict().items():
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def run_variant(task, name: str) -> dict:
    algo_name, settings = VARIANTS[name]
    cls = ALGORITHMS[algo_name]
    torch.manual_seed(0)
    policy = task.load_policy(torch.device("cpu"))
    config = cls.Config(learning_rate=1e-3, prompts_per_step=2, **settings)
    ref = copy.deepcopy(policy).requires_grad_(False) if cls.needs_reference(config) else None
    algo = cls(policy, ref, task, config, Sampling(max_new_tokens=task.generation.max_new_tokens), seed=0)
    algo.completions_allowed = 64
    steps = []
    for _ in range(STEPS):
        metrics = algo.step(task.train_prompts() * 2)
        steps.append({k: v for k, v in metrics.items() if not k.startswith("time/")})
    return {"steps": steps, "weights": weights_digest(algo)}


def this_host() -> dict:
    """What the recorded bits depend on: torch's build and the CPU kernels it dispatches to."""
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def record(task) -> dict:
    return {"host": this_host(), **{name: run_variant(task, name) for name in VARIANTS}}


@pytest.mark.parametrize("name", VARIANTS)
def test_step_computes_what_was_recorded(pizza, name):
    torch.set_num_threads(1)
    recorded = json.loads(RECORDED.read_text())
    if recorded["host"] != this_host():
        pytest.skip(f"recorded on {recorded['host']}, this host is {this_host()}: bits differ by rounding; "
                    "re-record with python -m tests.algorithms.test_base_step_recorded")
    expected = recorded[name]
    got = json.loads(json.dumps(run_variant(pizza, name)))  # through JSON, as recorded (a float's repr is exact)
    for step, (ours, before) in enumerate(zip(got["steps"], expected["steps"]), 1):
        assert set(ours) == set(before), f"step {step}: metrics {set(ours) ^ set(before)} differ"
        changed = {k: (ours[k], before[k]) for k in ours if ours[k] != before[k]}
        assert not changed, f"step {step}: {changed}"
    assert got["weights"] == expected["weights"]


if __name__ == "__main__":  # python -m tests.algorithms.test_base_step_recorded: record the file again
    from tasks import make_task

    torch.set_num_threads(1)
    text = json.dumps(record(make_task("pizza")), indent=1, sort_keys=True) + "\n"
    partial = RECORDED.with_suffix(".json.partial")
    partial.write_text(text)
    partial.replace(RECORDED)  # atomic: a reader sees the old file or the new one
    sys.exit(0)
