"""The one training loop: every algorithm on every task is run, evaluated, checkpointed and measured here.

A run directory holds:
    config.json     every resolved setting, the device and the library versions
    metrics.jsonl   one row per step (the shared metric vocabulary, plus eval/* every eval_every steps)
    checkpoints/    the newest checkpoints (policy, algorithm state, RNG states); --resume continues from one
    summary.json    written last, atomically: its presence with status "complete" means the run finished
"""

from __future__ import annotations

import copy
import dataclasses
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch
from tqdm.auto import tqdm

from algorithms import ALGORITHMS, Algorithm, Sampling
from algorithms.rollout import generate
from benchmarks import measure
from benchmarks.io import append_jsonl, atomic_write, atomic_write_json, read_jsonl, rewrite_jsonl
from tasks import Task, make_task
from tasks.base import Samples

SUMMARY_KEYS = (
    "task", "algo", "variant", "seed", "device", "device_name", "accuracy_before", "accuracy_after",
    "reward_before", "reward_after", "wall_clock_s", "peak_memory_bytes", "steps", "status",
)


class UsageError(Exception):
    """Bad input detected before or during a run: reported as one line with exit status 2."""


class TrainingFailed(Exception):
    """The run itself broke (a non-finite loss): recorded in summary.json with status 'failed'."""


@dataclass
class RunConfig:
    task: str = field(default="pizza", metadata={"help": "task name"})
    algo: str = field(default="grpo", metadata={"help": "algorithm name"})
    steps: int = field(default=200, metadata={"help": "training steps"})
    seed: int = field(default=0, metadata={"help": "seed for sampling, prompts and evaluation"})
    device: str = field(default="auto", metadata={"help": "auto, cpu or cuda"})
    precision: str = field(default="auto", metadata={"help": "fp32, bf16 (autocast), or auto (bf16 on CUDA)"})
    out: str = field(default="runs/latest", metadata={"help": "run directory"})
    eval_every: int = field(default=50, metadata={"help": "evaluate every N steps (0: only before and after)"})
    checkpoint_every: int = field(default=50, metadata={"help": "checkpoint every N steps (0: never)"})
    max_new_tokens: Optional[int] = field(default=None, metadata={"help": "completion length cap (default: the task's)"})
    temperature: Optional[float] = field(default=None, metadata={"help": "sampling temperature (default: the task's)"})
    resume: bool = field(default=False, metadata={"help": "continue from the newest checkpoint in --out"})
    save_model: bool = field(default=False, metadata={"help": "save the final policy to OUT/final (save_pretrained)"})

    def validate(self) -> None:
        if self.steps < 1:
            raise UsageError(f"--steps must be >= 1, got {self.steps}")
        if self.eval_every < 0 or self.checkpoint_every < 0:
            raise UsageError("--eval-every and --checkpoint-every must be >= 0")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise UsageError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature is not None and self.temperature < 0:
            raise UsageError(f"--temperature must be >= 0, got {self.temperature}")
        if self.algo not in ALGORITHMS:
            raise UsageError(f"unknown algorithm {self.algo!r}; choose from {', '.join(sorted(ALGORITHMS))}")


def frozen_copy(model):
    ref = copy.deepcopy(model)
    ref.eval()
    ref.requires_grad_(False)
    return ref


def _checkpoints(out: Path) -> list[Path]:
    return sorted((out / "checkpoints").glob("step_*.pt"))


def _save_checkpoint(out: Path, step: int, payload: dict, keep: int = 2) -> None:
    path = out / "checkpoints" / f"step_{step:07d}.pt"
    atomic_write(path, lambda tmp: torch.save(payload, tmp))
    for old in _checkpoints(out)[:-keep]:
        old.unlink(missing_ok=True)


