"""Reports a person can read: one seed prints "n/a (1 seed)", never a zero-width or
nan interval; the matrix header's numbers do not contradict one another; the plots' titles overlap nothing, 15
variants are told apart, bars are named on every panel, a set of variants can be highlighted. The plots are
drawn from hand-made frames (no training, no statistics), and read back from the matplotlib figures."""

import itertools
import math
import re

import numpy as np
import pandas as pd
import pytest

from benchmarks.markdown import lower_bound, plus_minus, with_interval

NAN = math.nan


# ------------------------------------------------------------------------------------------------
# Intervals over too few seeds
# ------------------------------------------------------------------------------------------------


def test_an_interval_that_cannot_be_had_reads_n_a_with_its_seed_count():
    assert with_interval(0.5, NAN, NAN) == "0.500 [n/a]"  # was "0.500 [nan, nan]"
    assert with_interval(-0.01, NAN, NAN, "{:+.3f}", seeds=1) == "-0.010 [n/a (1 seed)]"  # was "[+nan, +nan]"
    # a bootstrap over one seed is zero-width: not an interval to print
    assert with_interval(0.96, 0.96, 0.96, seeds=1) == "0.960 [n/a (1 seed)]"
    assert with_interval(0.5, 0.4, 0.6, seeds=3) == "0.500 [0.400, 0.600]"
    assert with_interval(NAN, NAN, NAN, seeds=1) == "-"
    assert plus_minus(0.5, NAN, seeds=1) == "0.500 ± n/a (1 seed)"  # was "0.500", which reads as exact
    assert plus_minus(0.5, NAN) == "0.500 ± n/a"
    assert plus_minus(0.5, 0.02, seeds=3) == "0.500 ± 0.020"
    assert plus_minus(NAN, NAN, seeds=1) == "-"


def test_a_bound_above_zero_never_reads_zero():
    # verdicts-tuned-v2's dapo: upper end of its gap's interval -0.00031 printed "worse (by >= 0.000)"
    assert lower_bound(0.00031) == "0.00031"
    assert lower_bound(0.0000412) == "4.1e-05"
    assert lower_bound(0.033) == "0.033" and lower_bound(0.651) == "0.651"
    assert lower_bound(0.0) == "0.000"


def test_the_summary_table_of_one_seed_says_n_a_and_never_nan():
    from benchmarks.report.matrix import SUMMARY_COLUMNS, summarize, summary_markdown

    rows = []
    for variant, seeds in (("single", [0]), ("three", [0, 1, 2])):
        for seed in seeds:
            rows.append({"task": "t", "variant": variant, "algo": variant, "seed": seed, "status": "complete",
                         "budget": 64, "steps_planned": 4, "completions_generated": 64.0,
                         **{c: 0.8 + 0.01 * seed for c, _, _, _ in SUMMARY_COLUMNS}})
    text = summary_markdown(summarize(pd.DataFrame(rows)))
    single = next(line for line in text.splitlines() if "| single |" in line)
    three = next(line for line in text.splitlines() if "| three |" in line)
    assert "| 0.800 ± n/a (1 seed) |" in single and "nan" not in text
    assert "n/a" not in three and "| 0.810 ± 0.025 |" in three


def test_a_variant_that_took_fewer_steps_than_planned_says_so():
    """DAPO's dynamic sampling generates more than a step's worth to fill its batch, so the budget's completions
    buy it fewer optimizer steps: the table gives the steps taken (mean over complete seeds) and the plan."""
    from benchmarks.report.matrix import SUMMARY_COLUMNS, summarize, summary_markdown

    rows = []
    for variant, taken in (("grpo", [40, 40]), ("dapo", [17, 18])):
        for seed, steps in enumerate(taken):
            rows.append({"task": "t", "variant": variant, "algo": variant, "seed": seed, "status": "complete",
                         "budget": 1280, "steps_planned": 40, "steps": steps, "completions_generated": 1280.0,
                         **{c: 0.5 for c, _, _, _ in SUMMARY_COLUMNS}})
    rows.append({**rows[-1], "seed": 2, "status": "failed", "steps": 3})  # a failed seed's steps are not averaged
    text = summary_markdown(summarize(pd.DataFrame(rows)))
    assert "| grpo | 2/2 | 40 = 1280 |" in text
    assert "| dapo | 2/3 (1 failed) | 17.5 of 40 planned = 1280 |" in text


