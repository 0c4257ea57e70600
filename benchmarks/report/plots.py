"""The report's PNGs. One look per variant in every plot (the matrix file's order): nine colours far apart,
and past nine variants another line style and marker, so that 15 curves are told apart; one panel per task;
curves are means over seeds with a 95% Student-t band. ``plots(..., highlight={...})`` draws the given variants
(the ones that could be best, say) bold in colour and on top, the others thin in greys without bands; their
names stay in the legend, highlighted ones in bold. Past six variants on a task the accuracy and reward curves are
small multiples instead: a panel per variant, its curve in colour (highlighted) or dark grey (not), the others light
grey behind it. Every title sits above the panels and legends it heads.

    accuracy_vs_completions.png   held-out accuracy against generated completions (the learning curves; only the
                                  completion counts a run was evaluated at: DPO's samples, drawn up front, put all
                                  its evaluations at the budget)
    accuracy_vs_seconds.png       the same against training seconds
    reward_vs_samples.png         training reward (smoothed) against generated completions
    reward_vs_wallclock.png       the same against training wall-clock
    final_accuracy.png, peak_memory.png, time_per_step.png   bars per variant, named under every panel
    diagnostics_<task>.png        the per-step metrics present (entropy, KL, clip fractions, ...)
    collapse.png                  the collapsed run that fell furthest from a peak, per step
    performance_profile.png       rliable score distributions of normalised final accuracy
    probability_of_improvement.png   P(row > column), averaged over tasks
    interval_estimates.png        normalised final accuracy and AUC: IQM and mean with 95% intervals
    verdicts.png                  per task, each variant's simultaneous 95% interval of its gap to the best of the
                                  others (the verdicts' ``gap_low``/``gap_high``): 0 marked, the could-be-best set
                                  in colour and the rest grey, the margin of equivalence shaded where one is stated

``plots(..., svg={})`` also fills the dict with the verdict figure's and the learning curves' SVG text (file name ->
an ``<svg>`` element, text kept as text), for the HTML page to inline.
"""

from __future__ import annotations

import copy
import re
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.io import save_figure
from benchmarks.report.curves import CELL_KEYS
from benchmarks.report.stats import COLLAPSE_DROP

# Per-step metrics worth watching, in panel order; those absent from every cell are skipped.
DIAGNOSTICS = [
    ("reward/mean", "training reward"),
    ("reward/std", "reward std (batch)"),
    ("reward/group_std", "reward std within groups"),
    ("groups/tied_fraction", "groups with tied rewards"),
    ("entropy", "entropy"),
    ("kl/k3", "KL to reference (k3)"),
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


def _save(figure, path: Path, title: str, svg: dict | None = None) -> None:
    """Write ``figure`` with ``title`` above everything already drawn (panel titles, legends, colour bars), wrapped
    to the drawing's width: a fixed position overlapped the panel titles of a short figure. With ``svg``, the
    figure's SVG text is also kept there under the PNG's file name."""
    import matplotlib.pyplot as plt

    renderer = figure.canvas.get_renderer()
    boxes = [ax.get_tightbbox(renderer) for ax in figure.axes if ax.get_visible()]
    boxes += [legend.get_window_extent(renderer) for legend in figure.legends]
    boxes = [b for b in boxes if b is not None and np.isfinite([b.x0, b.x1, b.y1]).all()]
    top = max((b.y1 for b in boxes), default=figure.bbox.y1)
    left = min((b.x0 for b in boxes), default=figure.bbox.x0)
    right = max((b.x1 for b in boxes), default=figure.bbox.x1)
    size = 11
    # characters of a line: the drawing's width over an average glyph (about half the font size)
    chars = max(30, int((right - left) / (0.5 * size * figure.dpi / 72)))
    figure.suptitle("\n".join(textwrap.wrap(title, chars)), x=(left + right) / 2 / figure.bbox.width,
                    y=(top + 0.6 * size * figure.dpi / 72) / figure.bbox.height, va="bottom", ha="center", fontsize=size)
    if svg is not None:
        svg[path.name] = svg_text(figure)
    # 90 dpi: readable on a page, and every regeneration of a matrix's plots is history the repository keeps
    save_figure(figure, path, dpi=90, bbox_inches="tight")
    plt.close(figure)


def svg_text(figure) -> str:
    """``figure`` as an ``<svg>`` element to inline in a page: text kept as text (searchable, a fraction of the
    size of glyph outlines), no date, ids salted the same every time so that a page regenerates identically."""
    import io

    import matplotlib

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "grpo-bench"}):
        figure.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buffer.getvalue()
    # the RDF metadata block names the creator's namespaces and adds nothing a page shows
    return re.sub(r"\s*<metadata>.*?</metadata>", "", text[text.index("<svg"):], flags=re.S)


