"""Timings on pizza: one generation batch, and one training step of every registered algorithm
(parametrised over ALGORITHMS, so a new algorithm appears here without a change)."""

import pytest
import torch

from algorithms import ALGORITHMS
from algorithms.rollout import generate
from benchmarks.harness import build, resolve


def _algorithm(name: str):
    rc, config, task_options = resolve({"task": "pizza", "algo": name, "steps": 1, "device": "cpu", "precision": "fp32",
                                        "out": "/dev/null", "eval_samples": 16})
    task, policy, algo, _ = build(rc, config, task_options)
    return task, algo


def test_generation_batch(benchmark):
    benchmark.group = "generation (pizza, 4 prompts x 8 completions)"
    task, algo = _algorithm("grpo")
    generator = torch.Generator().manual_seed(0)
    prompts = task.train_prompts()[:1] * 4
    rollout = benchmark.pedantic(
        lambda: generate(algo.policy, task.tokenizer, prompts, 8, max_new_tokens=task.generation.max_new_tokens,
                         temperature=task.generation.temperature, generator=generator),
        rounds=10, warmup_rounds=1)
    assert rollout.num_completions == 32
    benchmark.extra_info["tokens_generated"] = rollout.tokens_generated


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_training_step(benchmark, name):
    benchmark.group = "one training step (pizza, default config)"
    task, algo = _algorithm(name)
    prompts = task.train_prompts()[:1] * algo.config.prompts_per_step
    metrics = benchmark.pedantic(algo.step, args=(prompts,), rounds=5, warmup_rounds=1)
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    # Per-step times differ in what a step buys: record the samples so the table can be read per completion.
    benchmark.extra_info["completions_per_step"] = algo.config.completions_per_step()
