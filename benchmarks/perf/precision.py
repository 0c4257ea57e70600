"""``grpo-bench bench precision``: what bf16 training saves, per algorithm and phase, measured side by side.

Each variant of a matrix (default: the real-LM verdict matrix's, at its first grid point) is built at every training
precision (``TRAINING_PRECISIONS``: fp32, bf16 autocast, bf16 with fp32 logits) in one process, on the same seed and
the same prompts, and its full training steps (sampling, reference and old log-probs, the update) are timed in
interleaved rounds after one warm-up step each (DPO builds its preference pairs there), each precision leading a
round in turn. A step's phases come from the algorithm's own timer (PPO's also times its critic inside the update). Seconds are per 1,280 generated completions (the
real-LM cells' budget): a step's time over the completions it generated, times 1,280, median over rounds; the speed-up
is the median over rounds of fp32's per-completion time over the other's in the same round, with a percentile-
bootstrap 95% interval. Evaluation runs in fp32 at every precision (outside autocast) and is not part of this."""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from pathlib import Path
from typing import Optional

import torch

from algorithms.ppo import CRITIC_PHASE
from benchmarks.harness import build, resolve
from benchmarks.harness.measure import TRAINING_PRECISIONS, environment
from benchmarks.io import PHASES, atomic_write_text
from benchmarks.markdown import markdown_table
from benchmarks.matrix.plan import variant_settings
from benchmarks.perf.grpo_vs_trl import matmul_gflops, median_interval
from benchmarks.study import MatrixVariantsSettings, at_least, measure_parts, option

CELL_COMPLETIONS = 1280  # the real-LM matrices' budget per cell
# The step's phases (benchmarks.io.PHASES) this bench reports: all but "score", the task's reward function, which
# runs outside autocast and so does not depend on the training precision.
SHOWN_PHASES = tuple(p for p in PHASES if p != "score")


@dataclasses.dataclass
class PrecisionBenchSettings(MatrixVariantsSettings):
    rounds: int = dataclasses.field(default=5, metadata={"help": "timed rounds after a warm-up"})
    seed: int = option("seed")
    threads: int = option("threads", 1, shown="1, a matrix cell's one core")
    out: str = option("out", "results/perf")  # precision.md and precision.json
    resume: bool = option("resume")  # the variants OUT's precision.json measured with the same settings


def _per_cell(metrics: dict, key: str) -> float:
    return metrics[key] / max(metrics.get("completions", 0.0), 1.0) * CELL_COMPLETIONS


def _median_phase(steps: list[dict], phase: str) -> Optional[float]:
    """A phase's median seconds per cell over the steps that ran it (None: this algorithm has no such phase)."""
    values = [_per_cell(s, f"time/{phase}") for s in steps if f"time/{phase}" in s]
    return statistics.median(values) if values else None


def time_variant(settings: dict, *, rounds: int, seed: int, log=print) -> dict:
    """Every precision's timed steps of one variant and their summary."""
    algos, tasks = {}, {}
    for label, precision, logits in TRAINING_PRECISIONS:
        rc, config, task_options = resolve({**settings, "seed": seed, "out": "/dev/null", "device": "cpu",
                                            "precision": precision, "logits_precision": logits})
        tasks[label], _, algos[label], _ = build(rc, config, task_options)
    labels = list(algos)
    task = tasks[labels[0]]
    per_step = algos[labels[0]].config.prompts_per_step
    pool = task.train_prompts()
    steps: dict[str, list[dict]] = {label: [] for label in labels}
    for r in range(rounds + 1):  # round 0 is the warm-up
        prompts = [pool[(r * per_step + i) % len(pool)] for i in range(per_step)]
        for i in range(len(labels)):
            label = labels[(r + i) % len(labels)]
            start = time.perf_counter()
            metrics = algos[label].step(prompts)
            elapsed = time.perf_counter() - start
            if r:
                steps[label].append({**{k: v for k, v in metrics.items() if k.startswith("time/") or k == "completions"},
                                     "time/step": elapsed})
        if r:
            log(f"  round {r}/{rounds}: " + ", ".join(f"{label} {steps[label][-1]['time/step']:.2f} s" for label in labels))
    reference = [_per_cell(s, "time/step") for s in steps[labels[0]]]
    out = {}
    for label in labels:
        mine = [_per_cell(s, "time/step") for s in steps[label]]
        ratios = [a / b for a, b in zip(reference, mine)]
        out[label] = {"cell_s": statistics.median(mine),
                      "phases_cell_s": {p: _median_phase(steps[label], p) for p in SHOWN_PHASES},
                      "critic_cell_s": _median_phase(steps[label], CRITIC_PHASE),  # of the update, where one is
                      "speedup": statistics.median(ratios), "speedup_ci95": list(median_interval(ratios, seed=seed)),
                      "steps": steps[label]}
    return out