# Nine colours far apart (tab10 without its grey, which marks the variants not highlighted); neighbours in the
# matrix's order never share one. Past nine variants a colour comes back with another line style and marker.
COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf"]
GREYS = ["#7f7f7f", "#a6a6a6", "#595959"]
LINESTYLES = ["-", (0, (4, 1.5)), (0, (1, 1.2)), (0, (6, 1.5, 1, 1.5))]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "<", "*", ">"]


class _Style:
    """Colours, line styles, markers and orders every plot shares. Each variant has its own look: a colour, and
    past nine variants another line style and marker, so that 15 curves are told apart. With ``highlight`` the
    variants in it are drawn bold in those colours on top, the others thin in greys (still with their own line
    style and marker, and their names in the legend) and without bands."""

    def __init__(self, cells: pd.DataFrame, highlight: set[str] | None = None, highlight_label: str = "highlighted",
                 per_task: dict[str, set[str]] | None = None):
        self.variants = list(dict.fromkeys(cells["variant"]))
        self.tasks = list(dict.fromkeys(cells["task"]))
        # a highlight that is a verdict per task (could be best on it): each task's panel highlights its own set
        self.per_task = per_task
        chosen = set(highlight or ())
        self.highlighted = [v for v in self.variants if v in chosen]
        self.highlight_label = highlight_label
        self.looks = {}
        rest = [v for v in self.variants if v not in chosen]
        if self.highlighted:
            for k, v in enumerate(self.highlighted):
                self.looks[v] = {"color": COLOURS[k % 9], "linestyle": LINESTYLES[(k // 9) % 4],
                                 "marker": MARKERS[k % 10], "linewidth": 2.2, "markersize": 5.0, "alpha": 1.0, "zorder": 3}
            for j, v in enumerate(rest):
                self.looks[v] = {"color": GREYS[j % 3], "linestyle": LINESTYLES[j % 4], "marker": MARKERS[j % 10],
                                 "linewidth": 0.9, "markersize": 3.0, "alpha": 0.85, "zorder": 2}
        else:
            for i, v in enumerate(self.variants):
                self.looks[v] = {"color": COLOURS[i % 9], "linestyle": LINESTYLES[(i // 9) % 4],
                                 "marker": MARKERS[i % 10], "linewidth": 1.5, "markersize": 4.0, "alpha": 1.0, "zorder": 2}
        self.palette = {v: look["color"] for v, look in self.looks.items()}

    def panel(self, task: str) -> "_Style":
        """The style of ``task``'s panel: its own highlighted set where the highlight is per task; a variant
        highlighted on another task only keeps its line style and marker, thin and grey, as the others."""
        if self.per_task is None or task not in self.per_task:
            return self
        own = copy.copy(self)
        own.per_task = None
        own.highlighted = [v for v in self.highlighted if v in self.per_task[task]]
        demoted = [v for v in self.highlighted if v not in own.highlighted]
        own.looks = {**self.looks, **{v: {**self.looks[v], "color": GREYS[k % 3], "linewidth": 0.9, "markersize": 3.0,
                                          "alpha": 0.85, "zorder": 2} for k, v in enumerate(demoted)}}
        own.palette = {v: look["color"] for v, look in own.looks.items()}
        return own

    def look(self, variant: str) -> dict:
        """A variant not in the matrix's cells (a profile's name, say) gets a plain grey look."""
        return self.looks.get(variant, {"color": GREYS[0], "linestyle": "-", "marker": "o", "linewidth": 1.0,
                                        "markersize": 3.0, "alpha": 0.85, "zorder": 2})

    def is_highlighted(self, variant: str) -> bool:
        return variant in self.highlighted

    def band_alpha(self, variant: str) -> float:
        """Bands of the highlighted variants only, when there are some; fainter the more variants share a panel."""
        if self.highlighted:
            return 0.18 if self.is_highlighted(variant) else 0.0
        return 0.15 if len(self.variants) <= 6 else 0.07

    def order(self, present) -> list[str]:
        """The legend's order: highlighted variants first, then the others, each in the matrix's order."""
        present = set(present)
        return [v for v in self.highlighted if v in present] + [v for v in self.variants
                                                                if v in present and v not in self.highlighted]

    def line(self, variant: str, points: int, markers: bool = True, width: float = 1.0) -> dict:
        """Keywords of ``ax.plot`` for a variant's line of ``points`` points; ``width`` scales its line width."""
        look = self.look(variant)
        kwargs = {k: look[k] for k in ("color", "linestyle", "alpha", "zorder")}
        kwargs["linewidth"] = look["linewidth"] * width
        if markers:
            # markers on at most ~10 points of a line: they tell the series apart without hiding the line
            kwargs.update(marker=look["marker"], markersize=look["markersize"], markevery=max(1, points // 10),
                          markeredgewidth=0.4, markeredgecolor="white")
        return kwargs

    def handles(self, present) -> list:
        import matplotlib.pyplot as plt

        return [plt.Line2D([], [], label=v, color=self.look(v)["color"], linestyle=self.look(v)["linestyle"],
                           linewidth=self.look(v)["linewidth"], marker=self.look(v)["marker"],
                           markersize=self.look(v)["markersize"] + 1) for v in self.order(present)]

    def legend(self, figure, present, **kwargs) -> None:
        """One legend for the figure, outside its panels on the right; highlighted names in bold."""
        where = " on a task; thick in its task's panels" if self.per_task is not None else ""
        title = "variant" + (f" (bold: {self.highlight_label}{where})" if self.highlighted else "")
        options = {"loc": "center left", "bbox_to_anchor": (1.0, 0.5), "fontsize": 8, "title": title,
                   "title_fontsize": 8, "frameon": False, "handlelength": 3.2}
        options.update(kwargs)
        legend = figure.legend(handles=self.handles(present), **options)
        for text in legend.get_texts():
            if self.is_highlighted(text.get_text()):
                text.set_fontweight("bold")

    def ticks(self, labels) -> None:
        """Tick labels of highlighted variants in bold."""
        for label in labels:
            if self.is_highlighted(label.get_text()):
                label.set_fontweight("bold")


def plots(data: dict, curves: dict, analysis: dict, out: Path, *, highlight: set[str] | None = None,
          highlight_label: str = "highlighted", svg: dict | None = None) -> list[tuple[str, str]]:
    """Write the PNGs; returns [(file name, caption)] for the ones there was data for. ``highlight``: a set of
    variants (the ones that could be best, say) drawn bold in colour, the others thin in grey; ``highlight_label``
    names that set in the legends. ``svg``: a dict filled with the verdict figure's and the learning curves' SVG."""
    import matplotlib

    matplotlib.use("Agg")
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    out.mkdir(parents=True, exist_ok=True)
    cells = data["cells"]
    style = _Style(cells, highlight, highlight_label, _per_task(analysis, highlight))
    written = []
    written += _verdict_figure(analysis, style, out, svg)
    written += _learning_curves(curves, style, out, svg)
    written += _training_reward(data["steps"], style, out)
    written += _bars(cells, style, out)
    written += _diagnostics(data["steps"], style, out)
    written += _collapse(data, curves, out)
    written += _robust(analysis, style, out)
    return written


def _per_task(analysis: dict, highlight: set[str] | None) -> dict[str, set[str]] | None:
    """Each task's best set (the verdicts' ``in_best_set``) when ``highlight`` is their union over tasks, as the
    report passes it: a panel of one task then bolds that task's set, not every task's."""
    tasks = analysis.get("tasks")
    if not highlight or not isinstance(tasks, pd.DataFrame) or "in_best_set" not in tasks:
        return None
    best = tasks[tasks["in_best_set"].astype(bool)]
    per_task = {str(t): set(group["variant"]) for t, group in best.groupby("task", sort=False)}
    per_task.update({str(t): set() for t in tasks["task"].unique() if str(t) not in per_task})
    return per_task if set().union(*per_task.values()) == set(highlight) else None


def _t_half(std: pd.Series, count: pd.Series) -> np.ndarray:
    """Half-width of the 95% Student-t interval of a mean (0 for a single value: no band)."""
    from scipy import stats

    n = count.to_numpy(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        half = stats.t.ppf(0.975, np.maximum(n - 1, 1)) * std.to_numpy(float) / np.sqrt(n)
    return np.where((n >= 2) & np.isfinite(half), half, 0.0)


def _panels(style: _Style, tasks: list[str], *, width: float = 4.6, height: float = 3.4):
    """A panel per task, three to a row; one task gets one larger panel."""
    import matplotlib.pyplot as plt

    if len(tasks) == 1:
        width, height = 6.4, 4.4
    cols = min(3, len(tasks))
    rows = -(-len(tasks) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    for ax in list(axes.flat)[len(tasks):]:
        ax.set_visible(False)
    return fig, dict(zip(tasks, axes.flat))


def _draw_lines(ax, frame: pd.DataFrame, x: str, y: str, style: _Style, *, band: bool = True,
                markers: bool = True, width: float = 1.0) -> None:
    """Per variant: the mean of ``y`` over seeds at each ``x``, with a 95% t band; the highlighted on top."""
    for variant in reversed(style.order(frame["variant"])):
        part = frame.loc[frame["variant"] == variant, [x, y]].dropna()
        if part.empty:
            continue
        agg = part.groupby(x, sort=True)[y].agg(["mean", "std", "count"])
        xs, mean = agg.index.to_numpy(float), agg["mean"].to_numpy(float)
        ax.plot(xs, mean, label=variant, **style.line(variant, len(xs), markers, width))
        alpha = style.band_alpha(variant)
        if band and alpha:
            half = _t_half(agg["std"], agg["count"])
            ax.fill_between(xs, mean - half, mean + half, color=style.look(variant)["color"], alpha=alpha, linewidth=0,
                            zorder=style.look(variant)["zorder"] - 1)


# Past this many variants on a task, curves drawn over one another cannot be told apart however they are styled (the
# toy verdict's 15 end within 0.05 of each other): each variant gets a small panel of its own, the others faint behind.
SMALL_MULTIPLES_ABOVE = 6
CONTEXT_GREY = "#d0d0d0"  # the other variants behind a small multiple's own curve


def _curve_plot(frame: pd.DataFrame, x: str, y: str, style: _Style, path: Path, title: str, xlabel: str,
                ylabel: str, *, accuracy: bool, markers: bool, svg: dict | None = None) -> None:
    tasks = [t for t in style.tasks if t in set(frame["task"])]
    if max(frame.loc[frame["task"] == t, "variant"].nunique() for t in tasks) > SMALL_MULTIPLES_ABOVE:
        fig = _small_multiples(frame, x, y, style, tasks, xlabel, ylabel, accuracy=accuracy)
        where = " on its task" if style.per_task is not None else ""
        title += ("; a panel per variant, the others light grey behind it"
                  + (f"; {style.highlight_label}{where}: in colour, named in bold" if style.highlighted else ""))
        _save(fig, path, title, svg)
        return
    fig, panels = _panels(style, tasks)
    for task, ax in panels.items():
        _draw_lines(ax, frame[frame["task"] == task], x, y, style.panel(task), markers=markers)
        ax.set_title(task, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if accuracy:
            ax.set_ylim(-0.02, 1.02)
    fig.tight_layout()
    style.legend(fig, frame["variant"])
    _save(fig, path, title, svg)


def _columns(panels: int) -> int:
    """Three to five panels to a row, the fewest empty ones left over (then the fewest rows)."""
    return min((3, 4, 5), key=lambda cols: (-(-panels // cols) * cols - panels, -cols))


def _small_multiples(frame: pd.DataFrame, x: str, y: str, style: _Style, tasks: list[str], xlabel: str, ylabel: str,
                     *, accuracy: bool):
    """Per task a block of panels, one per variant (the legend's order: the highlighted first): its mean over seeds
    with a 95% t band, in its colour where it is highlighted on the task (or nothing is) and dark grey where it is
    not, over every other variant's mean in light grey; titled with its name and last mean. The panels of a task
    share their axes (accuracy: the range its curves and bands span)."""
    import matplotlib.pyplot as plt

    order = {task: style.panel(task).order(frame.loc[frame["task"] == task, "variant"]) for task in tasks}
    cols = _columns(max(len(variants) for variants in order.values()))
    rows = {task: -(-len(variants) // cols) for task, variants in order.items()}
    fig, axes = plt.subplots(sum(rows.values()), cols, figsize=(2.8 * cols, 2.2 * sum(rows.values())), squeeze=False)
    top = 0
    for task in tasks:
        panel, part = style.panel(task), frame[frame["task"] == task]
        means = {v: part.loc[part["variant"] == v, [x, y]].dropna().groupby(x, sort=True)[y].agg(["mean", "std", "count"])
                 for v in order[task]}
        block = axes[top:top + rows[task]]
        flat = list(block.flat)
        for ax, variant in zip(flat, order[task]):
            for other in order[task]:
                if other != variant and not means[other].empty:
                    ax.plot(means[other].index.to_numpy(float), means[other]["mean"].to_numpy(float),
                            color=CONTEXT_GREY, linewidth=0.7, label=f"_{other}", zorder=1)
            own = panel.is_highlighted(variant) or not panel.highlighted
            colour = panel.look(variant)["color"] if own else GREYS[2]
            agg = means[variant]
            if agg.empty:
                ax.set_title(f"{variant}: no {ylabel}", fontsize=8)  # DPO logs no training reward
            else:
                xs, mean = agg.index.to_numpy(float), agg["mean"].to_numpy(float)
                half = _t_half(agg["std"], agg["count"])
                ax.fill_between(xs, mean - half, mean + half, color=colour, alpha=0.2, linewidth=0, zorder=2)
                ax.plot(xs, mean, color=colour, linewidth=2.0 if panel.is_highlighted(variant) else 1.4, label=variant,
                        marker="o", markersize=2.5, markevery=max(1, len(xs) // 10), zorder=3)
                ax.set_title(f"{variant}: {mean[-1]:.3f}", fontsize=8, color=colour if panel.highlighted and own else
                             "black", fontweight="bold" if panel.is_highlighted(variant) else "normal")
            ax.tick_params(labelsize=7)
            if ax is not flat[0]:
                ax.sharex(flat[0])
                ax.sharey(flat[0])
        for ax in flat[len(order[task]):]:
            ax.set_visible(False)
        for ax in block[:, 0]:
            ax.set_ylabel(f"{task}\n{ylabel}", fontsize=8)
        if accuracy:  # the band the curves span, within 0-1: a small panel has no height to spare
            spans = [(m["mean"] - h, m["mean"] + h) for m in means.values() if not m.empty
                     for h in [_t_half(m["std"], m["count"])]]
            low, high = (min(s[0].min() for s in spans), max(s[1].max() for s in spans)) if spans else (0.0, 1.0)
            pad = 0.05 * max(high - low, 0.1)
            flat[0].set_ylim(max(-0.02, low - pad), min(1.02, high + pad))
        top += rows[task]
    fig.supxlabel(xlabel, fontsize=9)
    fig.tight_layout()
    return fig


def _learning_curves(curves: dict, style: _Style, out: Path, svg: dict | None = None) -> list[tuple[str, str]]:
    written = []
    for key, x, label, name, title in [
        ("completions", "completions", "generated completions (training samples)", "accuracy_vs_completions.png",
         "Held-out accuracy vs generated completions (mean over seeds, 95% t-interval)"),
        ("seconds", "seconds", "training seconds", "accuracy_vs_seconds.png",
         "Held-out accuracy vs training seconds (mean over seeds, 95% t-interval; a finished run holds its final accuracy)"),
    ]:
        frame = curves.get(key, pd.DataFrame())
        if "measured" in frame:  # a grid point a run did not evaluate is drawn from its measured points alone
            frame = frame[frame["measured"].astype(bool)]
        if frame.empty:
            continue
        _curve_plot(frame, x, "accuracy", style, out / name, title, label, "held-out accuracy", accuracy=True,
                    markers=True, svg=svg if key == "completions" else None)
        written.append((name, f"held-out accuracy vs {label}"))
    return written


def _verdict_figure(analysis: dict, style: _Style, out: Path, svg: dict | None = None) -> list[tuple[str, str]]:
    """Per task a panel: each variant's simultaneous 95% interval of its gap to the best of the others, ranked as
    the verdict table (highest primary metric on top), 0 marked, the margin of equivalence shaded where stated;
    the task's could-be-best set in colour and bold, the rest thin and grey (readable with 15 variants). A variant
    without an interval (too few seeds) is named at 0 with its mark."""
    table = analysis.get("tasks")
    if not isinstance(table, pd.DataFrame) or table.empty or "gap_low" not in table:
        return []
    tasks = list(dict.fromkeys(table["task"]))
    most = int(table.groupby("task").size().max())
    fig, panels = _panels(style, tasks)
    # a row of intervals per variant, whatever the panel size _panels gives one task: 15 names stay apart
    fig.set_size_inches(fig.get_size_inches()[0], -(-len(tasks) // 3) * (0.3 * most + 1.4))
    margin = (analysis.get("spec") or {}).get("margin")
    for task, ax in panels.items():
        _gap_panel(ax, table[table["task"] == task], margin, task)
    fig.tight_layout()
    name = "verdicts.png"
    band = f"; shaded: the margin of equivalence +-{margin:g}" if margin else ""
    _save(fig, out / name, "Gap to the best of the others: simultaneous 95% intervals (could be best: in colour, "
                           f"bold; worse: grey, the interval below 0{band})", svg)
    return [(name, "verdicts: each variant's gap to the best of the others, simultaneous 95% intervals")]


def _training_reward(steps: pd.DataFrame, style: _Style, out: Path) -> list[tuple[str, str]]:
    if steps.empty or "reward/mean" not in steps:
        return []
    steps = steps.sort_values(CELL_KEYS + ["step"]).copy()
    # Per-step rewards of a small batch are noisy: a trailing mean over ~10% of the run.
    steps["reward (smoothed)"] = steps.groupby(["task", "variant", "seed"], sort=False)["reward/mean"].transform(
        lambda s: s.rolling(max(1, len(s) // 10), min_periods=1).mean())
    _curve_plot(steps, "samples", "reward (smoothed)", style, out / "reward_vs_samples.png",
                "Training reward vs samples (mean over seeds, 95% t-interval)",
                "generated completions (training samples)", "training reward", accuracy=False, markers=True)
    # Seeds do not share wall-clock instants: average within 40 time bins per task and variant.
    steps["wall-clock (s)"] = steps.groupby(["task", "variant"])["time/wall"].transform(
        lambda s: ((s / max(s.max(), 1e-9) * 40).clip(upper=39.999).astype(int) + 0.5) * max(s.max(), 1e-9) / 40)
    _curve_plot(steps, "wall-clock (s)", "reward (smoothed)", style, out / "reward_vs_wallclock.png",
                "Training reward vs wall-clock (binned, 95% t-interval)", "training wall-clock (s)", "training reward",
                accuracy=False, markers=True)
    return [("reward_vs_samples.png", "training reward vs generated completions"),
            ("reward_vs_wallclock.png", "training reward vs training wall-clock")]


def _bars(cells: pd.DataFrame, style: _Style, out: Path) -> list[tuple[str, str]]:
    """A bar per variant and panel per task, every panel with the variants' names under its bars."""
    done = cells[cells["status"] == "complete"].copy() if "status" in cells else cells.iloc[:0]
    if done.empty:
        return []
    done["peak memory (MiB)"] = done["peak_memory_bytes"] / 2**20
    done["time per step (ms)"] = done["time_per_step_s"] * 1e3
    done["final accuracy"] = done["accuracy_after"]
    tasks = [t for t in style.tasks if t in set(done["task"])]
    written = []
    for column, name, title in [
        ("final accuracy", "final_accuracy.png", "Final accuracy"),
        ("peak memory (MiB)", "peak_memory.png", f"Peak memory ({done['peak_memory_kind'].iloc[0]})"),
        ("time per step (ms)", "time_per_step.png", "Training time per step"),
    ]:
        n = len(set(done["variant"]))
        fig, panels = _panels(style, tasks, width=max(3.6, 1.2 + 0.34 * n), height=3.6)
        for task, ax in panels.items():
            part, panel = done[done["task"] == task], style.panel(task)
            order = [v for v in style.variants if v in set(part["variant"])]
            agg = part.groupby("variant")[column].agg(["mean", "std", "count"]).reindex(order)
            half = _t_half(agg["std"], agg["count"])
            colours = [panel.look(v)["color"] for v in order]
            ax.bar(range(len(order)), agg["mean"].to_numpy(float), yerr=half, color=colours, capsize=2,
                   edgecolor="black", linewidth=[1.2 if panel.is_highlighted(v) else 0.3 for v in order],
                   error_kw={"elinewidth": 0.9})
            ax.set_xticks(range(len(order)), order, rotation=40, ha="right", rotation_mode="anchor", fontsize=8)
            panel.ticks(ax.get_xticklabels())
            ax.set_title(task, fontsize=10)
            ax.set_ylabel(column)
            ax.grid(axis="x", visible=False)
            if column == "final accuracy":
                ax.set_ylim(0, 1.02)
        fig.tight_layout()
        _save(fig, out / name, f"{title} (mean over seeds, 95% t-interval)"
                               + (f"; bold: {style.highlight_label}" if style.highlighted else ""))
        written.append((name, title.lower()))
    return written


def _diagnostics(steps: pd.DataFrame, style: _Style, out: Path) -> list[tuple[str, str]]:
    """One PNG per task, a panel per metric present, x = generated completions, mean over seeds (smoothed)."""
    import matplotlib.pyplot as plt

    if steps.empty:
        return []
    steps = steps.sort_values(CELL_KEYS + ["step"]).copy()
    if "tokens/generated" in steps and "completions" in steps:
        steps["tokens per completion"] = steps["tokens/generated"] / steps["completions"].replace(0, np.nan)
    written = []
    for task in style.tasks:
        frame, panel = steps[steps["task"] == task], style.panel(task)
        metrics = [(m, label) for m, label in DIAGNOSTICS if m in frame and frame[m].notna().any()]
        if frame.empty or not metrics:
            continue
        cols = min(3, len(metrics))
        rows = -(-len(metrics) // cols)
        fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
        for ax, (metric, label) in zip(axes.flat, metrics):
            part = frame[["variant", "seed", "samples", metric]].dropna()
            # Per-step metrics are noisy: a trailing mean over ~5% of each run, then the mean over seeds.
            part = part.assign(value=part.groupby(["variant", "seed"], sort=False)[metric].transform(
                lambda s: s.rolling(max(1, len(s) // 20), min_periods=1).mean()))
            _draw_lines(ax, part, "samples", "value", panel, band=False, width=0.7)  # jagged: thinner
            ax.set_title(f"{label} ({metric})" if label != metric else label, fontsize=9)
            ax.set_xlabel("generated completions")
            ax.set_ylabel("")
        for ax in list(axes.flat)[len(metrics):]:
            ax.set_visible(False)
        fig.tight_layout()
        panel.legend(fig, frame["variant"])
        name = f"diagnostics_{_slug(task)}.png"
        _save(fig, out / name, f"{task}: per-step diagnostics (mean over seeds, smoothed)")
        written.append((name, f"{task}: per-step diagnostics"))
    return written


# What the steps before a collapse show (the panels present in a cell's metrics, in this order).
COLLAPSE_PANELS = [("reward/mean", "training reward"), ("reward/std", "reward std (batch)"),
                   ("advantage/std", "advantage std"), ("kl/k3", "KL to reference (k3)"), ("entropy", "entropy"),
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
        # a metric that barely moves (an advantage std of 0.99999) in plain numbers, not an offset over the title
        ax.ticklabel_format(axis="y", useOffset=False)
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
    """The plots over all tasks, each where its data is: performance profiles, probability of improvement, and the
    IQM and mean interval estimates."""
    written = []
    profiles = analysis.get("profiles", pd.DataFrame())
    if not profiles.empty:
        written.append(_performance_profiles(profiles, style, out))
    poi = analysis.get("poi", pd.DataFrame())
    overall = poi[poi["task"] == "all tasks"] if not poi.empty else poi
    if not overall.empty:
        written.append(_probability_of_improvement(overall, style, out))
    table = analysis.get("overall", pd.DataFrame())
    if not table.empty:
        written.append(_interval_estimates(table, style, out))
    return written


def _performance_profiles(profiles: pd.DataFrame, style: _Style, out: Path) -> tuple[str, str]:
    """rliable's score distributions: the share of runs above each normalised final accuracy, with its band."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name in reversed(style.order(profiles["name"])):
        frame = profiles[profiles["name"] == name]
        ax.plot(frame["tau"], frame["fraction"], label=name, **style.line(name, len(frame)))
        alpha = style.band_alpha(name)
        if alpha:
            ax.fill_between(frame["tau"], frame["low"], frame["high"], color=style.look(name)["color"], alpha=alpha,
                            linewidth=0)
    ax.set_xlabel("normalised final accuracy tau (0: starting policy, 1: accuracy 1.0)")
    ax.set_ylabel("fraction of runs with score > tau")
    fig.tight_layout()
    style.legend(fig, profiles["name"])
    _save(fig, out / "performance_profile.png", "Performance profiles over all tasks and seeds (95% bootstrap band)")
    return "performance_profile.png", "performance profiles (normalised final accuracy)"


def _probability_of_improvement(overall: pd.DataFrame, style: _Style, out: Path) -> tuple[str, str]:
    """P(row > column) over all tasks as a heat map, each cell labelled with its value."""
    import matplotlib.pyplot as plt

    names = [v for v in style.variants if v in set(overall["x"])]
    grid = overall.pivot(index="x", columns="y", values="probability").reindex(index=names, columns=names)
    n = len(names)
    fig, ax = plt.subplots(figsize=(max(3.8, 1.6 + 0.55 * n), max(3.0, 0.9 + 0.45 * n)))
    image = ax.imshow(grid.to_numpy(float), vmin=0, vmax=1, cmap="RdBu")
    ax.grid(False)  # the theme's grid would cross the cells
    ax.set_xticks(range(n), names, rotation=45, ha="right", rotation_mode="anchor", fontsize=8)
    ax.set_yticks(range(n), names, fontsize=8)
    style.ticks(ax.get_xticklabels())
    style.ticks(ax.get_yticklabels())
    for i in range(n):
        for j in range(n):
            value = grid.iat[i, j]
            if i != j and np.isfinite(value):
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7 if n <= 8 else 6,
                        color="white" if abs(value - 0.5) > 0.3 else "black")
    fig.colorbar(image, ax=ax, label="P(row > column)", shrink=0.8)
    fig.tight_layout()
    _save(fig, out / "probability_of_improvement.png", "Probability of improvement, final accuracy, averaged over tasks")
    return "probability_of_improvement.png", "probability of improvement (row over column)"


def _interval_estimates(table: pd.DataFrame, style: _Style, out: Path) -> tuple[str, str]:
    """Normalised final accuracy and AUC over all tasks, side by side: IQM and mean with their intervals."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, max(2.4, 1.0 + 0.34 * len(table))), sharey=True)
    names = list(table["variant"])[::-1]
    y = np.arange(len(names))
    frame = table.set_index("variant").loc[names]
    for ax, prefix, title in zip(axes, ("final", "auc"), ("normalised final accuracy", "normalised AUC")):
        for offset, stat, marker, colour in ((0.15, "iqm", "o", COLOURS[0]), (-0.15, "mean", "s", COLOURS[1])):
            point, low, high = (frame[f"{prefix}_{stat}{s}"].to_numpy(float) for s in ("", "_low", "_high"))
            ax.errorbar(point, y + offset, xerr=[point - low, high - point], fmt=marker, markersize=4, capsize=2,
                        color=colour, label="IQM" if stat == "iqm" else "mean")
        ax.set_title(title, fontsize=10)
        ax.set_ylim(-0.6, len(names) - 0.4)
    axes[0].set_yticks(y, names, fontsize=8)
    style.ticks(axes[0].get_yticklabels())
    fig.tight_layout()
    # the legend beside the panels, where it covers no interval
    fig.legend(*axes[0].get_legend_handles_labels(), loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8,
               frameon=False)
    _save(fig, out / "interval_estimates.png", "All tasks: IQM and mean with 95% stratified-bootstrap intervals"
                                               + (f"; bold: {style.highlight_label}" if style.highlighted else ""))
    return "interval_estimates.png", "IQM and mean over all tasks with 95% bootstrap intervals"


def _gap_panel(ax, frame: pd.DataFrame, margin, title: str, colours: dict | None = None) -> None:
    """One task's panel of the verdict figure: each variant's gap interval, ranked by the primary metric, the
    could-be-best set in colour (``colours``' for a variant, else by its place in the set) and bold, 0 marked, the
    margin shaded where stated."""
    frame = frame.sort_values("primary_mean", ascending=False, kind="stable")
    rows = list(frame.itertuples(index=False))
    places = [v.variant for v in rows if v.in_best_set]
    for y, r in enumerate(rows):
        best = bool(r.in_best_set)
        colour = (colours or {}).get(r.variant, COLOURS[places.index(r.variant) % 9]) if best else GREYS[0]
        if pd.isna(r.gap_low) or pd.isna(r.gap_high):
            ax.text(0, y, f" {r.mark}", va="center", ha="left", fontsize=7, color=GREYS[2], style="italic")
            continue
        ax.plot([r.gap_low, r.gap_high], [y, y], color=colour, linewidth=3.2 if best else 1.6,
                solid_capstyle="butt", zorder=3 if best else 2)
        ax.plot([r.gap_low, r.gap_high], [y, y], linestyle="none", marker="|", markersize=9 if best else 6,
                color=colour, zorder=3 if best else 2)
    if margin:
        ax.axvspan(-margin, margin, color="#2ca02c", alpha=0.12, linewidth=0, zorder=0)
    ax.axvline(0, color="black", linewidth=0.9, zorder=1)
    ax.set_yticks(range(len(rows)), [r.variant for r in rows], fontsize=8)
    for label, r in zip(ax.get_yticklabels(), rows):
        if r.in_best_set:
            label.set_fontweight("bold")
        else:
            label.set_color(GREYS[2])
    ax.set_ylim(len(rows) - 0.5, -0.5)
    note = " (ranks nothing: saturated)" if bool(frame["saturated"].iloc[0]) else ""
    ax.set_title(f"{title}{note}", fontsize=10)
    ax.set_xlabel("gap to the best of the others (primary metric)")
    ax.grid(axis="y", visible=False)



def skills_figure(skills: list[dict], path: Path) -> None:
    """The front page's figure: one panel per skill (``skills``: {"task", "rows", "margin"}, ``rows`` the verdicts'
    rows of that skill's matrix: ``gap_low``, ``gap_high``, ``in_best_set``, ``primary_mean``, ``mark``,
    ``saturated``), each the verdict figure's panel (``_gap_panel``), side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    most = max(len(s["rows"]) for s in skills)
    # an algorithm keeps its colour in every panel
    order = list(dict.fromkeys(v for s in skills for v in s["rows"]["variant"]))
    colours = {v: COLOURS[i % 9] for i, v in enumerate(order)}
    fig, axes = plt.subplots(1, len(skills), figsize=(4.6 * len(skills), 0.3 * most + 1.4), squeeze=False)
    for ax, s in zip(axes.flat, skills):
        _gap_panel(ax, s["rows"], s["margin"], s["task"], colours)
    fig.tight_layout()
    margins = sorted({s["margin"] for s in skills if s["margin"]})
    band = f"; shaded: the margin of equivalence +-{'/'.join(f'{m:g}' for m in margins)}" if margins else ""
    path.parent.mkdir(parents=True, exist_ok=True)
    _save(fig, path, "Which algorithm on a real LM: each one's gap to the best of the others, simultaneous 95% "
                     f"intervals per skill (could be best: in colour, bold; worse: grey, below 0{band})")
