"""Data parallelism inside one run: a 2-process step (gloo, torch.multiprocessing spawn) on a fixed rollout
split by rank gives the one-process update on the same global batch, to 1e-6, gradients and parameters."""

import json

import pytest
import torch

from benchmarks.harness import distributed

# name -> (algorithm, config options)
CASES = {
    "grpo": ("grpo", {"loss_type": "grpo"}),
    "grpo-bnpo": ("grpo", {"loss_type": "bnpo"}),
    "grpo-dr_grpo": ("grpo", {"loss_type": "dr_grpo"}),
    "grpo-dapo": ("grpo", {"loss_type": "dapo"}),
    "grpo-dapo-mu2-batchscale": ("grpo", {"loss_type": "dapo", "mu": 2, "scale_rewards": "batch"}),
    "reinforce-no-baseline": ("reinforce", {"baseline": "none"}),
    "reinforce": ("reinforce", {}),
    # One minibatch: with more, each rank draws its own minibatches, a valid PPO schedule but not one process's.
    "ppo": ("ppo", {"epochs": 1, "minibatches": 1}),
    "ppo-no-whitening": ("ppo", {"epochs": 1, "minibatches": 1, "whiten_advantages": False}),
}
WORLD = 2


def _build(algo_name: str, options: dict):
    from algorithms import ALGORITHMS, Sampling
    from benchmarks.harness.loop import frozen_copy, make_evaluated_task

    torch.manual_seed(0)
    task = make_evaluated_task("pizza", eval_samples=16)
    policy = task.load_policy(torch.device("cpu"))
    cls = ALGORITHMS[algo_name]
    config = cls.Config(learning_rate=1e-3, prompts_per_step=4, **options)
    ref = frozen_copy(policy) if cls.needs_reference(config) else None
    sampling = Sampling(max_new_tokens=task.generation.max_new_tokens, temperature=task.generation.temperature)
    return task, cls(policy, ref, task, config, sampling, seed=0)


def _fixed_rollout(algo, task):
    """The global batch: every process samples the same one (same weights, same seeded generator)."""
    from algorithms import rollout as rollout_lib

    k = getattr(algo.config, "group_size", None) or algo.config.samples_per_prompt
    pool = task.train_prompts()
    prompts = [pool[i % len(pool)] for i in range(algo.config.prompts_per_step)]
    rollout = rollout_lib.generate(algo.policy, task.tokenizer, prompts, k, max_new_tokens=algo.sampling.max_new_tokens,
                                   temperature=algo.sampling.temperature, generator=torch.Generator().manual_seed(1))
    return prompts, rollout, k


def _one_step(algo_name: str, options: dict, data_parallel) -> tuple[dict, dict]:
    """One training step on the fixed global batch (this rank's whole groups of it under data parallelism);
    returns the parameters after it and the gradients the optimizer stepped with."""
    task, algo = _build(algo_name, options)
    prompts, rollout, k = _fixed_rollout(algo, task)
    if data_parallel is not None:
        algo.set_data_parallel(data_parallel)
        mine = data_parallel.shard(list(range(len(prompts))))
        rows = torch.tensor([p * k + j for p in mine for j in range(k)])
        rollout, prompts = rollout.select(rows), [prompts[p] for p in mine]
    algo.generate = lambda _prompts, _group_size=None: rollout
    grads = {}
    step = algo.optimizer.step

    def recording_step(*args, **kwargs):
        for name, p in algo.policy.named_parameters():
            if p.grad is not None:
                grads[name] = grads.get(name, 0) + p.grad.detach().clone()  # summed over mu's updates
        return step(*args, **kwargs)

    algo.optimizer.step = recording_step
    algo.step(prompts)
    return {n: p.detach().clone() for n, p in algo.policy.named_parameters()}, grads


def _rank_main(out_path: str, names: list) -> None:
    torch.set_num_threads(1)
    dp = distributed.from_env(timeout_s=120)
    results = {}
    for name in names:
        algo_name, options = CASES[name]
        params, grads = _one_step(algo_name, options, dp)
        if dp.rank == 0:
            ref_params, ref_grads = _one_step(algo_name, options, None)
            results[name] = {
                # AdamW divides each element's step by that element's own gradient magnitude: where the gradient
                # is at rounding level (|g| < 1e-6, e.g. 1e-8 in one process and 1.1e-8 in two) the step is
                # +-lr either way, decided by the rounding. The gradient check covers those elements.
                "param_diff": max(((params[n] - ref_params[n]) * (ref_grads[n].abs() >= 1e-6 if n in ref_grads else 1))
                                  .abs().max().item() for n in params),
                "grad_diff": max((grads[n] - ref_grads[n]).abs().max().item() for n in ref_grads),
                "grad_scale": max(g.abs().max().item() for g in ref_grads.values()),
                "same_keys": sorted(grads) == sorted(ref_grads),
            }
    counts = _token_counts(dp)
    if dp.rank == 0:
        results["token_count"] = counts
        with open(out_path, "w") as f:
            json.dump(results, f)


def _token_counts(dp) -> dict:
    """dapo's normaliser: the global active-token count on every rank equals one process's mask.sum()."""
    task, algo = _build("grpo", {"loss_type": "dapo"})
    _, rollout, k = _fixed_rollout(algo, task)
    one_process = rollout.completion_mask.sum().item()
    mine = dp.shard(list(range(rollout.num_completions // k)))
    algo.set_data_parallel(dp)
    shard = rollout.select(torch.tensor([p * k + j for p in mine for j in range(k)]))
    return {"one_process": one_process, "global": algo.global_token_count(shard.completion_mask).item(),
            "local": shard.completion_mask.sum().item()}


def _launch(out, names) -> dict:
    distributed.launch(_rank_main, WORLD, str(out), names)
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Every case in one pair of processes."""
    return _launch(tmp_path_factory.mktemp("dp") / "results.json", list(CASES))


@pytest.mark.parametrize("name", list(CASES))
def test_two_process_step_equals_one_process_step(results, name):
    r = results[name]
    assert r["same_keys"] and r["grad_scale"] > 1e-4  # a real gradient, so the comparison means something
    assert r["grad_diff"] < 1e-6, r
    assert r["param_diff"] < 1e-6, r


def test_dapo_normaliser_is_the_global_token_count(results):
    counts = results["token_count"]
    assert counts["global"] == counts["one_process"] and counts["local"] < counts["one_process"]