# ------------------------------------------------------------------------------------------------
# The matrix header's time line
# ------------------------------------------------------------------------------------------------


def _parts_hold(line: str) -> None:
    """Every "X s, of which training Y s" has Y <= X."""
    pairs = re.findall(r"(\d+) s, of which training (\d+) s", line)
    assert all(int(part) <= int(whole) for whole, part in pairs), line


def test_sessions_that_ran_every_cell_twice_are_not_read_as_two_halves():
    """results/verdicts: two sessions of 260 cell runs each for 260 cells, the store not tagged by session."""
    from benchmarks.report.matrix import wall_clock_line

    sessions = [{"elapsed_s": 2322.8, "cells_run": 260, "jobs": 2}, {"elapsed_s": 2243.8, "cells_run": 260, "jobs": 2},
                {"elapsed_s": 32.8, "cells_run": 0, "jobs": None}]
    done = pd.DataFrame({"process_wall_clock_s": [17.2] * 260, "wall_clock_s": [15.3] * 260})
    line = wall_clock_line(sessions, done)
    assert ("2 session(s) ran cells: 2323 s (260 cell runs, 2 at a time), 2244 s (260 cell runs, 2 at a time), "
            "520 cell runs for these 260 cells: a cell run again") in line
    assert "4472 s, of which training 3978 s" in line
    _parts_hold(line)


def test_resumed_cells_and_a_stopped_session_are_counted_apart():
    """results/reasoning-gym/matrix: the header read "processes 35860 s, training 39564 s" (training longer
    than the processes it was part of) and left out a session whose only cell was stopped and resumed later."""
    from benchmarks.report.matrix import wall_clock_line

    sessions = [{"elapsed_s": 1000.0, "cells_run": 2, "jobs": 2}, {"elapsed_s": 2948.8, "cells_run": 1, "jobs": 2},
                {"elapsed_s": 3000.0, "cells_run": 2, "jobs": 2}]
    done = pd.DataFrame({"matrix_session": [0, 0, 2, 2], "process_wall_clock_s": [900.0, 800.0, 1058.4, 2379.9],
                         "wall_clock_s": [700.0, 600.0, 3378.9, 6090.5]})
    line = wall_clock_line(sessions, done)
    assert "Matrix wall-clock: 4000 s, the elapsed time of the 2 session(s) that ran the 4 complete cells shown" in line
    assert "1 more session(s) ran cells for 2949 s without finishing any of those shown" in line
    assert ("cell time summed over workers (not a wall-clock): 2 cell(s) took 1700 s, of which training 1300 s; "
            "2 resumed cell(s) trained 9469 s over every attempt, and their last attempts' processes took 3438 s") in line
    _parts_hold(line)


def test_a_tuning_stage_is_named_as_such():
    from benchmarks.report.matrix import wall_clock_line

    sessions = [{"elapsed_s": 900.0, "cells_run": 15, "jobs": 2, "stage": "tuning"},
                {"elapsed_s": 300.0, "cells_run": 2, "jobs": 2, "stage": "evaluation"}]
    done = pd.DataFrame({"matrix_session": [1, 1], "process_wall_clock_s": [100.0, 100.0], "wall_clock_s": [80.0, 80.0]})
    line = wall_clock_line(sessions, done)
    assert "the tuning stage took 900 s in 1 session(s) (15 tuning cell runs, not among the cells shown)" in line
    assert "more session" not in line
    # the tuning stage alone (no evaluation cell yet) leads the line: a sentence that starts with a capital
    assert wall_clock_line(sessions[:1], done.iloc[:0]) == ("The tuning stage took 900 s in 1 session(s) (15 tuning "
                                                            "cell runs, not among the cells shown).")


# ------------------------------------------------------------------------------------------------
# Plots
# ------------------------------------------------------------------------------------------------

MANY = ["reinforce", "ppo", "dpo", "grpo(level=token,mu=1)", "grpo(level=token,mu=2)", "grpo(level=sequence,mu=1)",
        "grpo(level=sequence,mu=2)", "gspo", "dr_grpo", "lite_ppo", "remax", "gmpo", "rloo", "reinforce_pp_baseline",
        "dapo"]


