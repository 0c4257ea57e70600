"""``grpo-bench check trl-train``: TRL's GRPOTrainer and ours trained side by side on pizza.

Matched settings (``MATCHED``, in our names; TRL's adapter, ``benchmarks/references/trl.py``, maps them to
TRL's): the task's pretrained model, G, prompts per step, completion length, temperature (no top-k / top-p),
AdamW learning rate with a constant schedule, gradient clipping, beta, mu, loss type, epsilon, advantage
scaling, and no bf16 / no KL bias correction on TRL's side.
Both are evaluated by the same ``task.evaluate``, and both rewards see the completion text up to the first
EOS with special tokens kept (the suite's convention; TRL's own ``completions`` text drops special tokens,
so the TRL reward decodes TRL's ``completion_ids`` instead).

Each (implementation, seed) runs in a fresh process, so the CPU peak RSS (or CUDA peak allocation) of
one run is not the high-water mark of another. Time per step is the training loop's wall time / steps
(TRL: ``trainer.train()`` with evaluation and saving off; ours: the harness's step times).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import multiprocessing
import tempfile
import time
from pathlib import Path

from benchmarks.errors import UsageError
from benchmarks.harness import measure, resolve, run
from benchmarks.io import atomic_write_json, atomic_write_text, read_jsonl, save_figure
from benchmarks.references import trl as trl_ref
from benchmarks.study import StudySettings, option
from tasks import make_task

TASK = "pizza"
# The settings both sides read (ours through ``resolve``, TRL's through its adapter): GRPO's, then the run's sampling.
MATCHED = {"group_size": 8, "prompts_per_step": 4, "learning_rate": 5e-5, "beta": 0.04, "mu": 1, "loss_type": "grpo",
           "epsilon": 0.2, "scale_rewards": "group", "max_grad_norm": 1.0, "kl_bias_correction": False,
           "max_new_tokens": 12, "temperature": 1.0}


@dataclasses.dataclass
class TrlTrainSettings(StudySettings):
    """How long and how often both implementations train; everything else is ``MATCHED``."""

    steps: int = dataclasses.field(default=50, metadata={"help": "training steps per run"})
    seeds: int = dataclasses.field(default=3, metadata={"help": "seeds 0..N-1 for each implementation"})
    out: str = option("out", "results/trl_train")  # report.md, results.json and rewards.png


def run_ours(steps: int, seed: int, out: str) -> dict:
    rc, config, task_options = resolve({"task": TASK, "algo": "grpo", "steps": steps, "seed": seed, "out": out,
                                        "eval_every": 0, "checkpoint_every": 0, "precision": "fp32", **MATCHED})
    summary = run(rc, config, task_options, progress=False)
    return {
        "impl": "grpo-bench", "seed": seed, "accuracy_before": summary["accuracy_before"],
        "accuracy_after": summary["accuracy_after"], "time_per_step_s": summary["time_per_step_s"],
        "peak_memory_bytes": summary["peak_memory_bytes"], "peak_memory_kind": summary["peak_memory_kind"],
        "rewards": [r["reward/mean"] for r in read_jsonl(Path(out) / "metrics.jsonl")],
    }


def run_trl(steps: int, seed: int, out: str) -> dict:
    import torch
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback

    trl_ref.silence()
    device = measure.resolve_device("auto")
    task = make_task(TASK)
    torch.manual_seed(seed)
    model = task.load_policy(device)
    tokenizer = task.tokenizer

    task_reward = trl_ref.task_reward(task, model, tokenizer)
    before = task.evaluate(model, seed=seed)
    args = trl_ref.config(out, {**MATCHED, "seed": seed, "steps": steps}, device=device.type, disable_tqdm=True)
    prompts = task.train_prompts()
    batches = steps * MATCHED["prompts_per_step"]
    dataset = Dataset.from_dict({"prompt": [prompts[i % len(prompts)] for i in range(batches)]})
    trainer = trl_ref.trainer(args, model=model, reward_funcs=task_reward, train_dataset=dataset,
                              processing_class=tokenizer)
    trainer.remove_callback(PrinterCallback)  # it prints every step's log dict when tqdm is off
    measure.reset_peak_memory(device)
    start = time.perf_counter()
    trainer.train()
    elapsed = time.perf_counter() - start
    after = task.evaluate(model, seed=seed)
    return {
        "impl": "TRL GRPOTrainer", "seed": seed, "accuracy_before": before["accuracy"], "accuracy_after": after["accuracy"],
        "time_per_step_s": elapsed / steps, "peak_memory_bytes": measure.peak_memory_bytes(device),
        "peak_memory_kind": measure.peak_memory_kind(device),
        "rewards": [h["reward"] for h in trainer.state.log_history if "reward" in h],
    }


def _isolated(fn, *args) -> dict:
    """Run one training in a fresh process so its peak memory is its own."""
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(fn, *args).result()


def report(runs: list[dict], command: str) -> str:
    import statistics

    lines = [
        f"# TRL GRPOTrainer vs grpo-bench GRPO on {TASK}, end to end",
        "",
        f"Generated by `{command}`. Matched settings: "
        + ", ".join(f"{k}={v}" for k, v in MATCHED.items()) + " (AdamW, constant learning rate, fp32). Plot: `rewards.png`.",
        "",
        "| implementation | seed | accuracy before | accuracy after | final reward (mean of last 5 steps) | time/step (s) | peak memory (MiB) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        tail = r["rewards"][-5:]
        lines.append(f"| {r['impl']} | {r['seed']} | {r['accuracy_before']:.3f} | {r['accuracy_after']:.3f} | "
                     f"{sum(tail) / max(len(tail), 1):.3f} | {r['time_per_step_s']:.3f} | {r['peak_memory_bytes'] / 2**20:.0f} |")
    for impl in dict.fromkeys(r["impl"] for r in runs):
        mine = [r for r in runs if r["impl"] == impl]
        acc = [r["accuracy_after"] for r in mine]
        spread = f" ± {statistics.stdev(acc):.3f}" if len(acc) > 1 else ""
        lines.append(f"| **{impl} mean** | {len(mine)} seeds | | {statistics.mean(acc):.3f}{spread} | | "
                     f"{statistics.mean(r['time_per_step_s'] for r in mine):.3f} | "
                     f"{statistics.mean(r['peak_memory_bytes'] for r in mine) / 2**20:.0f} |")
    lines += ["", f"Peak memory is {runs[0]['peak_memory_kind']} of each run's own process.", ""]
    return "\n".join(lines)


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd
    import seaborn as sns

    frame = pd.DataFrame([{"implementation": r["impl"], "seed": r["seed"], "step": i + 1, "reward": v}
                          for r in runs for i, v in enumerate(r["rewards"])])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    sns.lineplot(data=frame, x="step", y="reward", hue="implementation", errorbar="sd", ax=ax)
    ax.set_title(f"{TASK}: mean training reward per step (band: ±1 sd over seeds)")
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def run_trl_train_check(settings: TrlTrainSettings, command: str) -> int:
    """Both implementations for every seed, then OUT/results.json, report.md (quoting ``command``, the command
    line that reproduces them) and rewards.png."""
    if settings.steps < 1 or settings.seeds < 1:
        raise UsageError("--steps and --seeds must be >= 1")
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    with tempfile.TemporaryDirectory() as run_dirs:  # the table and plot keep what matters; run dirs are scratch
        for seed in range(settings.seeds):
            for name, fn in (("grpo-bench", run_ours), ("trl", run_trl)):
                print(f"{name} seed {seed}: {settings.steps} steps", flush=True)
                runs.append(_isolated(fn, settings.steps, seed, str(Path(run_dirs) / f"{name}-seed{seed}")))
    atomic_write_json(out / "results.json", {"matched": MATCHED, "steps": settings.steps, "runs": runs})
    atomic_write_text(out / "report.md", report(runs, command))
    plot(runs, out / "rewards.png")
    print(report(runs, command))
    return 0
