"""``grpo-bench bench grpo-vs-trl`` / ``rloo-vs-trl``: one GRPO (or RLOO) training step of this suite against
TRL's GRPOTrainer (or RLOOTrainer), TRL at its defaults and at its fastest setting, side by side.

What is timed. One *step* is one generation batch (one prompt x G completions) and ``mu`` optimizer
updates on it, the whole of it: generation, scoring, reference/old log-probs, and the update(s).
    ours  ``GRPO.step`` / ``RLOO.step`` (algorithms/), built by the harness exactly as ``grpo-bench run`` builds it.
    TRL   ``mu`` turns of transformers' Trainer inner loop on the trainer: ``training_step`` (which runs TRL's
          ``_prepare_inputs``: generate, score, old/ref log-probs, advantages; then its loss, forward and backward),
          then gradient clipping, ``optimizer.step()``, ``lr_scheduler.step()`` and ``zero_grad()``, as
          ``Trainer.train`` does. ``train()``'s one-off setup (dataloaders, callbacks) is left out, in TRL's favour.
Identical settings on both sides: the same starting weights, G, max new tokens, temperature (plain ancestral
sampling: no top-k/top-p), AdamW (torch's fused kernel: TRL's default, and ours) with the same lr and a constant
schedule, grad clip 1.0, beta, loss_type, epsilon, mu, fp32, the paper's KL term (GRPO: TRL's
``use_bias_correction_kl`` off), and the same reward (``task.score`` of the text before the first EOS). TRL keeps
its own defaults elsewhere; each comparison runs TRL twice (``TRL_SETTINGS``): as it comes (gradient checkpointing
on: TRL's configs default to it) and at its fastest on the device (checkpointing off). The headline ratio is
against the faster of the two.

How. After a warm-up round, rounds alternate ours, TRL default, TRL fastest in one process, each drawing the same
prompt. A ratio is TRL's step time over ours per round (min/median/max). Peak memory is measured honestly per
side: each side runs in its own fresh subprocess (steps enough for two optimizer updates) and reports its
process's peak RSS (VmHWM, which unlike ru_maxrss does not inherit the parent's peak across fork + exec; on CUDA
``max_memory_allocated``); the probe imports only what its side needs. Same loss on the same batch: TRL (default
setting) generates and scores one batch, then both losses are computed on it (TRL's ``compute_loss`` and ours,
from our own log-probs, reference log-probs and advantages), once as sampled and once after one TRL update with
the sampling log-probs as the old ones (so the ratio and KL terms are not trivially 1 and 0).

Headroom. The update's FLOP rate (6 x parameters x token positions each side's forward actually processes:
TRL every prompt + completion row; ours each prompt once plus the completions, the step's ``tokens/processed``)
and generation's tokens/s are put beside this machine's measured 2048x2048 matmul throughput in fp32 and bf16.

What differs between GRPO and RLOO (their settings, their same-batch check, the workloads run by default) is their
entry in ``references.sides.PAIRINGS``; nothing here branches on the algorithm. This module measures and writes the
report's json; the report's markdown, its target verdict and the scaling plot are rendered by ``vs_trl_report`` from
the report dict alone, and written by the study's lifecycle (benchmarks/perf/commands.py: its file, title and README
section).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from benchmarks.harness import measure
from benchmarks.errors import UsageError
from benchmarks.io import atomic_write_json
from benchmarks.perf.vs_trl_report import plot_scaling
from benchmarks.perf.roof import memory_bandwidth
from benchmarks.references.sides import (
    PAIRINGS, SIDES, TRL_SETTINGS, WORKLOADS, Ours, Trl, Workload, default_workloads, rss_bytes, workloads_of,
)
from benchmarks.study import StudySettings, earlier_report, option
from tasks import TASKS


def matmul_gflops(dtype: torch.dtype, n: int = 2048, reps: int = 5, device: str = "cpu", budget_s: float = 0.2) -> float:
    """Best-of-``reps`` throughput of one n x n matmul (2 n^3 FLOPs), in GFLOP/s. The size starts at 256 and doubles
    up to ``n`` while one product takes under ``budget_s``: on a CPU without native bf16 (an AVX2 EPYC) a 2048 bf16
    product is emulated and took minutes, where a smaller one measures the same rate."""
    size = min(256, n)
    while True:
        a = torch.randn(size, size, device=device).to(dtype)
        b = torch.randn(size, size, device=device).to(dtype)
        start = time.perf_counter()
        a @ b
        if a.is_cuda:
            torch.cuda.synchronize()
        if size >= n or time.perf_counter() - start > budget_s:
            break
        size *= 2
    n = size
    best = float("inf")
    for _ in range(reps):
        if a.is_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        a @ b
        if a.is_cuda:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


def _param_count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def _median_phases(rows: list[dict]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def _rates(row: dict, params: int, mu: int) -> dict[str, float]:
    gen = row["time/generate"]
    update = row["time/update"]
    update_flops = 6 * params * row["tokens/processed"] * mu
    return {
        "generation_tokens_per_s": row["tokens/generated"] / gen if gen > 0 else float("nan"),
        "generation_gflops": 2 * params * row["tokens/generated"] / gen / 1e9 if gen > 0 else float("nan"),
        "update_gflops": update_flops / update / 1e9 if update > 0 else float("nan"),
    }


def compare(w: Workload, *, pairs: int, seed: int, device: str, log=print) -> dict:
    """Warm-up round, then ``pairs`` rounds alternating ours, TRL default, TRL fastest on the same prompts;
    then the same-batch loss check (against TRL's defaults). The headline ratio is against the faster TRL."""
    ours = Ours(w, seed=seed, device=device)
    runners = {"ours": ours, **{f"trl_{name}": Trl(w, seed=seed, device=device, task=ours.task, setting=name)
                                for name in TRL_SETTINGS}}
    prompt_rng = random.Random(seed)
    prompts = ours.task.train_prompts()
    rows: dict[str, list[dict]] = {side: [] for side in runners}
    for i in range(pairs + 1):
        chosen = prompt_rng.choices(prompts, k=1)
        step = {side: runner.step(chosen) for side, runner in runners.items()}
        times = ", ".join(f"{side} {m['time/step']:.3f} s" for side, m in step.items())
        if i == 0:
            log(f"  {w.name}: warm-up {times}")
            continue
        for side, m in step.items():
            rows[side].append(m)
        log(f"  {w.name} round {i}/{pairs}: {times}")
    params = _param_count(ours.policy)
    ratios = {}
    for name in TRL_SETTINGS:
        r = [b["time/step"] / a["time/step"] for a, b in zip(rows["ours"], rows[f"trl_{name}"])]
        low, high = median_interval(r, seed=seed)
        ratios[name] = {"min": min(r), "median": statistics.median(r), "max": max(r), "all": r,
                        "median_ci95": [low, high]}
    # The faster TRL setting by the paired estimate (median per-round ratio), robust to a noisy round.
    faster = min(TRL_SETTINGS, key=lambda name: ratios[name]["median"])
    # The same loss on the same batch is a check of the functions, in fp32 (a bf16 run's two sides round apart):
    # at another precision TRL's default trainer is built again in fp32 for it, once the timed trainers are freed (a
    # fourth 135M trainer beside them was killed for memory on a 24 GiB box).
    if w.precision == "fp32":
        checked = runners["trl_default"]
    else:
        runners.clear()
        gc.collect()
        checked = Trl(dataclasses.replace(w, precision="fp32"), seed=seed, device=device, task=ours.task)
    check = PAIRINGS[w.algo].same_batch(checked, prompt_rng.choices(prompts, k=1))
    result = {
        "workload": dataclasses.asdict(w),
        "parameters": params,
        "pairs": pairs,
        "trl_settings": TRL_SETTINGS,
        "ratios": ratios,
        "faster_trl": faster,
        "ratio": ratios[faster],  # the headline: against TRL's faster setting
        "same_batch": check,
    }
    for side in rows:
        med = _median_phases(rows[side])
        result[side] = {"median": med, "rates": _rates(med, params, w.mu), "steps": rows[side]}
    return result


def median_interval(values: list[float], *, seed: int = 0, confidence: float = 0.95) -> tuple[float, float]:
    """Percentile-bootstrap interval of the median of ``values`` (scipy, 10,000 resamples, seeded). With a
    handful of rounds it can only span observed values, and it is wide: with 5 rounds the median is the largest
    value in 6% of resamples, so one wild round reaches a 95% interval; 9 rounds keep it out."""
    import numpy as np
    from scipy.stats import bootstrap

    if len(values) < 2:
        return values[0], values[0]
    result = bootstrap((np.asarray(values),), np.median, confidence_level=confidence, n_resamples=10_000,
                       method="percentile", rng=np.random.default_rng(seed))
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def bf16_speed(w: Workload, *, steps: int, seed: int, device: str) -> dict:
    """Our step in bf16 autocast beside fp32, same prompts, alternating after a warm-up."""
    fp32 = Ours(w, seed=seed, device=device, precision="fp32")
    bf16 = Ours(w, seed=seed, device=device, precision="bf16", task=fp32.task)
    rng = random.Random(seed)
    prompts = fp32.task.train_prompts()
    times = {"fp32": [], "bf16": []}
    for i in range(steps + 1):
        chosen = rng.choices(prompts, k=1)
        a, b = fp32.step(chosen), bf16.step(chosen)
        if i:
            times["fp32"].append(a["time/step"])
            times["bf16"].append(b["time/step"])
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"workload": w.name, "steps": steps, "median_s": med, "speedup": med["fp32"] / med["bf16"], "all": times}