def _frames(variants: list[str], tasks: list[str], seeds: int = 2, collapse: bool = False):
    """What plots() reads: data (cells, evals, steps), curves and analysis, made by hand."""
    rng = np.random.default_rng(0)
    cells, curve_rows, second_rows, step_rows, eval_rows, per_cell = [], [], [], [], [], []
    for task, (i, variant), seed in itertools.product(tasks, enumerate(variants), range(seeds)):
        final = 0.3 + 0.6 * (i + 1) / len(variants) + 0.01 * seed
        cells.append({"task": task, "variant": variant, "algo": variant, "seed": seed, "status": "complete",
                      "accuracy_after": final, "peak_memory_bytes": 2**20 * (100 + i), "peak_memory_kind": "process_peak_rss",
                      "time_per_step_s": 0.01 * (i + 1)})
        for k, x in enumerate(range(0, 257, 64)):
            y = 0.2 + (final - 0.2) * k / 4
            curve_rows.append({"task": task, "variant": variant, "seed": seed, "completions": float(x), "accuracy": y})
            second_rows.append({"task": task, "variant": variant, "seed": seed, "seconds": x / 64.0, "accuracy": y})
            eval_rows.append({"task": task, "variant": variant, "seed": seed, "samples": float(x), "accuracy": y})
        for step in range(1, 17):
            step_rows.append({"task": task, "variant": variant, "algo": variant, "seed": seed, "step": step,
                              "samples": 16.0 * step, "completions": 16.0, "tokens/generated": 48.0,
                              "reward/mean": final * step / 16 + 0.02 * rng.standard_normal(), "time/wall": 0.1 * step,
                              "entropy": 1.0 - 0.02 * step, "advantage/std": 0.99999 - 1e-6 * (step % 3),
                              "kl": 0.01 * step})
        per_cell.append({"task": task, "variant": variant, "seed": seed, "accuracy_before": 0.2,
                         "peak_accuracy": final, "final_accuracy": final, "collapsed": False})
    if collapse:  # the first variant's seed 0 on the first task learned, then fell
        per_cell[0].update(peak_accuracy=0.8, final_accuracy=0.0, collapsed=True)
        for row in eval_rows:
            if (row["task"], row["variant"], row["seed"]) == (tasks[0], variants[0], 0):
                row["accuracy"] = {0.0: 0.2, 64.0: 0.8, 128.0: 0.8, 192.0: 0.1, 256.0: 0.0}[row["samples"]]
    taus = np.linspace(0, 1, 11)
    profiles = pd.DataFrame([{"name": v, "tau": t, "fraction": max(0.0, 1 - t * (1 + 0.05 * i)), "low": 0.0, "high": 1.0}
                             for i, v in enumerate(variants) for t in taus])
    poi = pd.DataFrame([{"task": "all tasks", "x": a, "y": b, "probability": 0.5 + 0.02 * (i - j)}
                        for (i, a), (j, b) in itertools.product(enumerate(variants), repeat=2) if a != b])
    overall = pd.DataFrame([{"variant": v, **{f"{m}_{s}{b}": 0.5 + 0.02 * i + d for m in ("final", "auc")
                                              for s in ("mean", "iqm") for b, d in (("", 0.0), ("_low", -0.05), ("_high", 0.05))},
                             "seeds": seeds} for i, v in enumerate(variants)])
    data = {"cells": pd.DataFrame(cells), "evals": pd.DataFrame(eval_rows), "steps": pd.DataFrame(step_rows)}
    curves = {"completions": pd.DataFrame(curve_rows), "seconds": pd.DataFrame(second_rows), "cells": pd.DataFrame(per_cell)}
    analysis = {"profiles": profiles, "poi": poi, "overall": overall}
    return data, curves, analysis


