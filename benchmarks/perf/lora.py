"""``grpo-bench bench lora``: what LoRA saves, ours and TRL's, on GSM8K with SmolLM2-135M-Instruct.

Four sides, each a few GRPO steps in its own fresh subprocess so its peak memory is its own:

    ours-full   this suite's GRPO (the harness's ``build`` and ``train_steps``), every weight trained
    ours-lora   the same with ``lora_r`` > 0 (PEFT; the reference is the policy with its adapter disabled)
    trl-full    TRL's GRPOTrainer on the same model and settings
    trl-lora    TRL's GRPOTrainer with the same ``peft_config``

Reported per side: parameter bytes (all, and trainable), gradient bytes (one fp32 gradient per trainable
parameter: measured after our step; for TRL, whose Trainer frees gradients after each step, the trainable
parameters' bytes), AdamW state bytes (measured) and the process's peak memory (CPU: peak RSS, VmHWM; CUDA:
max_memory_allocated). Writes ``report.md`` and ``results.json`` to ``--out`` (default results/lora).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.harness import lora as lora_lib
from benchmarks.harness import measure
from benchmarks.harness.config import flat_settings, resolve
from benchmarks.harness.loop import build, run_sampling, train_steps
from benchmarks.references import trl as trl_ref
from tasks import make_task

SIDES = ("ours-full", "ours-lora", "trl-full", "trl-lora")


@dataclass
class Settings:
    steps: int = 2
    group_size: int = 2
    prompts_per_step: int = 1
    max_new_tokens: int = 32
    learning_rate: float = 1e-5
    beta: float = 0.04  # both sides load a reference: a copy without LoRA, the adapter-disabled policy with it
    lora_r: int = 16  # TRL ModelConfig's defaults
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    lora_target_modules: str = "all-linear"
    seed: int = 0
    device: str = "auto"


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _state(model, optimizer, grads_measured: bool) -> dict:
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    optimizer_tensors = [v for s in optimizer.state.values() for v in s.values() if hasattr(v, "numel")]
    return {
        "parameters": sum(p.numel() for p in params),
        "trainable_parameters": sum(p.numel() for p in trainable),
        "param_bytes": _bytes(params),
        "trainable_param_bytes": _bytes(trainable),
        "grad_bytes": _bytes(p.grad for p in trainable if p.grad is not None) if grads_measured else _bytes(trainable),
        "grad_bytes_measured": grads_measured,
        "optimizer_bytes": _bytes(optimizer_tensors),
    }


def _run_settings(s: Settings, lora: bool) -> dict:
    """A side's run as flat settings, a matrix cell's names: ours and TRL's ``resolve`` the same."""
    return {"task": "gsm8k", "algo": "grpo", "steps": s.steps, "seed": s.seed, "device": s.device, "precision": "fp32",
            "max_new_tokens": s.max_new_tokens, "lora_r": s.lora_r if lora else 0, "lora_alpha": s.lora_alpha,
            "lora_dropout": s.lora_dropout, "lora_target_modules": s.lora_target_modules, "group_size": s.group_size,
            "prompts_per_step": s.prompts_per_step, "learning_rate": s.learning_rate, "beta": s.beta, "eval_questions": 1}


def _ours(s: Settings, lora: bool) -> dict:
    import random

    rc, config, task_options = resolve(_run_settings(s, lora))
    task, policy, algo, _ = build(rc, config, task_options)
    start = time.perf_counter()
    for _ in train_steps(algo, task, random.Random(s.seed), range(1, s.steps + 1)):
        pass
    return {"seconds_per_step": (time.perf_counter() - start) / s.steps, **_state(policy, algo.optimizer, True)}


def _trl(s: Settings, lora: bool) -> dict:
    import torch
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback

    trl_ref.silence()
    rc, config, task_options = resolve(_run_settings(s, lora))
    device = measure.resolve_device(rc.device)
    task = make_task(rc.task, **task_options)
    torch.manual_seed(rc.seed)
    model = task.load_policy(device)
    tokenizer = task.tokenizer

    reward = trl_ref.task_reward(task, model, tokenizer)
    # Both sides sample as the run says (the task's cap and temperature where it leaves them unset, gsm8k: 0.7); the
    # committed results/lora was measured when TRL's side sampled at 1.0.
    resolved = {**flat_settings(rc, config, task_options), **asdict(run_sampling(rc, task))}
    ours = {name: resolved[name] for name in ("group_size", "prompts_per_step", "max_new_tokens", "temperature", "seed",
                                              "steps", "learning_rate", "beta")}
    args = trl_ref.config(str(Path(os.environ.get("TMPDIR", "/tmp")) / "grpo-bench-lora-trl"), ours,
                          device=device.type, disable_tqdm=True, optim="adamw_torch_fused")
    prompts = task.train_prompts()
    dataset = Dataset.from_dict({"prompt": [prompts[i % len(prompts)]
                                            for i in range(s.steps * s.group_size * s.prompts_per_step)]})
    trainer = trl_ref.trainer(args, model=model, reward_funcs=reward, train_dataset=dataset, processing_class=tokenizer,
                              peft_config=lora_lib.lora_config(rc) if rc.lora_r else None)
    trainer.remove_callback(PrinterCallback)
    start = time.perf_counter()
    trainer.train()
    seconds = (time.perf_counter() - start) / s.steps
    state = _state(trainer.model, trainer.optimizer, False)
    ref = getattr(trainer, "ref_model", None)
    state["reference"] = "adapter disabled (no copy)" if ref is None else f"a copy ({_bytes(ref.parameters())} bytes)"
    return {"seconds_per_step": seconds, **state}