def probe_memory(w: Workload, side: str, *, steps: int, seed: int, device: str) -> dict:
    """Run one side (one of SIDES) alone in a fresh subprocess; its peak RSS (or CUDA peak) is that side's alone."""
    # __spec__.name: this module's dotted name, also where it runs as __main__
    cmd = [sys.executable, "-m", __spec__.name, "probe", side, json.dumps(dataclasses.asdict(w)),
           str(steps), str(seed), device]
    done = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"memory probe {side}/{w.name} failed: {tail[0]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def workload_of_json(text: str) -> Workload:
    """The Workload ``json.dumps(dataclasses.asdict(w))`` wrote (its task options back to (name, value) pairs)."""
    fields = json.loads(text)
    return Workload(**{**fields, "task_options": tuple(tuple(pair) for pair in fields["task_options"])})


def _probe_main(argv: list[str]) -> None:
    side, workload, steps, seed, device = argv
    rss_import = rss_bytes()
    w = workload_of_json(workload)
    dev = measure.resolve_device(device)
    measure.reset_peak_memory(dev)
    runner = (Ours(w, seed=int(seed), device=device) if side == "ours" else
              Trl(w, seed=int(seed), device=device, setting=side.removeprefix("trl_")))
    rss_built = rss_bytes()
    rng = random.Random(int(seed))
    prompts = runner.task.train_prompts()
    for _ in range(int(steps)):
        runner.step(rng.choices(prompts, k=1))
    print(json.dumps({"side": side, "workload": w.name, "steps": int(steps),
                      "peak_bytes": measure.peak_memory_bytes(dev),
                      "kind": measure.peak_memory_kind(dev),
                      "rss_after_imports_bytes": rss_import, "rss_after_build_bytes": rss_built}))