@pytest.fixture
def drawn(monkeypatch, tmp_path):
    """Run plots() and keep each figure it saves, by file name, instead of closing it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks.report import plots

    figures, names, kept = {}, [], []
    original, close = plots.save_figure, plt.close

    def write(figure, path, **options):
        names.append(path.name)
        return original(figure, path, **options)

    monkeypatch.setattr(plots, "save_figure", write)
    monkeypatch.setattr(plt, "close", lambda figure=None: (figures.__setitem__(names[-1], figure), kept.append(figure)))

    def draw(variants, tasks, **kwargs):
        while kept:
            close(kept.pop())
        figures.clear()
        names.clear()
        data, curves, analysis = _frames(variants, tasks, collapse=kwargs.pop("collapse", False))
        if "best_per_task" in kwargs:  # the verdicts' could-be-best set of each task, as the report reads it
            best = kwargs.pop("best_per_task")
            analysis["tasks"] = pd.DataFrame([{"task": task, "variant": v, "in_best_set": v in best[task]}
                                              for task in tasks for v in variants])
        if kwargs.pop("bars_only", False):
            plots._bars(data["cells"], plots._Style(data["cells"]), tmp_path / "bars")
        else:
            plots.plots(data, curves, analysis, tmp_path / f"plots{len(variants)}", **kwargs)
        return dict(figures)

    yield draw
    for figure in kept:
        close(figure)


def _legend(figure) -> dict:
    """label -> (colour, line style, marker, line width, bold) of the figure's legend entries."""
    from matplotlib.colors import to_hex

    legends = list(figure.legends) + [ax.get_legend() for ax in figure.axes if ax.get_legend() is not None]
    assert legends, "no legend"
    legend = legends[0]
    entries = {}
    for handle, text in zip(legend.legend_handles, legend.get_texts()):
        entries[text.get_text()] = (to_hex(handle.get_color()), str(handle.get_linestyle()), str(handle.get_marker()),
                                    handle.get_linewidth(), text.get_fontweight() in ("bold", 700))
    return entries


def test_no_title_overlaps_the_panels_or_legends(drawn):
    """interval_estimates.png with two variants drew its title over both panel titles and the legend."""
    for variants, tasks in ((["ppo", "ppo_skip_tied"], ["pizza"]), (MANY[:3], ["a", "b", "c", "d"])):
        figures = drawn(variants, tasks, collapse=True)
        assert {"interval_estimates.png", "accuracy_vs_completions.png", "final_accuracy.png",
                "probability_of_improvement.png", "collapse.png"} <= set(figures)
        for name, figure in figures.items():
            renderer = figure.canvas.get_renderer()
            title = figure._suptitle.get_window_extent(renderer)
            boxes = [ax.get_tightbbox(renderer) for ax in figure.axes if ax.get_visible()]
            boxes += [legend.get_window_extent(renderer) for legend in figure.legends]
            assert not any(title.overlaps(box) for box in boxes if box is not None), (len(variants), name)


def test_fifteen_variants_are_told_apart(drawn):
    """15 husl colours are as close as 0.08 in RGB apart; two variants drawn with the same line style and
    marker must differ plainly in colour."""
    from matplotlib.colors import to_rgb

    figures = drawn(MANY, ["addition"])
    for name in ("accuracy_vs_completions.png", "reward_vs_samples.png"):  # a panel each (small multiples)
        assert sorted(_panels_by_variant(figures[name])) == sorted(MANY), name
    for name in ("diagnostics_addition.png", "performance_profile.png"):
        looks = _legend(figures[name])
        assert set(looks) == set(MANY), name
        for (a, la), (b, lb) in itertools.combinations(looks.items(), 2):
            if la[1:3] == lb[1:3]:
                distance = np.linalg.norm(np.subtract(to_rgb(la[0]), to_rgb(lb[0])))
                assert distance > 0.25, (name, a, b, distance)


def test_bars_name_their_variants_on_every_panel(drawn):
    """With tasks on two rows of panels the bars had no names under them at all."""
    figures = drawn(MANY, ["a", "b", "c", "d"], bars_only=True)
    for name in ("final_accuracy.png", "peak_memory.png", "time_per_step.png"):
        panels = [ax for ax in figures[name].axes if ax.get_visible()]
        assert len(panels) == 4
        for ax in panels:
            assert [t.get_text() for t in ax.get_xticklabels()] == MANY, name