def rollout_sampler(model, tokenizer, prompts, *, k: int, max_new_tokens: int, temperature: float, seed: int) -> Samples:
    """Evaluation sampling through the training rollout (``algorithms.rollout.generate``): one prefill per
    prompt shared by its k samples, a static KV cache and early stopping; 2-3x transformers' generate
    on CPU. Installed as ``Task.eval_sampler``, since tasks never import algorithms."""
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    rollout = generate(model, tokenizer, prompts, k, max_new_tokens=max_new_tokens, temperature=temperature,
                       generator=generator)
    texts = [rollout.completions[i:i + k] for i in range(0, rollout.num_completions, k)]
    truncated = rollout.truncated.view(-1, k).tolist()
    return Samples(texts, truncated, rollout.tokens_generated)


def make_evaluated_task(name: str, **options) -> Task:
    """``make_task`` with the fast shared sampler installed for the task's evaluation."""
    task = make_task(name, **options)
    task.eval_sampler = rollout_sampler
    return task


def build(rc: RunConfig, algo_config, task_options: dict, task: Optional[Task] = None):
    """Resolve devices and defaults and build (task, policy, algorithm, resolved config dict)."""
    rc.validate()
    try:
        device = measure.resolve_device(rc.device)
        precision = measure.resolve_precision(rc.precision, device)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    torch.manual_seed(rc.seed)
    random.seed(rc.seed)
    task = task or make_evaluated_task(rc.task, **task_options)
    policy = task.load_policy(device)
    algo_cls = ALGORITHMS[rc.algo]
    if algo_config.learning_rate is None:
        algo_config.learning_rate = task.recommended_learning_rate
    try:
        algo_config.validate()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    ref = frozen_copy(policy) if algo_cls.needs_reference(algo_config) else None
    sampling = Sampling(
        max_new_tokens=rc.max_new_tokens or task.generation.max_new_tokens,
        temperature=task.generation.temperature if rc.temperature is None else rc.temperature,
    )
    algo = algo_cls(policy, ref, task, algo_config, sampling, seed=rc.seed, precision=precision)
    resolved = {
        "run": dataclasses.asdict(rc),
        "algo_config": dataclasses.asdict(algo_config),
        "task": task.describe(),
        "sampling": dataclasses.asdict(sampling),
        "precision": precision,
        "completions_per_step": algo_config.completions_per_step(),
        "environment": measure.environment(device),
        "policy": {"class": type(policy).__name__, "parameters": sum(p.numel() for p in policy.parameters())},
    }
    return task, policy, algo, resolved


def _evaluate(task: Task, policy, seed: int) -> dict[str, float]:
    # The same seed before, during and after: paired samples make the change less noisy.
    return task.evaluate(policy, seed=seed)