# --------------------------------------------------------------------------------------------
# Scaling: our step as G, completion length and model size grow
# --------------------------------------------------------------------------------------------

SCALING = {
    # task: (base workload, group sizes at the base length, lengths at the base group size)
    "pizza": ("pizza-mu1", (4, 8, 16, 32), (12,)),
    "gsm8k": ("gsm8k-mu1", (2, 4, 8), (32, 64, 128)),
}


def scaling(tasks: list[str], *, steps: int, seed: int, device: str, log=print) -> list[dict]:
    rows = []
    for task_name in tasks:
        if task_name not in SCALING:
            log(f"  scaling: no scaling points for {task_name}; skipped")
            continue
        base_name, groups, lengths = SCALING[task_name]
        base = WORKLOADS[base_name]
        base_len = 64 if task_name == "gsm8k" else base.max_new_tokens
        base_group = 4
        configs = [(g, base_len) for g in groups] + [(base_group, n) for n in lengths if n != base_len]
        task = None
        rng = random.Random(seed)
        for group, length in configs:
            # A fresh step per point, built by the harness like any run (the task, and its model, loaded once).
            ours = Ours(dataclasses.replace(base, group_size=group, max_new_tokens=length), seed=seed, device=device,
                        task=task)
            task = ours.task
            prompts = task.train_prompts()
            ours.step(rng.choices(prompts, k=1))  # warm-up
            times, tokens = [], []
            for _ in range(steps):
                m = ours.step(rng.choices(prompts, k=1))
                times.append(m["time/step"])
                tokens.append(m["tokens/generated"])
            row = {"task": task_name, "parameters": _param_count(ours.policy), "group_size": group,
                   "max_new_tokens": length, "median_s": statistics.median(times),
                   "tokens_generated": statistics.median(tokens)}
            rows.append(row)
            log(f"  scaling {task_name} G={group} len={length}: {row['median_s']:.2f} s/step, "
                f"{row['tokens_generated']:.0f} tokens")
    return rows


