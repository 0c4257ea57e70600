"""``grpo-bench check same-batch``: the GRPO step's loss against TRL's on the same sampled batches, part by part.

For each workload of ``grpo-bench bench grpo-vs-trl`` (the same model, task and settings) a TRL GRPOTrainer at its
defaults samples and scores a few batches, and ``references.sides.same_batch_check`` computes both losses on each, as
sampled and after one TRL update. It splits the end-to-end difference into its sources: the loss function (ours on
TRL's own log-prob tensors), the advantages, and the forward (our packed rows against TRL's padded ones); and it
measures, for scale, how far transformers moves when the same rows run alone, unpadded. The bench runs one such
batch per workload after its timed rounds; this check runs several on a fresh trainer, without the timing.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from benchmarks.errors import UsageError
from benchmarks.harness import measure
from benchmarks.io import atomic_write_json, atomic_write_text
from benchmarks.markdown import markdown_table
from benchmarks.references.sides import (
    SAME_BATCH_COLUMNS, SAME_LOGPS_ATOL, SAME_LOSS_ATOL, Trl, same_batch_check, same_loss_misses, workloads_of,
)
from benchmarks.study import StudySettings, at_least, option


@dataclass
class SameBatchSettings(StudySettings):
    workloads: list[str] = field(default_factory=lambda: list(workloads_of("grpo")), metadata={
        "help": "comma-separated workloads of bench grpo-vs-trl (default: all of them)", "comma_separated": True})
    batches: int = field(default=3, metadata={"help": "sampled batches per workload"})
    seed: int = option("seed")
    out: str = option("out", "results/same_batch")  # report.md, results.json


def run_same_batch_check(settings: SameBatchSettings, command: str, log=print) -> dict:
    choices = workloads_of("grpo")
    unknown = [name for name in settings.workloads if name not in choices]
    if unknown:
        raise UsageError(f"unknown workload {unknown[0]!r}; choose from {', '.join(choices)}")
    at_least(batches=(settings.batches, 1))
    out = Path(settings.out)
    rows = []
    for name in settings.workloads:
        w = choices[name]
        trl = Trl(w, seed=settings.seed, device="cpu")
        rng = random.Random(settings.seed)
        prompts = trl.task.train_prompts()
        for batch in range(settings.batches):
            check = same_batch_check(trl, rng.choices(prompts, k=1))
            rows.append({"workload": name, "batch": batch, **check, "misses": same_loss_misses(check)})
            log(f"{name} batch {batch + 1}/{settings.batches}: end to end {check['max_abs_diff']:.1e}, loss function "
                f"{check['abs_diff_formula']:.1e}, log-probs {check['max_abs_diff_logps']:.1e} (transformers alone "
                f"{check['abs_diff_layout']:.1e}, {check['max_abs_diff_layout_logps']:.1e})")
    report = {"command": command, "settings": vars(settings), "environment": measure.environment(measure.resolve_device("cpu")),
              "loss_atol": SAME_LOSS_ATOL, "logps_atol": SAME_LOGPS_ATOL, "rows": rows}
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "results.json", report)
    atomic_write_text(out / "report.md", render(report))
    log(f"wrote {out}/report.md, results.json")
    return report


def headline(report: dict) -> str:
    rows = report["rows"]
    held = sum(not r["misses"] for r in rows)

    def spread(key: str) -> str:
        values = [r[key] for r in rows if key in r]
        return f"{min(values):.1e} to {max(values):.1e}"

    return (f"**{held} of {len(rows)} batches hold the bar** (loss function within {report['loss_atol']:.0e} on TRL's own "
            f"log-probs, advantages within {report['loss_atol']:.0e}, log-probs within {report['logps_atol']:.0e} of TRL's). "
            f"End-to-end loss differences {spread('max_abs_diff')}; transformers against itself, each row alone: "
            f"{spread('abs_diff_layout')}.")


def render(report: dict, title: Optional[str] = "The GRPO loss against TRL's on the same batches, part by part") -> str:
    rows = report["rows"]
    table = [[r["workload"], r["batch"] + 1, r["advantages"].split(" (")[0],
              *(f"{r[key]:.1e}" if key in r else "-" for key, _ in SAME_BATCH_COLUMNS), "; ".join(r["misses"]) or "holds"]
             for r in rows]
    env = report["environment"]
    return "\n".join([
        f"# {title}", "", headline(report), "",
        f"TRL {env['versions'].get('trl')} `GRPOTrainer` (its defaults) samples and scores each batch; both losses are "
        "computed on it as sampled and after one TRL update (the largest of the two stages is shown). fp32 on "
        f"{env['device_name']}, torch {env['versions']['torch']}, transformers {env['versions'].get('transformers')}.",
        "",
        "- **loss, end to end**: our loss from our own log-probs, reference log-probs and advantages, against TRL's "
        "`compute_loss` (and the advantages' difference, if larger).",
        "- **loss function**: our GRPO loss (`GRPOConfig.loss()`) on TRL's own log-prob tensors against TRL's loss: "
        "the formula alone.",
        "- **log-probs**, **reference log-probs**: ours (packed rows: each prompt once with its completions) against "
        "TRL's (padded rows), the largest over the batch's tokens: the forward's rounding.",
        "- **transformers alone**: for scale, TRL's loss and log-probs with each row run by itself, unpadded, against "
        "its padded batch: how far a change of layout alone moves transformers' own numbers.",
        "",
        markdown_table(["workload", "batch", "advantages from", *(label for _, label in SAME_BATCH_COLUMNS), "bar"], table),
        "", f"Regenerate: `{report['command']}`", ""])
