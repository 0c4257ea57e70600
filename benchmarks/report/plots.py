"""The report's PNGs. One colour and one order per variant in every plot (the matrix file's order),
one panel per task; curves are means over seeds with a 95% Student-t band.

    accuracy_vs_completions.png   held-out accuracy against generated completions (the learning curves)
    accuracy_vs_seconds.png       the same against training seconds
    reward_vs_samples.png         training reward (smoothed) against generated completions
    reward_vs_wallclock.png       the same against training wall-clock
    final_accuracy.png, peak_memory.png, time_per_step.png   bars per variant
    diagnostics_<task>.png        the per-step metrics present (entropy, KL, clip fractions, ...)
    performance_profile.png       rliable score distributions of normalised final accuracy
    probability_of_improvement.png   P(row > column), averaged over tasks
    interval_estimates.png        normalised final accuracy and AUC: IQM and mean with 95% intervals
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.io import atomic_write
from benchmarks.report.stats import COLLAPSE_DROP, t_band

CELL_KEYS = ["task", "variant", "algo", "seed"]
# Per-step metrics worth watching, in panel order; those absent from every cell are skipped.
DIAGNOSTICS = [
    ("reward/mean", "training reward"),
    ("reward/std", "reward std (batch)"),
    ("reward/group_std", "reward std within groups"),
    ("groups/tied_fraction", "groups with tied rewards"),
    ("entropy", "entropy"),
    ("kl", "KL to reference"),
    ("clipfrac", "clip fraction"),
    ("clipfrac/low", "clip fraction (low side)"),
    ("clipfrac/high", "clip fraction (high side)"),
    ("grad_norm", "gradient norm"),
    ("tokens per completion", "tokens per completion"),
    ("length/mean", "completion length"),
    ("length/correct", "length of correct completions"),
    ("length/incorrect", "length of incorrect completions"),
    ("truncated", "truncated completions"),
]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.=+-]+", "_", text).strip("_")


def _save(figure, path: Path, title: str) -> None:
    import matplotlib.pyplot as plt

    figure.suptitle(title, y=1.02)
    # 90 dpi: readable on a page, and every regeneration of a matrix's plots is history the repository keeps
    atomic_write(path, lambda tmp: figure.savefig(tmp, dpi=90, bbox_inches="tight", format="png",
                                                  pil_kwargs={"optimize": True}))
    plt.close(figure)


class _Style:
    """Colours, orders and the seaborn keywords every faceted plot shares."""

    def __init__(self, cells: pd.DataFrame):
        import seaborn as sns

        self.variants = list(dict.fromkeys(cells["variant"]))
        self.tasks = list(dict.fromkeys(cells["task"]))
        self.palette = dict(zip(self.variants, sns.color_palette("husl" if len(self.variants) > 10 else None,
                                                                 n_colors=len(self.variants))))

    def facets(self, frame: pd.DataFrame, band: bool = True) -> dict:
        present_v, present_t = set(frame["variant"]), set(frame["task"])
        return {"hue": "variant", "hue_order": [v for v in self.variants if v in present_v], "palette": self.palette,
                "col": "task", "col_order": [t for t in self.tasks if t in present_t], "col_wrap": min(3, len(present_t)),
                "errorbar": t_band if band else None}


def plots(data: dict, curves: dict, analysis: dict, out: Path) -> list[tuple[str, str]]:
    """Write the PNGs; returns [(file name, caption)] for the ones there was data for."""
    import matplotlib

    matplotlib.use("Agg")
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    out.mkdir(parents=True, exist_ok=True)
    cells = data["cells"]
    style = _Style(cells)
    written = []
    written += _learning_curves(curves, style, out)
    written += _training_reward(data["steps"], style, out)
    written += _bars(cells, style, out)
    written += _diagnostics(data["steps"], style, out)
    written += _collapse(data, curves, out)
    written += _robust(analysis, style, out)
    return written


def _learning_curves(curves: dict, style: _Style, out: Path) -> list[tuple[str, str]]:
    import seaborn as sns

    written = []
    for key, x, label, name, title in [
        ("completions", "completions", "generated completions (training samples)", "accuracy_vs_completions.png",
         "Held-out accuracy vs generated completions (mean over seeds, 95% t-interval)"),
        ("seconds", "seconds", "training seconds", "accuracy_vs_seconds.png",
         "Held-out accuracy vs training seconds (mean over seeds, 95% t-interval; a finished run holds its final accuracy)"),
    ]:
        frame = curves.get(key, pd.DataFrame())
        if frame.empty:
            continue
        g = sns.relplot(data=frame, x=x, y="accuracy", kind="line", marker="o" if key == "completions" else None,
                        facet_kws={"sharex": False}, height=3.2, **style.facets(frame))
        g.set_axis_labels(label, "held-out accuracy")
        g.set(ylim=(-0.02, 1.02))
        _save(g.figure, out / name, title)
        written.append((name, f"held-out accuracy vs {label}"))
    return written


def _training_reward(steps: pd.DataFrame, style: _Style, out: Path) -> list[tuple[str, str]]:
    import seaborn as sns

    if steps.empty or "reward/mean" not in steps:
        return []
    steps = steps.sort_values(CELL_KEYS + ["step"]).copy()
    # Per-step rewards of a small batch are noisy: a trailing mean over ~10% of the run.
    steps["reward (smoothed)"] = steps.groupby(["task", "variant", "seed"], sort=False)["reward/mean"].transform(
        lambda s: s.rolling(max(1, len(s) // 10), min_periods=1).mean())
    g = sns.relplot(data=steps, x="samples", y="reward (smoothed)", kind="line",
                    facet_kws={"sharex": False, "sharey": False}, height=3.2, **style.facets(steps))
    g.set_axis_labels("generated completions (training samples)", "training reward")
    _save(g.figure, out / "reward_vs_samples.png", "Training reward vs samples (mean over seeds, 95% t-interval)")
    # Seeds do not share wall-clock instants: average within 40 time bins per task and variant.
    steps["wall-clock (s)"] = steps.groupby(["task", "variant"])["time/wall"].transform(
        lambda s: ((s / max(s.max(), 1e-9) * 40).clip(upper=39.999).astype(int) + 0.5) * max(s.max(), 1e-9) / 40)
    g = sns.relplot(data=steps, x="wall-clock (s)", y="reward (smoothed)", kind="line",
                    facet_kws={"sharex": False, "sharey": False}, height=3.2, **style.facets(steps))
    g.set_axis_labels("training wall-clock (s)", "training reward")
    _save(g.figure, out / "reward_vs_wallclock.png", "Training reward vs wall-clock (binned, 95% t-interval)")
    return [("reward_vs_samples.png", "training reward vs generated completions"),
            ("reward_vs_wallclock.png", "training reward vs training wall-clock")]


def _bars(cells: pd.DataFrame, style: _Style, out: Path) -> list[tuple[str, str]]:
    import seaborn as sns

    done = cells[cells["status"] == "complete"].copy() if "status" in cells else cells.iloc[:0]
    if done.empty:
        return []
    done["peak memory (MiB)"] = done["peak_memory_bytes"] / 2**20
    done["time per step (ms)"] = done["time_per_step_s"] * 1e3
    done["final accuracy"] = done["accuracy_after"]
    written = []
    for column, name, title in [
        ("final accuracy", "final_accuracy.png", "Final accuracy"),
        ("peak memory (MiB)", "peak_memory.png", f"Peak memory ({done['peak_memory_kind'].iloc[0]})"),
        ("time per step (ms)", "time_per_step.png", "Training time per step"),
    ]:
        st = style.facets(done)
        g = sns.catplot(data=done, x="variant", y=column, order=st["hue_order"], kind="bar", height=3.4, aspect=1.3,
                        legend=False, sharey=column != "final accuracy", **st)
        g.set_xticklabels(rotation=40, ha="right")
        if column == "final accuracy":
            g.set(ylim=(0, 1.02))
        _save(g.figure, out / name, f"{title} (mean over seeds, 95% t-interval)")
        written.append((name, title.lower()))
    return written


def _diagnostics(steps: pd.DataFrame, style: _Style, out: Path) -> list[tuple[str, str]]:
    """One PNG per task, a panel per metric present, x = generated completions, mean over seeds (smoothed)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    if steps.empty:
        return []
    steps = steps.sort_values(CELL_KEYS + ["step"]).copy()
    if "tokens/generated" in steps and "completions" in steps:
        steps["tokens per completion"] = steps["tokens/generated"] / steps["completions"].replace(0, np.nan)
    written = []
    for task in style.tasks:
        frame = steps[steps["task"] == task]
        metrics = [(m, label) for m, label in DIAGNOSTICS if m in frame and frame[m].notna().any()]
        if frame.empty or not metrics:
            continue
        cols = min(3, len(metrics))
        rows = -(-len(metrics) // cols)
        fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
        order = [v for v in style.variants if v in set(frame["variant"])]
        for ax, (metric, label) in zip(axes.flat, metrics):
            part = frame[["variant", "seed", "samples", metric]].dropna()
            # Per-step metrics are noisy: a trailing mean over ~5% of each run, then the mean over seeds.
            part = part.assign(value=part.groupby(["variant", "seed"], sort=False)[metric].transform(
                lambda s: s.rolling(max(1, len(s) // 20), min_periods=1).mean()))
            sns.lineplot(data=part, x="samples", y="value", hue="variant", hue_order=[v for v in order if v in set(part["variant"])],
                         palette=style.palette, errorbar=None, ax=ax, legend=False, linewidth=1)
            ax.set_title(f"{label} ({metric})" if label != metric else label, fontsize=9)
            ax.set_xlabel("generated completions")
            ax.set_ylabel("")
        for ax in list(axes.flat)[len(metrics):]:
            ax.set_visible(False)
        handles = [plt.Line2D([], [], color=style.palette[v], label=v) for v in order]
        fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
        fig.tight_layout()
        name = f"diagnostics_{_slug(task)}.png"
        _save(fig, out / name, f"{task}: per-step diagnostics (mean over seeds, smoothed)")
        written.append((name, f"{task}: per-step diagnostics"))
    return written


# What the steps before a collapse show (the panels present in a cell's metrics, in this order).
COLLAPSE_PANELS = [("reward/mean", "training reward"), ("reward/std", "reward std (batch)"),
                   ("advantage/std", "advantage std"), ("kl", "KL to reference"), ("entropy", "entropy"),
                   ("grad_norm", "gradient norm"), ("clipfrac", "clip fraction"), ("loss/value", "value loss")]


def _collapse(data: dict, curves: dict, out: Path) -> list[tuple[str, str]]:
    """For the collapsed seed with the largest fall from a peak above its start (else from its start):
    held-out accuracy and the raw per-step
    diagnostics of that one run, with the peak evaluation and the first evaluation at least
    ``COLLAPSE_DROP`` below it marked. A mean over seeds would hide the collapse in the seeds that did not."""
    import matplotlib.pyplot as plt

    cells, evals, steps = curves.get("cells", pd.DataFrame()), data["evals"], data["steps"]
    if cells.empty or not cells["collapsed"].any() or evals.empty or steps.empty:
        return []
    # A run that learned and then fell tells more than one that only fell from its start (DPO's drift).
    fallen = cells[cells["collapsed"]].assign(fall=lambda f: f["peak_accuracy"] - f["final_accuracy"],
                                              learned=lambda f: f["peak_accuracy"] > f["accuracy_before"])
    worst = fallen.sort_values(["learned", "fall"], ascending=False, kind="stable").iloc[0]
    key = {"task": worst["task"], "variant": worst["variant"], "seed": worst["seed"]}

    def of_cell(frame):
        return frame[(frame["task"] == key["task"]) & (frame["variant"] == key["variant"]) & (frame["seed"] == key["seed"])]

    points = of_cell(evals).sort_values("samples")
    rows = of_cell(steps).sort_values("step")
    panels = [(m, label) for m, label in COLLAPSE_PANELS if m in rows and rows[m].notna().any()]
    peak_at = float(points.loc[points["accuracy"].idxmax(), "samples"])
    after_peak = points[(points["samples"] > peak_at) & (points["accuracy"] <= points["accuracy"].max() - COLLAPSE_DROP)]
    fell_at = float(after_peak["samples"].iloc[0]) if len(after_peak) else None
    cols = 3
    fig, axes = plt.subplots(-(-(len(panels) + 1) // cols), cols, figsize=(4.2 * cols, 2.8 * (-(-(len(panels) + 1) // cols))),
                             squeeze=False)
    flat = list(axes.flat)
    flat[0].plot(points["samples"], points["accuracy"], marker="o", color="black", linewidth=1)
    flat[0].set_title("held-out accuracy", fontsize=9)
    for ax, (metric, label) in zip(flat[1:], panels):
        part = rows[["samples", metric]].dropna()
        ax.plot(part["samples"], part[metric], color="tab:blue", alpha=0.35, linewidth=0.6)
        ax.plot(part["samples"], part[metric].rolling(max(1, len(part) // 20), min_periods=1).mean(), color="tab:blue",
                linewidth=1.2)
        ax.set_title(f"{label} ({metric})", fontsize=9)
    for ax in flat[:len(panels) + 1]:
        ax.axvline(peak_at, color="tab:green", linestyle="--", linewidth=0.8)
        if fell_at is not None:
            ax.axvline(fell_at, color="tab:red", linestyle="--", linewidth=0.8)
        ax.set_xlabel("generated completions")
    for ax in flat[len(panels) + 1:]:
        ax.set_visible(False)
    fig.tight_layout()
    name = "collapse.png"
    where = f"{key['task']}, {key['variant']}, seed {key['seed']}"
    _save(fig, out / name, f"A collapse up close: {where} (peak {worst['peak_accuracy']:.3f}, final "
                           f"{worst['final_accuracy']:.3f}; green: the peak evaluation, red: the first "
                           f">= {COLLAPSE_DROP} below it; per step, raw and smoothed)")
    return [(name, f"a collapse up close: {where}, per-step diagnostics around it")]


def _robust(analysis: dict, style: _Style, out: Path) -> list[tuple[str, str]]:
    import matplotlib.pyplot as plt

    written = []
    profiles = analysis.get("profiles", pd.DataFrame())
    if not profiles.empty:
        fig, ax = plt.subplots(figsize=(6.5, 4))
        for name, frame in profiles.groupby("name", sort=False):
            colour = style.palette.get(name)
            ax.plot(frame["tau"], frame["fraction"], label=name, color=colour, linewidth=1.2)
            ax.fill_between(frame["tau"], frame["low"], frame["high"], color=colour, alpha=0.15)
        ax.set_xlabel("normalised final accuracy tau (0: starting policy, 1: accuracy 1.0)")
        ax.set_ylabel("fraction of runs with score > tau")
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
        _save(fig, out / "performance_profile.png", "Performance profiles over all tasks and seeds (95% bootstrap band)")
        written.append(("performance_profile.png", "performance profiles (normalised final accuracy)"))
    poi = analysis.get("poi", pd.DataFrame())
    overall = poi[poi["task"] == "all tasks"] if not poi.empty else poi
    if not overall.empty:
        names = [v for v in style.variants if v in set(overall["x"])]
        grid = overall.pivot(index="x", columns="y", values="probability").reindex(index=names, columns=names)
        fig, ax = plt.subplots(figsize=(1.0 + 0.55 * len(names), 0.8 + 0.45 * len(names)))
        image = ax.imshow(grid.to_numpy(float), vmin=0, vmax=1, cmap="RdBu")
        ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=7)
        ax.set_yticks(range(len(names)), names, fontsize=7)
        for i in range(len(names)):
            for j in range(len(names)):
                if i != j:
                    ax.text(j, i, f"{grid.iat[i, j]:.2f}", ha="center", va="center", fontsize=6)
        fig.colorbar(image, ax=ax, label="P(row > column)")
        _save(fig, out / "probability_of_improvement.png", "Probability of improvement, final accuracy, averaged over tasks")
        written.append(("probability_of_improvement.png", "probability of improvement (row over column)"))
    table = analysis.get("overall", pd.DataFrame())
    if not table.empty:
        fig, axes = plt.subplots(1, 2, figsize=(10, 0.8 + 0.32 * len(table)), sharey=True)
        names = list(table["variant"])[::-1]
        y = np.arange(len(names))
        frame = table.set_index("variant").loc[names]
        for ax, prefix, title in zip(axes, ("final", "auc"), ("normalised final accuracy", "normalised AUC")):
            for offset, stat, marker in ((0.15, "iqm", "o"), (-0.15, "mean", "s")):
                point, low, high = (frame[f"{prefix}_{stat}{s}"].to_numpy(float) for s in ("", "_low", "_high"))
                ax.errorbar(point, y + offset, xerr=[point - low, high - point], fmt=marker, markersize=4, capsize=2,
                            label=stat.upper() if stat == "iqm" else stat)
            ax.set_title(title, fontsize=9)
        axes[0].set_yticks(y, names, fontsize=7)
        axes[1].legend(fontsize=7)
        _save(fig, out / "interval_estimates.png", "All tasks: IQM and mean with 95% stratified-bootstrap intervals")
        written.append(("interval_estimates.png", "IQM and mean over all tasks with 95% bootstrap intervals"))
    return written