# --------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------

MEMORY_METHOD = ("each side alone in a fresh subprocess, run for two optimizer updates (the second with AdamW's "
                 "state allocated), peak resident set size of "
                 "that process (Linux VmHWM; CUDA: max_memory_allocated); the probe imports only its side's "
                 "libraries.")


@dataclass
class PerfSettings(StudySettings):
    """What ``grpo-bench bench grpo-vs-trl`` / ``rloo-vs-trl`` runs; each command's settings are a subclass
    (``GrpoVsTrlSettings``, ``RlooVsTrlSettings``) with its ``algo`` and its own defaults."""

    algo: str = "grpo"  # a PAIRINGS entry with a TRL side: "grpo" (TRL's GRPOTrainer) or "rloo" (RLOOTrainer)
    workloads: Optional[list[str]] = None  # names from WORKLOADS of ``algo`` (None: default_workloads(algo))
    pairs: int = field(default=5, metadata={
        "help": "timed rounds (ours, TRL default, TRL fastest) per workload after one warm-up round (>= 5)"})
    allow_few_pairs: bool = field(default=False, metadata={
        "help": "accept --pairs < 5 (quick tests); min/median/max then say little", "hidden": True})
    memory: bool = field(default=True, metadata={
        "help": "measure each side's peak memory in its own subprocess (two optimizer updates)"})
    max_new_tokens: Optional[int] = field(default=None, metadata={
        "help": "override every workload's completion cap, for quick runs (default: the workload's)"})
    seed: int = option("seed")
    device: str = option("device")
    precision: str = field(default="fp32", metadata={
        "help": "both sides' training precision: fp32, or bf16 (ours --precision bf16; TRL bf16=True); the same-batch "
                "loss check stays fp32", "choices": ("fp32", "bf16")})
    out: Optional[str] = option("out", None, shown="results/perf, or results/gpu on CUDA; at bf16 their bf16/ folder")
    bf16_steps: int = 0  # GRPO only: timed steps of our bf16-autocast step (0: none)
    scaling_steps: int = 0  # GRPO only: timed steps of our step per scaling point, after one warm-up (0: none)
    # section perf or perf-rloo (perf-bf16 at bf16): the default folder's report's; another --out writes none unasked
    readme: Optional[str] = option("readme", shown="results/checks.md with the default --out, none with another")
    model: Optional[str] = field(default=None, metadata={
        "help": "hub id or local directory in place of the workloads' model, in the tasks that take one "
                "(default: the workloads')"})
    random_weights: bool = field(default=False, metadata={
        "help": "--model's architecture and tokenizer with seeded random weights (timing where its weights cannot "
                "go; completions then seldom end before their cap)"})
    rerender: bool = option("rerender")  # re-read OUT's finished report (STEM.json)
    resume: bool = option("resume", one_of="again")
    overwrite: bool = option("overwrite", one_of="again")


def _workloads(algo: str) -> dataclasses.Field:
    """The ``workloads`` setting of ``algo``'s command: all of its workloads by default (RLOO: its first)."""
    return field(default_factory=lambda: default_workloads(algo), metadata={
        "help": f"comma-separated, from: {', '.join(workloads_of(algo))}", "comma_separated": True})


