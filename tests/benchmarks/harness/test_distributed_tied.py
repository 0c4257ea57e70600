"""Data parallelism for every algorithm on a batch whose first rank's share ties (every reward equal, or DPO pairs
whose two completions are one text): a 2-process step (gloo, spawn) gives the one-process update on the same global
batch, to 1e-6, gradients and parameters. A rank whose own share carries no signal still updates when another rank's
does (otherwise one rank enters the gradient all-reduce alone and the run breaks), and batch statistics (RLOO's
advantage normalisation, REINFORCE++'s whitening) are taken over the global batch, not over one rank's rows."""

import json

import pytest
import torch

from benchmarks.harness import distributed
from tests.benchmarks.harness.test_distributed import _build, _fixed_rollout

# name -> (algorithm, config options); beta / kl_coef 0 where the KL would give a tied share a signal of its own
CASES = {
    "reinforce": ("reinforce", {"beta": 0.0}),
    "ppo": ("ppo", {"epochs": 1, "minibatches": 1}),
    "grpo": ("grpo", {"beta": 0.0}),
    "rloo": ("rloo", {"beta": 0.0}),
    "rloo-normalized": ("rloo", {"beta": 0.0, "normalize_advantages": True}),
    "rloo-kl": ("rloo", {"normalize_advantages": True}),
    "reinforce_pp": ("reinforce_pp", {"kl_coef": 0.0}),
    "reinforce_pp-baseline": ("reinforce_pp", {"kl_coef": 0.0, "group_baseline": True}),
    "reinforce_pp-kl-in-loss": ("reinforce_pp", {"kl_in_loss": True, "kl_estimator": "k3"}),
    "dpo": ("dpo", {"pairs_per_step": 4}),
}
WORLD = 2


def _global_rewards(num_completions: int) -> torch.Tensor:
    """The first half of the rows (rank 0's groups) all 1.0, the second half alternating 0, 1: a tied share."""
    half = num_completions // 2
    return torch.cat([torch.ones(half), torch.arange(num_completions - half).remainder(2).float()])


def _dpo_pairs(task, algo):
    """Four pairs, rank 0's two with the same text chosen and rejected (no preference), rank 1's two differing."""
    from algorithms import rollout as rollout_lib

    pool = task.train_prompts()
    texts = rollout_lib.generate(algo.policy, task.tokenizer, [pool[0]], 4, max_new_tokens=algo.sampling.max_new_tokens,
                                 temperature=1.0, generator=torch.Generator().manual_seed(1)).completions
    pairs = {"prompts": [pool[i % len(pool)] for i in range(4)], "chosen": [texts[0], texts[1], texts[2], texts[3]],
             "rejected": [texts[0], texts[1], texts[2] + "a", texts[3] + "b"], "samples": 8, "ties_dropped": 0}
    return pairs


def _one_step(algo_name: str, options: dict, data_parallel) -> tuple[dict, dict, dict]:
    """One step on the fixed global batch (this rank's share of it under data parallelism): the parameters after
    it, the gradients the optimizer stepped with and the step's metrics."""
    task, algo = _build(algo_name, options)
    if algo_name == "dpo":
        algo.pairs, algo.order = _dpo_pairs(task, algo), [3, 2, 1, 0]  # the step takes pairs 0, 1, 2, 3
        prompts = [task.train_prompts()[0]] * algo.config.prompts_per_step  # unused by DPO
    else:
        prompts, rollout, k = _fixed_rollout(algo, task)
        rewards = _global_rewards(rollout.num_completions)
        if data_parallel is not None:
            mine = data_parallel.shard(list(range(len(prompts))))
            rows = torch.tensor([p * k + j for p in mine for j in range(k)])
            rollout, prompts, rewards = rollout.select(rows), [prompts[p] for p in mine], rewards[rows]
        algo.generate = lambda _prompts, _group_size=None: rollout
        algo.score = lambda _rollout: rewards
    if data_parallel is not None:
        algo.set_data_parallel(data_parallel)
        if algo_name == "dpo":
            prompts = data_parallel.shard(prompts)
    grads = {}
    step = algo.optimizer.step

    def recording_step(*args, **kwargs):
        for name, p in algo.policy.named_parameters():
            if p.grad is not None:
                grads[name] = grads.get(name, 0) + p.grad.detach().clone()
        return step(*args, **kwargs)

    algo.optimizer.step = recording_step
    metrics = algo.step(prompts)
    return {n: p.detach().clone() for n, p in algo.policy.named_parameters()}, grads, metrics


def _rank_main(out_path: str, names: list) -> None:
    torch.set_num_threads(1)
    dp = distributed.from_env(timeout_s=60)
    results = {}
    for name in names:
        algo_name, options = CASES[name]
        params, grads, metrics = _one_step(algo_name, options, dp)
        if dp.rank == 0:
            ref_params, ref_grads, ref_metrics = _one_step(algo_name, options, None)
            results[name] = {
                # as in test_distributed: AdamW's step on a rounding-level gradient element is +-lr either way
                "param_diff": max(((params[n] - ref_params[n]) * (ref_grads[n].abs() >= 1e-6 if n in ref_grads else 1))
                                  .abs().max().item() for n in params) if ref_grads else None,
                "grad_diff": (max((grads[n] - ref_grads[n]).abs().max().item() for n in ref_grads)
                              if ref_grads else None),
                "grad_scale": max((g.abs().max().item() for g in ref_grads.values()), default=0.0),
                "same_keys": sorted(grads) == sorted(ref_grads),
                "skipped": [metrics.get("skipped_update"), ref_metrics.get("skipped_update")],
            }
    if dp.rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Every case in one pair of processes."""
    out = tmp_path_factory.mktemp("dp-tied") / "results.json"
    distributed.launch(_rank_main, WORLD, str(out), list(CASES))
    return json.loads(out.read_text())


@pytest.mark.parametrize("name", list(CASES))
def test_two_process_step_on_a_tied_share_equals_one_process_step(results, name):
    r = results[name]
    assert r["skipped"] == [0.0, 0.0], r  # the global batch has a signal: every rank updates, as one process
    assert r["same_keys"] and r["grad_scale"] > 1e-4, r  # a real gradient, so the comparison means something
    assert r["grad_diff"] < 1e-6, r
    assert r["param_diff"] < 1e-6, r
