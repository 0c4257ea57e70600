"""The seed notebook's group-size ablation: GRPO on the toy bandit with G = 2, 4, 8, 16.

Every (G, seed) cell is an ordinary harness run (its own run directory under OUT/runs) with the
bandit's exact evaluation every ``--eval-every`` steps, so each curve point is the policy's exact
expected true reward and accuracy, not a sample. The prompts per step stay fixed, so a larger G
also means more completions per step, as in the notebook; the table reports completions per step.

    grpo-bench ablation --out results/ablation

writes OUT/curves.csv (step, G, seed, metrics), OUT/group_size.md (mean over seeds at equal completions,
then at a few steps)
and OUT/group_size.png (mean curves with min-max bands over seeds, against steps and against generated
completions, so G is compared both at equal steps and at equal samples).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from benchmarks.errors import UsageError
from benchmarks.harness import resolve, run
from benchmarks.io import atomic_write_text, read_jsonl, save_figure
from tasks import make_task

METRICS = ("true_reward", "accuracy", "rm_reward")


def run_cell(out: Path, group_size: int, seed: int, steps: int, eval_every: int, reward_mode: str, device: str) -> pd.DataFrame:
    rc, config, task_options = resolve({"task": "bandit", "algo": "grpo", "steps": steps, "seed": seed, "device": device,
                                        "out": str(out), "eval_every": eval_every, "checkpoint_every": 0,
                                        "group_size": group_size, "reward_mode": reward_mode})
    summary = run(rc, config, task_options, progress=False)
    points = [{"step": 0, **{m: summary[f"{m}_before"] for m in METRICS}}]
    points += [{"step": r["step"], **{m: r[f"eval/{m}"] for m in METRICS}} for r in read_jsonl(out / "metrics.jsonl") if f"eval/{METRICS[0]}" in r]
    points.append({"step": steps, **{m: summary[f"{m}_after"] for m in METRICS}})
    frame = pd.DataFrame(points)
    frame["G"], frame["seed"] = group_size, seed
    frame["completions_per_step"] = summary["config"]["completions_per_step"]
    frame["wall_clock_s"] = summary["wall_clock_s"]
    return frame


def table(curves: pd.DataFrame, steps: list[int]) -> str:
    """Markdown: mean true reward / accuracy over seeds at the given steps, one row per G."""
    mean = curves.groupby(["G", "step"])[list(METRICS)].mean()
    lines = ["| G | completions/step | " + " | ".join(f"true reward @ {s}" for s in steps) + " | accuracy @ "
             + f"{steps[-1]} | seeds |", "|" + "---|" * (len(steps) + 4)]
    for g, group in curves.groupby("G"):
        cells = [f"{mean.loc[(g, s), 'true_reward']:.3f}" for s in steps]
        lines.append(f"| {g} | {int(group['completions_per_step'].iloc[0])} | " + " | ".join(cells)
                     + f" | {mean.loc[(g, steps[-1]), 'accuracy']:.3f} | {group['seed'].nunique()} |")
    return "\n".join(lines) + "\n"


def at_completions(curves: pd.DataFrame, points: list[float]) -> pd.DataFrame:
    """Each (G, seed) curve read at the given completion counts (linear between its evaluations), then the
    mean over seeds: rows G, columns (metric, completions)."""
    import numpy as np

    rows = []
    for (g, seed), group in curves.groupby(["G", "seed"]):
        group = group.sort_values("step")
        x = (group["step"] * group["completions_per_step"]).to_numpy(float)
        rows += [{"G": g, "seed": seed, "completions": c, **{m: float(np.interp(c, x, group[m])) for m in METRICS}}
                 for c in points]
    return pd.DataFrame(rows).groupby(["G", "completions"])[list(METRICS)].mean()


def equal_completions_table(curves: pd.DataFrame) -> tuple[str, str]:
    """Markdown at equal samples: mean true reward over seeds at 1/4, 1/2 and all of the completions the
    smallest G generated (every G reached them), and the headline at the last of them."""
    budget = float((curves["step"] * curves["completions_per_step"]).groupby(curves["G"]).max().min())
    points = [0.0, budget / 4, budget / 2, budget]
    mean = at_completions(curves, points)
    lines = ["| G | " + " | ".join(f"true reward @ {c:.0f} completions" for c in points)
             + f" | accuracy @ {budget:.0f} |", "|" + "---|" * (len(points) + 2)]
    for g in sorted(curves["G"].unique()):
        lines.append(f"| {g} | " + " | ".join(f"{mean.loc[(g, c), 'true_reward']:.3f}" for c in points)
                     + f" | {mean.loc[(g, budget), 'accuracy']:.3f} |")
    headline = (f"**At equal completions ({budget:.0f} each), true reward by group size: "
                + ", ".join(f"G = {g} {mean.loc[(g, budget), 'true_reward']:.3f}" for g in sorted(curves["G"].unique()))
                + "; at equal steps the larger groups spend more samples (table below).**")
    return "\n".join(lines) + "\n", headline


def plot(curves: pd.DataFrame, optimum: float, rm_optimum: float, path: Path) -> None:
    """Top row: true reward and accuracy against steps (equal steps: G = 16 spends 8x the samples of G = 2);
    bottom row: the same against generated completions (equal samples)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = curves.assign(completions=curves["step"] * curves["completions_per_step"])
    fig, axes = plt.subplots(2, 2, figsize=(10, 7.5))
    for row, x in zip(axes, ("step", "completions")):
        for ax, metric in zip(row, ("true_reward", "accuracy")):
            for g, group in curves.groupby("G"):
                stats = group.groupby(x)[metric].agg(["mean", "min", "max"])
                ax.plot(stats.index, stats["mean"], label=f"G = {g}")
                ax.fill_between(stats.index, stats["min"], stats["max"], alpha=0.2)
            if metric == "true_reward":
                ax.axhline(optimum, color="grey", linestyle="--", linewidth=1, label="optimal policy")
                ax.axhline(rm_optimum, color="grey", linestyle=":", linewidth=1, label="the RM's best actions")
            ax.set_xlabel("step (equal steps)" if x == "step" else "generated completions (equal samples)")
            ax.set_ylabel(metric.replace("_", " "))
        if x == "completions":  # the smallest G's last point: every G compared up to the samples all of them spent
            ax_limit = curves.groupby("G")["completions"].max().min()
            for ax in row:
                ax.set_xlim(0, ax_limit)
    axes[0][0].legend()
    fig.suptitle("GRPO on the toy bandit: group size G (mean over seeds, band = min..max)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def run_ablation(settings, command: str) -> int:
    """Every (G, seed) run of the grid ``settings`` names (``grpo-bench ablation``'s, benchmarks/studies.py: every G
    in ``group_sizes`` with every seed in ``seeds``), then OUT/curves.csv, group_size.md and group_size.png;
    group_size.md quotes ``command``, the command line that reproduces them."""
    if any(g < 2 for g in settings.group_sizes):
        raise UsageError(f"--group-sizes must all be >= 2 (group-relative advantages), got {settings.group_sizes}")
    if settings.steps < 1 or settings.eval_every < 1:
        raise UsageError("--steps and --eval-every must be >= 1")
    out = Path(settings.out)
    frames = []
    for g in settings.group_sizes:
        for seed in settings.seeds:
            frame = run_cell(out / "runs" / f"G{g}-seed{seed}", g, seed, settings.steps, settings.eval_every,
                             settings.reward_mode, settings.device)
            frames.append(frame)
            last = frame.iloc[-1]
            print(f"G = {g:2d} seed {seed}: true reward {frame['true_reward'].iloc[0]:.3f} -> {last['true_reward']:.3f}, "
                  f"accuracy {frame['accuracy'].iloc[0]:.3f} -> {last['accuracy']:.3f}, {last['wall_clock_s']:.1f} s", flush=True)
    curves = pd.concat(frames, ignore_index=True)
    atomic_write_text(out / "curves.csv", curves.to_csv(index=False))
    steps = settings.steps
    marks = sorted({s for s in (0, steps // 4, steps // 2, steps) if s in set(curves["step"])})
    task = make_task("bandit", reward_mode=settings.reward_mode)
    optimum = task.prefs.max(dim=1).values.mean().item()
    rm_optimum = task.prefs.gather(1, task.rm.argmax(dim=1, keepdim=True)).mean().item()  # where reward hacking leads
    samples_table, headline = equal_completions_table(curves)
    body = (f"{headline}\n\nGRPO on the bandit (reward mode `{settings.reward_mode}`), {steps} steps, seeds "
            f"{settings.seeds}; mean exact true reward over seeds (optimal policy: {optimum:.3f}; always taking the "
            f"RM's best action: {rm_optimum:.3f}).\n\nAt equal samples (every G read at the same generated "
            f"completions, linear between its evaluations; the comparison a practitioner's budget makes):\n\n"
            + samples_table + "\nAt equal steps (G = 16 generates 8 times the completions of G = 2 per step):\n\n"
            + table(curves, marks) + f"\nRegenerate: `{command}`\n")
    atomic_write_text(out / "group_size.md", body)
    plot(curves, optimum, rm_optimum, out / "group_size.png")
    print(body)
    print(f"wrote {out / 'curves.csv'}, {out / 'group_size.md'}, {out / 'group_size.png'}")
    return 0