@dataclass
class GrpoVsTrlSettings(PerfSettings):
    """``bench grpo-vs-trl``'s settings: GRPO against TRL's GRPOTrainer, with its bf16 and scaling parts."""

    algo: str = field(default="grpo", init=False)
    workloads: list[str] = _workloads("grpo")
    bf16_steps: int = field(default=2, metadata={"help": "timed steps of our bf16-autocast step (0: skip)"})
    scaling_steps: int = field(default=1, metadata={"help": "timed steps per scaling point, after one warm-up (0: skip)"})


@dataclass
class RlooVsTrlSettings(PerfSettings):
    """``bench rloo-vs-trl``'s settings: RLOO against TRL's RLOOTrainer; its report has neither part of GRPO's."""

    algo: str = field(default="rloo", init=False)
    workloads: list[str] = _workloads("rloo")
    bf16_steps: int = field(default=0, init=False)
    scaling_steps: int = field(default=0, init=False)


def random_weight_checkpoint(model: str, seed: int) -> Path:
    """A checkpoint of ``model``'s architecture and tokenizer with weights drawn at random (transformers' own
    initialisation, seeded), written once under $TMPDIR and reused. For timing on a machine the weights cannot
    reach: every product, cache and update is the same size, but the text differs, so completions seldom end
    before their cap (each side's report shows the tokens it generated)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        config = AutoConfig.from_pretrained(model)
        tokenizer = AutoTokenizer.from_pretrained(model)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--model {model!r}: no config and tokenizer there ({str(exc).strip().splitlines()[0]})")
    name = f"{config.model_type}-{config.num_hidden_layers}x{config.hidden_size}-{config.vocab_size}-seed{seed}"
    target = Path(os.environ.get("TMPDIR", "/tmp")) / "grpo-bench-random-weights" / name
    if not (target / "config.json").is_file():
        torch.manual_seed(seed)
        built = AutoModelForCausalLM.from_config(config)
        staging = target.with_name(target.name + ".partial")
        built.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        staging.rename(target)  # whole or absent: a killed run leaves only the staging folder
    return target


def with_model(workloads: list[Workload], model: str) -> list[Workload]:
    """``workloads`` with ``model`` as their task's model; a UsageError if none of their tasks takes one."""
    takes = [w for w in workloads if "model" in TASKS[w.task].options()]
    if not takes:
        raise UsageError(f"--model: none of the workloads ({', '.join(w.name for w in workloads)}) has a task "
                         f"that takes a model")
    return [dataclasses.replace(w, task_options=(*w.task_options, ("model", model))) if w in takes else w
            for w in workloads]


def _sample_machine(load: dict) -> None:
    """Append the 1-minute load average, and the memory bandwidth where ``load`` tracks it, to ``load``'s samples."""
    load["load_1min"].append(os.getloadavg()[0])
    if "bandwidth_gbs" in load:
        load["bandwidth_gbs"].append(memory_bandwidth(256, 5) / 1e9)


def out_folder(settings: PerfSettings) -> Path:
    """--out, else results/gpu on CUDA (asked for, or auto where it is present) and results/perf on the CPU; a
    precision other than fp32 in its own folder below that (results/perf/bf16), beside the fp32 report."""
    if settings.out:
        return Path(settings.out)
    on_cuda = settings.device.startswith("cuda") or (settings.device == "auto" and torch.cuda.is_available())
    folder = Path("results/gpu" if on_cuda else "results/perf")
    return folder if settings.precision == "fp32" else folder / settings.precision