def probe(side: str, s: Settings) -> dict:
    device = measure.resolve_device(s.device)
    measure.reset_peak_memory(device)
    impl, mode = side.split("-")
    result = (_ours if impl == "ours" else _trl)(s, mode == "lora")
    return {"side": side, **result, "peak_memory_bytes": measure.peak_memory_bytes(device),
            "peak_memory_kind": measure.peak_memory_kind(device)}


def run_side(side: str, s: Settings) -> dict:
    """``probe`` in a fresh subprocess: a clean peak memory."""
    # __spec__.name: this module's dotted name, also where it runs as __main__
    cmd = [sys.executable, "-m", __spec__.name, side, json.dumps(asdict(s))]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-3:] or ["no output"]
        raise RuntimeError(f"lora bench {side} failed: {' | '.join(tail)}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _mib(n) -> str:
    return f"{n / 2**20:.1f}"


def render(report: dict) -> str:
    s, env = report["settings"], report["environment"]
    lines = [
        "# LoRA vs full fine-tuning: GRPO on GSM8K, SmolLM2-135M-Instruct",
        "",
        f"{s['steps']} GRPO steps, G = {s['group_size']}, {s['prompts_per_step']} prompt per step, max_new_tokens "
        f"{s['max_new_tokens']}, beta {s['beta']}, fp32, AdamW; LoRA r {s['lora_r']}, alpha {s['lora_alpha']}, dropout "
        f"{s['lora_dropout']}, target {s['lora_target_modules']} (TRL's ModelConfig defaults). Each side in its own "
        f"subprocess on {env['device_name']}; torch {env['versions']['torch']}, transformers "
        f"{env['versions']['transformers']}, trl {env['versions']['trl']}, peft {env['peft']}.",
        "",
        "| side | trainable params | param MiB (trainable) | grad MiB | AdamW state MiB | peak memory MiB | s / step |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["sides"]:
        lines.append(f"| {r['side']} | {r['trainable_parameters']:,} | {_mib(r['param_bytes'])} "
                     f"({_mib(r['trainable_param_bytes'])}) | {_mib(r['grad_bytes'])}{'' if r['grad_bytes_measured'] else '*'} "
                     f"| {_mib(r['optimizer_bytes'])} | {_mib(r['peak_memory_bytes'])} | {r['seconds_per_step']:.1f} |")
    lines += [
        "",
        f"Peak memory: {report['sides'][0]['peak_memory_kind']} of each side's process (model, reference, "
        "activations, optimizer, and the libraries' own footprint). Without LoRA both sides hold a reference copy "
        "of the weights (beta > 0); with LoRA ours uses the policy with its adapter disabled"
        + "".join(f"; TRL's {r['side']}: reference {r['reference']}" for r in report["sides"] if "reference" in r) + ".",
        "* TRL's Trainer frees gradients after each step: shown as one fp32 gradient per trainable parameter.",
        "",
        f"Regenerate: `{report['command']}`",
        "",
    ]
    return "\n".join(lines)


def run_bench(s: Settings, out: Path, sides=SIDES, log=print) -> dict:
    import importlib.metadata

    import torch

    report = {"settings": asdict(s), "sides": [],
              "environment": {**measure.environment(measure.resolve_device(s.device)),
                              "peft": importlib.metadata.version("peft"), "threads": torch.get_num_threads()},
              "command": "grpo-bench bench lora" + ("" if s.device == "auto" else f" --device {s.device}")}
    out.mkdir(parents=True, exist_ok=True)
    for side in sides:  # the files are rewritten after each side: a long run cut short keeps what it measured
        log(f"lora bench: {side} ...")
        report["sides"].append(run_side(side, s))
        (out / "results.json").write_text(json.dumps(report, indent=1) + "\n")
        (out / "report.md").write_text(render(report))
    return report


if __name__ == "__main__":
    print(json.dumps(probe(sys.argv[1], Settings(**json.loads(sys.argv[2])))))