def test_highlighted_variants_are_bold_and_coloured_the_rest_thin_and_grey(drawn):
    from matplotlib.colors import to_rgb

    best = {"reinforce", "gmpo", "rloo"}
    figures = drawn(MANY, ["addition"], highlight=best, highlight_label="could be best")
    looks = _legend(figures["diagnostics_addition.png"])
    assert set(looks) == set(MANY) and list(looks)[:3] == ["reinforce", "gmpo", "rloo"]  # highlighted first
    spread = {v: np.ptp(to_rgb(look[0])) for v, look in looks.items()}  # 0 for a grey
    for v, (colour, _, _, width, bold) in looks.items():
        if v in best:
            assert bold and width >= 2 and spread[v] > 0.3, v
        else:
            assert not bold and width <= 1 and spread[v] < 0.05, v
    assert len({looks[v][0] for v in best}) == 3  # distinct colours among the highlighted
    lines = {line.get_label(): line for line in figures["diagnostics_addition.png"].axes[0].get_lines()}
    assert min(lines[v].get_zorder() for v in best) > max(lines[v].get_zorder() for v in set(MANY) - best)
    ticks = {t.get_text(): t.get_fontweight() for t in figures["final_accuracy.png"].axes[0].get_xticklabels()}
    assert {v for v, w in ticks.items() if w in ("bold", 700)} == best
    rows = {t.get_text(): t.get_fontweight() for t in figures["interval_estimates.png"].axes[0].get_yticklabels()}
    assert {v for v, w in rows.items() if w in ("bold", 700)} == best


def _panels_by_variant(figure) -> dict:
    """A small-multiples figure's panels by the variant each is drawn for (its title: "variant: last mean")."""
    return {ax.get_title().rsplit(": ", 1)[0]: ax for ax in figure.axes if ax.get_visible()}


def _own_and_others(ax, variant: str):
    """The panel's own curve (labelled with its variant) and the others' (labelled "_name": not in a legend)."""
    (own,) = [line for line in ax.get_lines() if line.get_label() == variant]
    return own, [line for line in ax.get_lines() if line.get_label() != variant]


def test_past_six_variants_each_has_a_panel_coloured_if_it_could_be_best_and_grey_if_not(drawn):
    """verdicts-tuned-v2's 15 learning curves (10 could be best) crossed within 0.05 of one another in one panel."""
    best = {"reinforce", "gmpo", "rloo", "dapo"}
    figures = drawn(MANY, ["addition"], highlight=best, highlight_label="could be best")
    for name in ("accuracy_vs_completions.png", "accuracy_vs_seconds.png", "reward_vs_samples.png"):
        _one_panel_each(figures[name], best)


def _one_panel_each(figure, best: set[str]) -> None:
    from matplotlib.colors import to_rgb

    panels = _panels_by_variant(figure)
    assert list(panels)[:4] == ["reinforce", "gmpo", "rloo", "dapo"] and sorted(panels) == sorted(MANY)
    own_colours = {}
    for variant, ax in panels.items():
        own, others = _own_and_others(ax, variant)
        assert sorted(line.get_label() for line in others) == sorted(f"_{v}" for v in MANY if v != variant)
        assert {to_rgb(line.get_color()) for line in others} == {to_rgb(plots_module().CONTEXT_GREY)}
        assert own.get_zorder() > max(line.get_zorder() for line in others)
        colour = to_rgb(own.get_color())
        own_colours[variant] = colour
        bold = ax.title.get_fontweight() in ("bold", 700)
        if variant in best:
            assert np.ptp(colour) > 0.3 and bold, variant  # a colour, and the name in bold
        else:  # a grey darker than the others' behind it
            assert np.ptp(colour) < 0.05 and sum(colour) < sum(to_rgb(plots_module().CONTEXT_GREY)) and not bold, variant
    assert len({own_colours[v] for v in best}) == 4  # told apart from one another
    assert "could be best: in colour" in " ".join(figure._suptitle.get_text().split())


def test_small_multiples_of_several_tasks_colour_each_tasks_own_best(drawn):
    from matplotlib.colors import to_rgb

    variants = MANY[:8]
    best = {"a": {"reinforce", "ppo"}, "b": {"dpo"}}
    figure = drawn(variants, ["a", "b"], highlight=set().union(*best.values()), best_per_task=best)[
        "accuracy_vs_completions.png"]
    panels = [ax for ax in figure.axes if ax.get_visible()]
    assert len(panels) == 16
    for task, block in zip(("a", "b"), (panels[:8], panels[8:])):
        coloured = set()
        for ax in block:
            variant = ax.get_title().rsplit(": ", 1)[0]
            own, _ = _own_and_others(ax, variant)
            if np.ptp(to_rgb(own.get_color())) > 0.3:
                coloured.add(variant)
        assert coloured == best[task], task
        assert block[0].get_ylabel().startswith(f"{task}\n")  # each block names its task