def run_bench(settings: PerfSettings, command: str, path: Path, write: Callable[[dict, bool], None]) -> dict:
    """Every workload's comparison (plus bf16 and scaling when their steps are > 0), written to ``path`` (the
    report's json, OUT/STEM.json: what --resume continues; STEM.md and scaling.png go beside it) as each part is
    measured; ``command`` is the command line that reproduces them. ``write(report, readme)`` writes the report
    rendered from it: after each workload without its README section, at the end with it (``readme``)."""
    choices = workloads_of(settings.algo)
    names, device = _checked(settings, choices)
    out = path.parent
    earlier = _resumed(path, settings, device)
    out.mkdir(parents=True, exist_ok=True)
    log = print
    started = time.perf_counter()
    report = _new_report(command, settings, device, names, earlier)
    _sample_machine(report["load"])
    log(f"matmul 2048: {report['matmul_gflops']['fp32']:.0f} GFLOP/s fp32, {report['matmul_gflops']['bf16']:.0f} bf16")
    workloads = _planned(settings, choices, names, report)
    measured = {r["workload"]["name"]: r for r in report["comparisons"]}
    for w in workloads:
        if w.name in measured:
            _check_kept(w, measured[w.name], settings, path)
            log(f"{w.name}: measured in the report being resumed, kept")
            continue
        _measure(w, report, settings, str(device), path, write, log)
    if settings.bf16_steps > 0:
        report["bf16"] = [bf16_speed(w, steps=settings.bf16_steps, seed=settings.seed, device=str(device))
                          for w in workloads if w.mu == 1]
    if settings.scaling_steps > 0:
        tasks = sorted({choices[n].task for n in names})
        report["scaling"] = scaling(tasks, steps=settings.scaling_steps, seed=settings.seed, device=str(device), log=log)
        plot_scaling(report["scaling"], out / "scaling.png")
    report["wall_clock_s"] = time.perf_counter() - started
    atomic_write_json(path, report)
    write(report, True)
    log(f"wrote {out}/{path.stem}.md, {path.name}" + (", scaling.png" if report.get("scaling") else "")
        + f" in {report['wall_clock_s']:.0f} s")
    return report


def _checked(settings: PerfSettings, choices: dict[str, Workload]) -> tuple[list[str], torch.device]:
    """The workloads' names and the device, once the flags are known to make sense (a UsageError if not)."""
    names = default_workloads(settings.algo) if settings.workloads is None else settings.workloads
    unknown = [n for n in names if n not in choices]
    if unknown:
        raise UsageError(f"unknown workload {unknown[0]!r}; choose from {', '.join(choices)}")
    if settings.pairs < 5 and not settings.allow_few_pairs:
        raise UsageError(f"--pairs must be >= 5 for a min/median/max ratio, got {settings.pairs}")
    if settings.pairs < 1:
        raise UsageError(f"--pairs must be >= 1, got {settings.pairs}")
    device = measure.requested_device(settings.device)
    if settings.max_new_tokens is not None and settings.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be >= 1, got {settings.max_new_tokens}")
    if settings.random_weights and not settings.model:
        raise UsageError("--random-weights needs --model (the architecture and tokenizer to draw weights for)")
    return names, device


def _new_report(command: str, settings: PerfSettings, device: torch.device, names: list[str],
                earlier: Optional[dict]) -> dict:
    """The report this session fills: a new one headed by this machine, or with --resume the earlier one, this
    session listed under ``resumed`` (the machine's matmul rate is measured either way)."""
    report = {
        "command": command,
        "algo": settings.algo,
        "environment": measure.environment(device),
        "threads": torch.get_num_threads(),
        "trl_settings": TRL_SETTINGS,
        "memory_method": MEMORY_METHOD,
        "matmul_gflops": {"fp32": matmul_gflops(torch.float32, device=device.type),
                          "bf16": matmul_gflops(torch.bfloat16, device=device.type)},
        "workloads": names,  # planned: a report with fewer comparisons is from a run stopped before the end
        "comparisons": [],
        # Other work on the machine, sampled at the start and after each workload: a reader of the absolute times
        # needs it; the ratios are side by side in interleaved rounds either way.
        # On a CPU also what neighbours on a shared host leave of the memory bandwidth, which the load average does
        # not see (the same workloads' ratios moved by about a tenth between runs on these machines).
        "load": {"cpus": os.cpu_count(), "load_1min": [], **({"bandwidth_gbs": []} if device.type == "cpu" else {})},
        "seed": settings.seed,
        "precision": settings.precision,
    }
    if not earlier:
        return report
    # The report stays the first session's (its machine and code head it); each later one is listed with what it measured.
    return {**earlier, "workloads": list(dict.fromkeys(earlier["workloads"] + names)),
            "resumed": earlier.get("resumed", []) + [{"command": command, "environment": report["environment"],
                                                      "threads": report["threads"], "workloads": []}]}


