"""Every algorithm's step computes what it computed when ``step_recorded.json`` was written: a few seeded steps on the
pizza task per variant, each step's metrics (the timings aside) and the policy's (and critic's) weights after them,
compared exactly. A change of the step's code that is meant to keep its behaviour must keep these bits; one meant to
change it records the file again: ``python -m tests.algorithms.test_base_step_recorded``.

The numbers are those of one torch build on one CPU kind, one thread (the file's ``host``): on another the same code
rounds differently, so there the test is skipped with one line saying so rather than failing. The variants reach each
step's branches (the KL in the reward or in the loss, several updates per batch, minibatches by rows or by prompts, a
moving or a batch baseline, DPO's pairs counted or not; GRPO's KL term or none, the entropy mask and bonus, another
aggregation, the sampler's own log-probs with a correction, dynamic sampling with overlong shaping, a per-token
estimator, a group-wise loss)."""

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

RECORDED = Path(__file__).with_name("step_recorded.json")

# name -> (algorithm, settings, steps); settings that tell the algorithm's branches apart, on a batch of 2 prompts
GRPO_VARIANTS = {
    "paper": {},
    "mu2_clip_higher_entropy": {"mu": 2, "loss_type": "bnpo", "epsilon_high": 0.28, "delta": 1.5,
                                "kl_bias_correction": True, "top_entropy_quantile": 0.5, "entropy_coef": 0.01},
    "gspo_dr_grpo_no_kl": {"level": "sequence", "loss_type": "dr_grpo", "beta": 0.0, "scale_rewards": "none",
                           "mask_truncated": True},
    "bf16_sampler_token_truncate": {"sampling_precision": "bf16", "importance_sampling_mode": "token_truncate",
                                    "importance_sampling_clip_min": 0.5, "mu": 2, "off_policy_mask_threshold": 0.01,
                                    "loss_aggregation": "seq-mean-token-sum-norm", "kl_loss_type": "low_var_kl"},
    "fp32_sampler_gated_cispo": {"sampling_precision": "fp32", "loss_type": "cispo", "epsilon_high": 5.0,
                                 "importance_sampling_mode": "gated", "beta": 0.0},
    "dapo_dynamic_overlong": {"loss_type": "dapo", "beta": 0.0, "dynamic_sampling": True, "overlong_buffer_len": 2,
                              "advantage_clip": 1.0, "group_size": 4},
    "token_baseline_clip_cov": {"advantage_estimator": "optimal_token_baseline", "loss_type": "clip_cov",
                                "clip_cov_ratio": 0.2, "mu": 2, "beta": 0.0},
    "real": {"loss_type": "real", "real_tau": 0.7, "advantage_estimator": "rloo", "group_size": 4},
}
VARIANTS = {
    "rloo": ("rloo", {}, 4),
    "rloo_mu2_options": ("rloo", {"group_size": 4, "mu": 2, "normalize_advantages": True, "mask_truncated": True,
                                  "reward_clip_max": 3.0, "epsilon_high": 0.3}, 4),
    "rloo_no_kl": ("rloo", {"beta": 0.0, "mu": 2}, 4),
    "reinforce_pp": ("reinforce_pp", {}, 4),
    "reinforce_pp_baseline_kl_loss": ("reinforce_pp", {"group_baseline": True, "kl_in_loss": True,
                                                       "kl_estimator": "k3", "mu": 2, "kl_coef": 0.05}, 4),
    "reinforce_pp_gamma": ("reinforce_pp", {"gamma": 0.9, "advantage_std_norm": False, "mu": 2}, 4),
    "reinforce": ("reinforce", {}, 4),
    "reinforce_kl_batch_mean": ("reinforce", {"beta": 0.05, "baseline": "batch_mean"}, 4),
    "ppo": ("ppo", {}, 4),
    "ppo_groups_no_kl": ("ppo", {"minibatch_rows": "groups", "kl_coef": 0.0, "skip_tied_batches": True}, 4),
    "dpo": ("dpo", {"pairs": 8, "pairs_per_step": 4}, 4),
    "dpo_counted": ("dpo", {"pairs": 8, "pairs_per_step": 4, "count_pair_samples": True, "beta": 0.3}, 4),
    **{f"grpo_{name}": ("grpo", {"group_size": 2, **settings}, 3) for name, settings in GRPO_VARIANTS.items()},
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
    algo_name, settings, steps = VARIANTS[name]
    cls = ALGORITHMS[algo_name]
    torch.manual_seed(0)
    policy = task.load_policy(torch.device("cpu"))
    config = cls.Config(learning_rate=1e-3, prompts_per_step=2, **settings)
    ref = copy.deepcopy(policy).requires_grad_(False) if cls.needs_reference(config) else None
    algo = cls(policy, ref, task, config, Sampling(max_new_tokens=task.generation.max_new_tokens), seed=0)
    algo.completions_allowed = 64
    rows = []
    for _ in range(steps):
        metrics = algo.step(task.train_prompts() * 2)
        rows.append({k: v for k, v in metrics.items() if not k.startswith("time/")})
    return {"steps": rows, "weights": weights_digest(algo)}


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