def run(rc: RunConfig, algo_config, task_options: Optional[dict] = None, *, task: Optional[Task] = None,
        on_step: Optional[Callable[[dict], None]] = None, progress: bool = True) -> dict:
    """Train, evaluate before/during/after, checkpoint, and write config.json, metrics.jsonl, summary.json."""
    out = Path(rc.out)
    task, policy, algo, resolved = build(rc, algo_config, task_options or {}, task)
    device = algo.device
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").unlink(missing_ok=True)  # a summary only ever describes a finished run
    atomic_write_json(out / "config.json", resolved)
    metrics_path = out / "metrics.jsonl"
    prompt_rng = random.Random(rc.seed)
    train_prompts = task.train_prompts()
    measure.reset_peak_memory(device)

    start_step, elapsed, before = 0, 0.0, None
    checkpoints = _checkpoints(out) if rc.resume else []
    if checkpoints:
        state = torch.load(checkpoints[-1], map_location=device, weights_only=False)
        policy.load_state_dict(state["policy"])
        algo.load_state_dict(state["algorithm"])
        torch.set_rng_state(state["torch_rng"])
        prompt_rng.setstate(state["prompt_rng"])
        start_step, elapsed, before = state["step"], state["elapsed"], state["eval_before"]
        rewrite_jsonl(metrics_path, [r for r in read_jsonl(metrics_path) if r.get("step", 0) <= start_step])
    else:
        metrics_path.unlink(missing_ok=True)
        before = _evaluate(task, policy, rc.seed)
        if rc.resume:
            tqdm.write(f"no checkpoint in {out}: starting from step 0")

    bar = tqdm(total=rc.steps, initial=start_step, desc=f"{rc.task}/{rc.algo} seed {rc.seed}", disable=not progress,
               dynamic_ncols=True)
    for step in range(start_step + 1, rc.steps + 1):
        prompts = prompt_rng.choices(train_prompts, k=algo.config.prompts_per_step)
        t0 = time.perf_counter()
        metrics = algo.step(prompts)
        step_time = time.perf_counter() - t0
        elapsed += step_time
        if not math.isfinite(metrics.get("loss", 0.0)):
            _write_summary(out, rc, resolved, before, None, elapsed, step - 1, algo, status="failed",
                           error=f"non-finite loss {metrics['loss']} at step {step}")
            raise TrainingFailed(f"{rc.algo} on {rc.task}: non-finite loss {metrics['loss']} at step {step}")
        row = {"step": step, **metrics, "time/step": step_time, "time/wall": elapsed}
        if rc.eval_every and step % rc.eval_every == 0 and step != rc.steps:
            row.update({f"eval/{k}": v for k, v in _evaluate(task, policy, rc.seed).items()})
        append_jsonl(metrics_path, row)
        bar.update(1)
        bar.set_postfix({"reward": f"{metrics.get('reward/mean', float('nan')):.3f}", "loss": f"{metrics.get('loss', 0.0):.4f}"})
        if on_step:
            on_step(row)
        if rc.checkpoint_every and step % rc.checkpoint_every == 0 and step != rc.steps:
            _save_checkpoint(out, step, {
                "step": step, "elapsed": elapsed, "eval_before": before, "policy": policy.state_dict(),
                "algorithm": algo.state_dict(), "torch_rng": torch.get_rng_state(), "prompt_rng": prompt_rng.getstate(),
            })
    bar.close()

    after = _evaluate(task, policy, rc.seed)
    if rc.save_model:
        policy.save_pretrained(out / "final")
        task.tokenizer.save_pretrained(out / "final")
    summary = _write_summary(out, rc, resolved, before, after, elapsed, rc.steps, algo, status="complete")
    return summary


def _write_summary(out: Path, rc: RunConfig, resolved: dict, before: dict, after: Optional[dict], elapsed: float,
                   steps_done: int, algo: Algorithm, *, status: str, error: Optional[str] = None) -> dict:
    rows = read_jsonl(out / "metrics.jsonl")
    phases = sorted({k for r in rows for k in r if k.startswith("time/") and k not in ("time/step", "time/wall")})
    tokens = sum(r.get("tokens/generated", 0.0) for r in rows)
    gen_time = sum(r.get("time/generate", 0.0) for r in rows)
    device = algo.device
    summary = {
        "task": rc.task,
        "algo": rc.algo,
        "variant": resolved["algo_config"],
        "seed": rc.seed,
        "device": str(device),
        "device_name": resolved["environment"]["device_name"],
        "versions": resolved["environment"]["versions"],
        "precision": resolved["precision"],
        "status": status,
        "error": error,
        "steps": steps_done,
        "completions_generated": sum(r.get("completions", 0.0) for r in rows),
        "tokens_generated": tokens,
        "tokens_per_second": tokens / gen_time if gen_time > 0 else None,
        "wall_clock_s": elapsed,
        "time_per_step_s": elapsed / steps_done if steps_done else None,
        "phase_seconds": {p[len("time/"):]: sum(r.get(p, 0.0) for r in rows) for p in phases},
        "peak_memory_bytes": measure.peak_memory_bytes(device),
        "peak_memory_kind": "cuda_max_memory_allocated" if device.type == "cuda" else "process_peak_rss",
        **measure.training_state_bytes(algo.trainable_modules(), algo.optimizers()),
        **{f"{k}_before": v for k, v in before.items()},
        **({f"{k}_after": v for k, v in after.items()} if after else {}),
        "config": resolved,
    }
    atomic_write_json(out / "summary.json", summary)
    return summary
