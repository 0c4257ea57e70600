"""``grpo-bench check precision``: does one training step's gradient at bf16 point where fp32's does?

A bf16 cell is cheaper only if it learns what an fp32 cell learns (issue 43). The learning A/B
(benchmarks/matrices/rg_precision.toml) answers that over whole runs; this check answers it for one step, per
algorithm, on the same batch: each variant of a matrix (default: the real-LM verdict matrix's, at its first grid
point) is built at fp32, takes one warm-up step up to its first policy update (DPO builds its preference pairs there),
then runs each batch's step to its first policy update, keeping its state before the batch, the completions it
sampled and the gradient; then it is built at bf16 and at bf16 with fp32 logits in turn (one model in memory at a
time), each replaying every batch from the state fp32 had before it. The policy's gradient of that update is taken,
never applied. Everything the step computes before the update (reference and old
log-probs, PPO's values) runs at the precision measured, as a cell at that precision would.

Against fp32's gradient g: the cosine and ||g_p - g|| / ||g|| of each lower precision's. What a cosine means is read
against the gradient's own batch-to-batch noise: the cosine between fp32's gradients on two different batches of the
same policy, in the same table."""

from __future__ import annotations

import dataclasses
import gc
import math
from pathlib import Path
from typing import Callable, Optional

import torch

from benchmarks.harness import build, resolve
from benchmarks.harness.measure import TRAINING_PRECISIONS, environment
from benchmarks.io import atomic_write_text
from benchmarks.markdown import markdown_table
from benchmarks.matrix.plan import variant_settings
from benchmarks.study import MatrixVariantsSettings, at_least, measure_parts, option


@dataclasses.dataclass
class PrecisionSettings(MatrixVariantsSettings):
    batches: int = dataclasses.field(default=2, metadata={"help": "sampled batches per variant"})
    seed: int = option("seed")
    out: str = option("out", "results/precision")  # gradients.md, gradients.json
    resume: bool = option("resume")  # the variants OUT's gradients.json measured with the same settings


class _Captured(Exception):
    """Raised from inside the step at its first policy update, carrying the policy's gradient (flat, fp32)."""

    def __init__(self, gradient: torch.Tensor):
        super().__init__()
        self.gradient = gradient


def _capture_first_policy_update(algo) -> None:
    """``algo.update`` of the policy's optimizer backpropagates, then raises ``_Captured`` instead of stepping;
    another optimizer's update (PPO's critic) runs as usual."""
    original = algo.update

    def update(loss, optimizer=None, params=None):
        if optimizer is not None and optimizer is not algo.optimizer:
            return original(loss, optimizer, params)
        algo.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        params = [p for group in algo.optimizer.param_groups for p in group["params"]]
        gradient = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().float().flatten()
                              for p in params])
        algo.optimizer.zero_grad(set_to_none=True)
        raise _Captured(gradient)

    algo.update = update


def _replaying_generate(algo, recorded: list, replay: bool) -> Callable[[], None]:
    """``algo.generate`` records what it returns, with its generator's state after sampling, into ``recorded`` (or,
    with ``replay``, returns them again in order and leaves its generator where the recorded sampling left it, so the
    draws after it, PPO's minibatch order say, are the same); returns a function that restores the algorithm's own."""
    original = algo.generate
    position = [0]

    def generate(prompts, group_size):
        if replay:
            out, state = recorded[position[0]]
            position[0] += 1
            algo.generator.set_state(state)
            return out
        out = original(prompts, group_size)
        recorded.append((out, algo.generator.get_state()))
        return out

    algo.generate = generate
    return lambda: setattr(algo, "generate", original)


def _step_to_first_update(algo, prompts: list[str]) -> Optional[torch.Tensor]:
    """The gradient of the step's first policy update; None when the batch carried no signal (no update was made)."""
    try:
        algo.step(prompts)
    except _Captured as captured:
        return captured.gradient
    return None


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.dot(a.double(), b.double()) / (a.double().norm() * b.double().norm()))


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _built(options: dict, precision: str, logits_precision: str):
    """(task, algorithm) of ``options`` at one precision, its first policy update captured."""
    rc, config, task_options = resolve({**options, "precision": precision, "logits_precision": logits_precision})
    task, _, algo, _ = build(rc, config, task_options)
    _capture_first_policy_update(algo)
    return task, algo


def _row(batch, label: str, ours: torch.Tensor, theirs: torch.Tensor) -> dict:
    return {"batch": batch, "precision": label, "cosine": _cosine(ours, theirs), "relative_error": _relative(ours, theirs),
            "norm_ratio": float(ours.double().norm() / theirs.double().norm()), "fp32_norm": float(theirs.double().norm())}


