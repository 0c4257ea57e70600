"""The Python API: train any registered algorithm on any transformers causal LM in a few lines.

    from benchmarks.api import train
    from algorithms.grpo import GRPOConfig

    result = train(model, tokenizer, reward_fn, prompts, config=GRPOConfig(learning_rate=1e-5), steps=50)
    result.summary["accuracy_after"], result.metrics[-1]["reward/mean"]

``train`` is what ``grpo-bench run`` calls: the same settings by the same names (any RunConfig field, any
field of the algorithm's config, any task option), resolved by ``benchmarks.harness.config.resolve`` and
run by ``benchmarks.harness.loop.run``, so a run from Python and the same run from the command line write
the same files and metrics. ``model`` is trained in place (with ``lora_r`` > 0, PEFT injects its adapter
into it); ``result.policy`` is what was trained (the PEFT model under LoRA).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from algorithms import ALGORITHMS
from benchmarks.errors import UsageError
from benchmarks.harness.config import resolve
from benchmarks.harness.loop import make_evaluated_task, run
from benchmarks.io import read_jsonl
from tasks.base import GenerationDefaults, load_pretrained
from tasks.custom import PromptsTask


@dataclass
class Result:
    summary: dict  # summary.json: accuracy and reward before/after, wall-clock, memory, the resolved config
    metrics: list[dict]  # metrics.jsonl: one row per step
    policy: Any  # the trained model
    out: Optional[Path]  # the run directory, None when the run went to a temporary one


def _algo_name(config) -> str:
    for name, cls in ALGORITHMS.items():
        if type(config) is cls.Config:
            return name
    raise UsageError(f"{type(config).__name__} is not the config of a registered algorithm "
                     f"({', '.join(sorted(ALGORITHMS))})")


def train(model=None, tokenizer=None, reward_fn: Optional[Callable] = None, prompts: Optional[Sequence[str]] = None, *,
          algo: Optional[str] = None, config=None, task: Optional[str] = None, eval_prompts: Optional[Sequence[str]] = None,
          out: Optional[str] = None, progress: bool = True, spell: Callable[[str], str] = repr, **settings) -> Result:
    """Train and evaluate; returns the summary, the per-step metrics and the trained policy.

    Either ``model``, ``tokenizer``, ``reward_fn(prompts, completions) -> list[float]`` and ``prompts``
    (the ``prompts`` task, ``tasks/custom.py``: accuracy is the share of evaluation rewards above
    ``accuracy_threshold``, default 0), or ``task="pizza"`` etc. (``reward_fn`` then replaces its reward).
    ``config`` is an algorithm's config (``GRPOConfig(...)``; it names the algorithm) or ``algo`` names one
    with its defaults. ``settings`` are any other run, algorithm or task settings by name (``steps``,
    ``seed``, ``lora_r``, ``report_to``, ``eval_samples``, ...). ``out`` is the run directory (default: a
    temporary one, removed afterwards). ``spell`` writes setting names in error messages (the CLI: as flags).
    """
    # A string is a setting of the same name: a model's hub id or directory, a prompts file (as on the command line).
    for name, value in (("model", model), ("prompts", prompts), ("eval_prompts", eval_prompts)):
        if isinstance(value, (str, os.PathLike)):
            settings[name] = str(value)
    model = None if isinstance(model, (str, os.PathLike)) else model
    prompts = None if isinstance(prompts, (str, os.PathLike)) else prompts
    eval_prompts = None if isinstance(eval_prompts, (str, os.PathLike)) else eval_prompts
    options: dict[str, Any] = {}
    if config is not None:
        config_algo = _algo_name(config)
        if algo is not None and algo != config_algo:
            raise UsageError(f"algo {algo!r} but config is a {type(config).__name__} ({config_algo})")
        algo = config_algo
        options.update({k: v for k, v in config.settings().items() if v is not None})
    options.update(settings)
    # Only an algorithm not named at all defaults to GRPO: an empty or unknown name is refused by ``resolve``.
    options["algo"] = algo if algo is not None else options.get("algo", "grpo")
    if model is not None or prompts is not None:
        if task not in (None, "prompts"):
            raise UsageError(f"a model and prompts train on the prompts task, not on task {task!r}")
        if reward_fn is None or not prompts or (model is None and "model" not in settings):
            raise UsageError("train(model, tokenizer, reward_fn, prompts) needs a model, a reward function and prompts")
        if model is not None and tokenizer is None:
            raise UsageError("train(model, ...) needs the model's tokenizer")
        options["task"] = "prompts"
    else:
        options["task"] = task if task is not None else options.get("task")
        if reward_fn is not None:
            options["reward_fn"] = reward_fn
    temporary = out is None and "out" not in options
    with tempfile.TemporaryDirectory(prefix="grpo-bench-") if temporary else contextlib.nullcontext() as tmp:
        if tmp is not None:
            options["out"] = str(Path(tmp) / "run")
        elif out is not None:
            options["out"] = str(out)
        rc, algo_config, task_options = resolve(options, spell=spell)
        task_obj = _prompts_task(rc, task_options, model, tokenizer, reward_fn, prompts, eval_prompts) \
            if rc.task == "prompts" else None
        return _run(rc, algo_config, task_options, task_obj, progress, temporary=tmp is not None)


def _prompts_task(rc, task_options: dict, model, tokenizer, reward_fn, prompts, eval_prompts):
    """The prompts task, its generation defaults following the run's max_new_tokens / temperature, so
    that evaluation samples as training does."""

    if prompts is None:  # everything by name (the command line)
        task = make_evaluated_task("prompts", **task_options)
    else:
        path = task_options.get("model")
        if model is None:
            model, tokenizer = load_pretrained(path)
        as_files = {"prompts", "eval_prompts"} & set(task_options)
        if as_files:
            raise UsageError(f"{', '.join(sorted(as_files))}: give lists of prompts or files, not both")
        task = PromptsTask.from_objects(model, tokenizer, prompts, reward_fn, eval_prompts=eval_prompts,
                                        **{k: v for k, v in task_options.items() if k not in ("model", "reward_fn")})
        task.model_path = path
    task.generation = GenerationDefaults(rc.max_new_tokens or task.generation.max_new_tokens,
                                         task.generation.temperature if rc.temperature is None else rc.temperature)
    return task


def _run(rc, algo_config, task_options, task, progress: bool, *, temporary: bool) -> Result:

    built = {}
    summary = run(rc, algo_config, task_options, task=task, progress=progress,
                  on_build=lambda task, policy, algo: built.update(policy=policy))
    metrics = read_jsonl(Path(rc.out) / "metrics.jsonl")
    return Result(summary, metrics, built.get("policy"), None if temporary else Path(rc.out))