def test_six_variants_or_fewer_share_one_panel_per_task(drawn):
    figure = drawn(MANY[:6], ["addition"], highlight={"ppo"})["accuracy_vs_completions.png"]
    (ax,) = [ax for ax in figure.axes if ax.get_visible()]
    assert {line.get_label() for line in ax.get_lines()} == set(MANY[:6])


def plots_module():
    from benchmarks.report import plots

    return plots


def test_a_metric_that_barely_moves_is_labelled_without_an_offset(drawn):
    """An advantage std of 0.99999 got the axis offset "1e-5+9.999e-1", drawn over the panel's title."""
    figures = drawn(["ppo", "ppo_skip_tied"], ["bandit"], collapse=True)
    figure = figures["collapse.png"]
    figure.canvas.draw()
    assert all(ax.yaxis.get_offset_text().get_text() == "" for ax in figure.axes if ax.get_visible())


# ------------------------------------------------------------------------------------------------
# How a plot is stored
# ------------------------------------------------------------------------------------------------


def test_a_plot_is_stored_in_a_palette_close_to_its_full_colour_render_and_smaller(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    from benchmarks.io import PNG_COLOURS, save_figure

    figure, ax = plt.subplots(figsize=(6, 4))
    x = np.linspace(0, 1, 200)
    for k in range(12):  # more colours than tab10, anti-aliased lines and text: thousands of shades in full colour
        ax.plot(x, np.sin(6 * x + k) * (1 + 0.1 * k), label=f"variant {k}")
    ax.fill_between(x, -0.5, 0.5, alpha=0.2)
    ax.legend(fontsize=6)
    full = tmp_path / "full.png"
    figure.savefig(full, dpi=90, format="png")
    save_figure(figure, tmp_path / "plot.png", dpi=90)
    plt.close(figure)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full.png", "plot.png"]  # no temporary file left behind
    with Image.open(full) as image:
        reference = np.asarray(image.convert("RGB")).astype(int)
        shades = len(np.unique(reference.reshape(-1, 3), axis=0))
    with Image.open(tmp_path / "plot.png") as image:
        assert image.mode == "P" and len(image.getcolors(maxcolors=4096)) <= PNG_COLOURS < shades
        stored = np.asarray(image.convert("RGB")).astype(int)
    assert stored.shape == reference.shape
    difference = np.abs(stored - reference)
    assert difference.mean() < 0.5 and difference.max() <= 64 and (difference.sum(-1) > 30).mean() < 0.01
    assert (tmp_path / "plot.png").stat().st_size < 0.6 * full.stat().st_size


def test_a_curve_is_drawn_at_the_completion_counts_it_was_measured_at(monkeypatch, tmp_path):
    """A DPO run draws its samples up front, so its evaluations all sit at the budget; its curve over the completion
    grid is interpolated between the start and the budget, and was drawn with markers at 64, 128 and 192 as if
    measured there. Only measured grid points are drawn; a run measured everywhere keeps every point."""
    import matplotlib

    matplotlib.use("Agg")
    from benchmarks.report import plots

    data, curves, analysis = _frames(["grpo", "dpo"], ["chain_sum"])
    frame = curves["completions"]
    frame["measured"] = ~((frame["variant"] == "dpo") & frame["completions"].between(1, 255))
    drawn = {}

    def keep(frame, x, y, style, path, *args, **kwargs):
        drawn.setdefault(path.name, frame)

    monkeypatch.setattr(plots, "_curve_plot", keep)
    plots.plots(data, curves, analysis, tmp_path / "plots")
    at = drawn["accuracy_vs_completions.png"].groupby("variant")["completions"].unique()
    assert sorted(at["dpo"]) == [0.0, 256.0]
    assert sorted(at["grpo"]) == [0.0, 64.0, 128.0, 192.0, 256.0]


def test_a_lower_bound_is_rounded_toward_zero():
    # a bound a reader quotes must never overstate: 0.0055 is at least 0.005, not 0.006
    assert lower_bound(0.0055) == "0.005" and lower_bound(0.0129) == "0.012"
    assert lower_bound(0.006) == "0.006"  # a float just under 0.006 in binary is still read as 0.006
    assert lower_bound(0.000459) == "0.00045" and lower_bound(0.00096) == "0.00096"  # never "0.000"
