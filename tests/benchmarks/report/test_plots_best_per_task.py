""""bold: could be best" is a verdict per task: in each task's panel only that task's best set is bold (the union over
tasks made every name bold in every panel)."""

import pandas as pd
import pytest

from tests.benchmarks.report.test_plots import _frames

VARIANTS = ["a", "b", "c"]
BEST = {"pizza": {"a"}, "bandit": {"b"}}


@pytest.fixture
def figures(monkeypatch, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks.report import plots

    kept, names = {}, []
    monkeypatch.setattr(plots, "save_figure", lambda figure, path, **kw: names.append(path.name))
    monkeypatch.setattr(plt, "close", lambda figure=None: kept.__setitem__(names[-1], figure))
    data, curves, analysis = _frames(VARIANTS, list(BEST))
    analysis["tasks"] = pd.DataFrame([{"task": t, "variant": v, "in_best_set": v in BEST[t]}
                                      for t in BEST for v in VARIANTS])
    # as the report calls it: the union of the tasks' best sets
    plots.plots(data, curves, analysis, tmp_path, highlight={"a", "b"}, highlight_label="could be best")
    yield kept
    for figure in kept.values():
        plt.close(figure)


def _bold(labels) -> set[str]:
    return {t.get_text() for t in labels if t.get_fontweight() in ("bold", 700)}


def test_each_bar_panel_bolds_its_own_tasks_best_set(figures):
    panels = {ax.get_title(): ax for ax in figures["final_accuracy.png"].axes if ax.get_visible()}
    assert {task: _bold(ax.get_xticklabels()) for task, ax in panels.items()} == BEST


def test_each_curve_panel_draws_its_own_tasks_best_set_thick(figures):
    panels = {ax.get_title(): ax for ax in figures["accuracy_vs_completions.png"].axes if ax.get_visible()}
    for task, ax in panels.items():
        thick = {line.get_label() for line in ax.get_lines() if line.get_linewidth() >= 2}
        assert thick == BEST[task], task


def test_a_tasks_diagnostics_legend_bolds_that_tasks_best_set(figures):
    for task, best in BEST.items():
        legend = figures[f"diagnostics_{task}.png"].legends[0]
        assert _bold(legend.get_texts()) == best, task