def headline(report: dict) -> str:
    """The range over variants of each lower precision's speed-up."""
    parts = []
    for label, _, _ in TRAINING_PRECISIONS[1:]:
        ups = {v: r[label]["speedup"] for v, r in report["variants"].items() if label in r}
        if ups:
            low, high = min(ups, key=ups.get), max(ups, key=ups.get)
            parts.append(f"{label} {ups[low]:.2f}x ({low}) to {ups[high]:.2f}x ({high})")
    return (f"**Training at a lower precision, {len(report['variants'])} variants side by side on "
            f"{report['environment']['device_name']}: speed-up over fp32 per 1,280 completions " + "; ".join(parts) + ".**")


def render(report: dict) -> str:
    env = report["environment"]
    load = report["load"]
    lines = [f"# What bf16 training saves, per algorithm (`{report['command']}`)", "", headline(report), "",
             f"{env['device_name']}, {report['threads']} torch thread(s), torch {env['versions'].get('torch', '?')}; "
             f"a 2048 x 2048 product at {report['gflops']['fp32']:.0f} GFLOP/s in fp32 and {report['gflops']['bf16']:.0f} "
             f"in bf16 on those threads. 1-minute load average {load['start']:.1f} at the start and {load['end']:.1f} at "
             f"the end on {os.cpu_count()} CPUs (other work shared the machine: the times are side by side, in "
             "interleaved rounds, so their ratios hold; the seconds themselves are this machine's under that load).", "",
             f"Matrix `{report['matrix']}`, task `{report['task']}`, each variant at its first grid point, seed "
             f"{report['seed']}, {report['rounds']} timed rounds after one warm-up step. Seconds of training per "
             f"{CELL_COMPLETIONS:,} generated completions (median over rounds); evaluation is fp32 at every precision and "
             "not included. Speed-up: fp32's time over this precision's, per round, median [95% bootstrap].", ""]
    rows = []
    for variant, by_precision in report["variants"].items():
        for label, r in ((label, by_precision[label]) for label, _, _ in TRAINING_PRECISIONS if label in by_precision):
            phases = [f"{r['phases_cell_s'][p]:.0f}" if r["phases_cell_s"].get(p) is not None else "-" for p in SHOWN_PHASES]
            phases.append("-" if r.get("critic_cell_s") is None else f"{r['critic_cell_s']:.0f}")
            low, high = r["speedup_ci95"]
            rows.append([variant, label, f"{r['cell_s']:.0f}", *phases,
                         "1.00x" if label == TRAINING_PRECISIONS[0][0] else f"{r['speedup']:.2f}x [{low:.2f}, {high:.2f}]"])
    lines.append(markdown_table(["variant", "precision", "training s per 1,280", "generate", "log-probs", "update",
                                 "of it the critic", "speed-up"], rows))
    varying = [v for v, by_precision in report["variants"].items()
               if len({s["completions"] for r in by_precision.values() for s in r["steps"]}) > 1]
    if varying:
        lines += ["", f"{', '.join(varying)}: the completions a step generated varied (dynamic sampling refills tied "
                      "groups), and each precision's own trajectory decides how often, so its ratio mixes the "
                      "precision's speed with the step's shape; the seconds are still per completion generated."]
    return "\n".join(lines) + "\n"


def run_precision_bench(settings: PrecisionBenchSettings, *, command: str = "grpo-bench bench precision", log=print) -> dict:
    at_least(rounds=(settings.rounds, 2), threads=(settings.threads, 1))
    task, variants = variant_settings(settings.matrix, settings.task, settings.variants)
    torch.set_num_threads(settings.threads)
    out = Path(settings.out)
    same = {"matrix": settings.matrix, "task": task, "seed": settings.seed, "rounds": settings.rounds,
            "threads": settings.threads}
    header = {"command": command, **same, "environment": environment(torch.device("cpu")),
              "gflops": {"fp32": matmul_gflops(torch.float32), "bf16": matmul_gflops(torch.bfloat16)},
              "load": {"start": os.getloadavg()[0], "end": None}}
    report = measure_parts(settings, out / "precision.json", same, header, variants, log=log,
                           measure=lambda options: time_variant(options, rounds=settings.rounds, seed=settings.seed,
                                                                log=log))
    atomic_write_text(out / "precision.md", render(report))
    log(f"-> {out / 'precision.md'}")
    return report