def measure_variant(settings: dict, *, batches: int, seed: int,
                    progress: Callable[[str], None] = print) -> list[dict]:
    """Rows of one variant: per batch and lower precision, cosine and relative error against fp32's gradient, and per
    pair of fp32 batches the cosine between their gradients. One precision's algorithm is alive at a time (a real
    LM's policy, reference and PPO's critic three times over did not fit beside a matrix): fp32's runs every batch
    first, keeping its state before each batch, the completions it sampled and its gradient; then each lower
    precision's replays them from those states."""
    options = {**settings, "seed": seed, "out": "/dev/null", "device": "cpu"}
    (reference_label, precision, logits), *lower = TRAINING_PRECISIONS
    task, reference = _built(options, precision, logits)
    # As at a cell's first step: the budget caps what the step may sample (DPO with count_pair_samples builds its
    # pairs from at most the budget's samples; every other variant's first step is far below it).
    reference.completions_allowed = settings.get("budget")
    per_step, pool = reference.config.prompts_per_step, task.train_prompts()
    prompts_of = lambda k: [pool[(k * per_step + i) % len(pool)] for i in range(per_step)]
    _step_to_first_update(reference, prompts_of(0))  # the warm-up: DPO's pairs, the generator past its first draw
    seen = []  # (prompts, the state before the batch, its recorded sampling, fp32's gradient)
    k = 1
    while len(seen) < batches and k <= 4 * batches:
        prompts, recorded, state = prompts_of(k), [], reference.state_dict()
        k += 1
        restore = _replaying_generate(reference, recorded, replay=False)
        gradient = _step_to_first_update(reference, prompts)
        restore()
        if gradient is not None:  # None: no signal in this batch, no update to compare
            seen.append((prompts, state, recorded, gradient))
    del reference
    gc.collect()
    rows = []
    for label, precision, logits in lower:
        _, other = _built(options, precision, logits)
        for batch, (prompts, state, recorded, gradient) in enumerate(seen, 1):
            other.load_state_dict(state)
            restore = _replaying_generate(other, recorded, replay=True)
            ours = _step_to_first_update(other, prompts)
            restore()
            if ours is None:
                raise RuntimeError(f"{label} took no update on the batch {reference_label} updated on")
            rows.append(_row(batch, label, ours, gradient))
            progress(f"  batch {batch} {label}: cosine {rows[-1]['cosine']:.5f}, "
                     f"relative error {rows[-1]['relative_error']:.4f}")
        del other
        gc.collect()
    gradients = [g for *_, g in seen]
    rows += [_row(f"{i + 1} vs {j + 1}", "fp32, another batch", gradients[j], gradients[i])
             for i in range(len(gradients)) for j in range(i + 1, len(gradients))]
    return rows


def _lowest_cosines(results: dict) -> tuple[dict[str, float], list[float]]:
    """Per lower precision its lowest cosine with fp32 over every variant and batch; and the fp32 batch-to-batch cosines."""
    worst: dict[str, float] = {}
    noise = []
    for rows in results["variants"].values():
        for r in rows:
            if r["precision"] == "fp32, another batch":
                noise.append(r["cosine"])
            else:
                worst[r["precision"]] = min(worst.get(r["precision"], 1.0), r["cosine"])
    return worst, noise


def headline(results: dict) -> str:
    worst, noise = _lowest_cosines(results)
    return (f"**{len(results['variants'])} variants, the same batch at each precision: the lowest cosine of a lower "
            f"precision's gradient with fp32's is " + ", ".join(f"{value:.4f} ({label})" for label, value in worst.items())
            + (f"; fp32's own gradients on two different batches: {min(noise):.3f} to {max(noise):.3f}.**" if noise else ".**"))


def render(results: dict) -> str:
    lines = [f"# One step's gradient at bf16 against fp32 (`{results['command']}`)", "", headline(results), "",
             f"Matrix `{results['matrix']}`, task `{results['task']}`, seed {results['seed']}; "
             f"{results['environment']['device_name']}, torch "
             f"{results['environment']['versions'].get('torch', '?')}. Each variant's first policy update of a step, at "
             "each precision on the same sampled batch (the fp32 one's completions replayed), its gradient taken "
             "and not applied. The last rows of each variant compare fp32's gradients on two different batches: the "
             "batch-to-batch noise a lower precision's error is read against.", ""]
    table = []
    for variant, rows in results["variants"].items():
        for r in rows:
            table.append([variant, r["batch"], r["precision"], f"{r['cosine']:.5f}", f"{r['relative_error']:.4f}",
                          f"{r['norm_ratio']:.4f}", f"{r['fp32_norm']:.4g}"])
    lines.append(markdown_table(["variant", "batch", "against fp32", "cosine", "relative error", "norm ratio",
                                 "fp32 gradient norm"], table))
    return "\n".join(lines) + "\n"


def run_precision_check(settings: PrecisionSettings, *, command: str = "grpo-bench check precision") -> int:
    at_least(batches=(settings.batches, 1))
    task, variants = variant_settings(settings.matrix, settings.task, settings.variants)
    same = {"matrix": settings.matrix, "task": task, "seed": settings.seed, "batches": settings.batches,
            "precisions": [list(p) for p in TRAINING_PRECISIONS]}
    out = Path(settings.out)
    header = {"command": command, **same, "environment": environment(torch.device("cpu"))}
    results = measure_parts(settings, out / "gradients.json", same, header, variants,
                            log=lambda line: print(line, flush=True),
                            measure=lambda options: measure_variant(options, batches=settings.batches, seed=settings.seed))
    atomic_write_text(out / "gradients.md", render(results))
    print(f"-> {out / 'gradients.md'}")
    bad = [v for v, rows in results["variants"].items() for r in rows
           if r["precision"] != "fp32, another batch" and not math.isfinite(r["cosine"])]
    return 1 if bad else 0