def _planned(settings: PerfSettings, choices: dict[str, Workload], names: list[str], report: dict) -> list[Workload]:
    """The named workloads with --max-new-tokens and --model applied (--model is recorded in ``report``)."""
    workloads = [dataclasses.replace(choices[n], max_new_tokens=settings.max_new_tokens or choices[n].max_new_tokens,
                                     precision=settings.precision) for n in names]
    if settings.model:
        model = str(random_weight_checkpoint(settings.model, settings.seed)) if settings.random_weights else settings.model
        workloads = with_model(workloads, model)
        report["model"] = {"model": settings.model, "random_weights": settings.random_weights}
    return workloads


def _check_kept(w: Workload, measured: dict, settings: PerfSettings, path: Path) -> None:
    """A workload the resumed report measured is kept only if it was measured with these settings."""
    stored = {"precision": "fp32", **measured["workload"]}  # reports from before the precision setting: fp32
    if _as_json(dataclasses.asdict(w)) != stored or measured["pairs"] != settings.pairs:
        raise UsageError(f"--resume: {w.name} in {path} was measured with other settings "
                         "(workload or --pairs); --overwrite to measure everything again")


def _measure(w: Workload, report: dict, settings: PerfSettings, device: str, path: Path, write, log) -> None:
    """One workload's comparison (and each side's peak memory) added to ``report``, which is written at once (to
    ``path``, and its report by ``write``)."""
    result = compare(w, pairs=settings.pairs, seed=settings.seed, device=device, log=log)
    if report.get("resumed"):
        report["resumed"][-1]["workloads"].append(w.name)
    if settings.memory:
        # Enough steps for two optimizer updates: the second runs with AdamW's state already allocated.
        steps = -(-2 // w.mu)
        result["memory"] = {side: probe_memory(w, side, steps=steps, seed=settings.seed, device=device)
                            for side in SIDES}
    report["comparisons"].append(result)
    _sample_machine(report["load"])
    # What is finished is on disk: a 135M comparison is tens of minutes, and a later part may fail.
    atomic_write_json(path, report)
    write(report, False)  # the README section at the end
    log(f"{w.name}: TRL/ours median {result['ratios']['default']['median']:.2f} (TRL default), "
        f"{result['ratios']['fastest']['median']:.2f} (TRL fastest); against the faster "
        f"({result['faster_trl']}): min {result['ratio']['min']:.2f}, max {result['ratio']['max']:.2f}; "
        f"same-batch loss diff {result['same_batch']['max_abs_diff']:.1e}")


def _as_json(value):
    return json.loads(json.dumps(value))


def _resumed(path: Path, settings: PerfSettings, device: torch.device) -> Optional[dict]:
    """The report at ``path`` that --resume continues (None when there is none, or with --overwrite), refused when
    it is no report of this bench or was measured with other settings than these."""
    earlier = earlier_report(settings, path, "the workloads")
    if earlier is None:
        return None
    if not (isinstance(earlier, dict) and isinstance(earlier.get("comparisons"), list)
            and isinstance(earlier.get("workloads"), list)):
        raise UsageError(f"--resume: {path} is not a report of this bench (no comparisons and workloads)")
    if earlier.get("algo", "grpo") != settings.algo or earlier.get("seed", settings.seed) != settings.seed:
        raise UsageError(f"--resume: {path} was measured with another algorithm or --seed; --overwrite to replace it")
    measured_on = str(earlier.get("environment", {}).get("device", "")).split(":")[0]
    if measured_on != device.type:
        raise UsageError(f"--resume: {path} was measured on {measured_on or 'an unknown device'}, this run is on "
                         f"{device.type}; --out another folder")
    model = {"model": settings.model, "random_weights": settings.random_weights} if settings.model else None
    if earlier.get("model") != model:
        raise UsageError(f"--resume: {path} was measured with another --model / --random-weights; --overwrite to "
                         "replace it")
    return earlier


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "probe":
        _probe_main(sys.argv[2:])
