"""The report's HTML page: opened in headless Chromium (the verdict table's rows in the DOM, the figures' SVG, no
console errors, a screenshot), the verdict figure (the could-be-best set in colour, the rest grey, 0 and the
margin marked), the markdown it converts, the index of matrix folders, and the report's progress lines."""

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest

from benchmarks.report import html, plots
from benchmarks.report.matrix import report
from benchmarks.store import ResultStore
from tests.benchmarks.report.test_matrix import VARIANTS, _curves, _write_cell

MARGIN = 0.05


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """One task, three variants, three seeds each, a stated margin: reported (plots included), its progress lines."""
    out = tmp_path_factory.mktemp("html") / "m"
    cells = [_write_cell(out, "hard", variant, seed, cps, _curves("hard", variant, seed), seconds, {"entropy": 1.0})
             for variant, cps, seconds in VARIANTS for seed in range(3)]
    analysis = {"primary": "final", "margin": MARGIN, "target_mdd": None, "stated_at": "2026-01-01T00:00:00"}
    (out / "matrix.json").write_text(json.dumps({"name": "tiny", "description": "a <b>tiny</b> matrix",
                                                 "cells": cells, "sessions": [], "analysis": analysis}))
    store = ResultStore.open(out)
    for cell in cells:
        folder = out / cell["dir"]
        store.put(cell["dir"], {k: v for k, v in cell.items() if k != "dir"},
                  json.loads((folder / "summary.json").read_text()),
                  [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()])
        shutil.rmtree(folder)
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        data = report(out)
    return out, data, said.getvalue()


def _chromium() -> str:
    """Debian's chromium; installed with apt-get where it is missing and that can, else the test skips."""
    for name in ("chromium", "chromium-browser"):
        if shutil.which(name):
            return shutil.which(name)
    if shutil.which("apt-get") and os.geteuid() == 0:
        try:
            subprocess.run(["apt-get", "install", "-y", "chromium"], capture_output=True, timeout=600, check=True)
        except (subprocess.SubprocessError, OSError) as exc:
            pytest.skip(f"no chromium, and apt-get install -y chromium failed: {type(exc).__name__}")
        if shutil.which("chromium"):
            return shutil.which("chromium")
    pytest.skip("no chromium on this machine, and apt-get cannot install it here (not root, or no apt-get)")


def _browse(browser: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([browser, "--headless", "--disable-gpu", "--no-sandbox", "--enable-logging=stderr",
                           "--v=0", *args], capture_output=True, text=True, timeout=60)


def _console_errors(log: str) -> list[str]:
    return [line for line in log.splitlines() if "Uncaught" in line or "ERROR:CONSOLE" in line]


def test_the_page_opens_in_headless_chromium_with_its_table_and_figures(page, tmp_path):
    out, data, _ = page
    index = out / "index.html"
    assert str(index) in data["written"]
    browser = _chromium()
    dumped = _browse(browser, "--dump-dom", index.as_uri())
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    dom = dumped.stdout
    tasks = data["analysis"]["tasks"]
    # every variant's row, marked as the verdict marks it: fast and steady could be best, slow is worse
    for r in tasks.itertuples():
        kind = "best" if r.in_best_set else "other"
        assert f'<tr class="{kind}" data-variant="{r.variant}">' in dom
    assert tasks.set_index("variant")["in_best_set"].to_dict() == {"fast": True, "steady": True, "slow": False}
    figure = dom[dom.index('id="verdict-figure"'):dom.index('id="curves"')]
    assert "<svg" in figure and ">slow<" in figure and ">fast<" in figure  # text kept as text
    curves = dom[dom.index('id="curves"'):dom.index('id="cost"')]
    assert "<svg" in curves
    # nothing to fetch or to run: no script, no stylesheet or image from elsewhere
    assert not re.search(r"<script|<link|<img|(src|href)=\"https?:|url\((?!#)", dom)
    assert "a &lt;b&gt;tiny&lt;/b&gt; matrix" in dom  # the matrix's own text is escaped, not markup
    assert _console_errors(dumped.stderr) == []
    shot = tmp_path / "page.png"
    taken = _browse(browser, f"--screenshot={shot}", "--window-size=1280,2400", index.as_uri())
    assert taken.returncode == 0 and shot.stat().st_size > 20_000, taken.stderr[-2000:]
    assert _console_errors(taken.stderr) == []
    broken = tmp_path / "broken.html"  # the console check catches a script's error where there is one
    broken.write_text("<!DOCTYPE html><html><body><script>undefined_function();</script></body></html>")
    assert _console_errors(_browse(browser, "--dump-dom", broken.as_uri()).stderr)


def test_the_report_says_each_step_as_it_starts(page):
    _, _, err = page
    steps = [re.sub(r" \(\d+\.\d s\)$", "", line.split(": ", 1)[1]) for line in err.splitlines()]
    assert steps == ["reading the result store", "9 cells read; learning curves and verdicts", "plots",
                     "README.md and index.html", "done"]


def test_the_page_shows_the_verdicts_cost_and_flags_and_folds_the_rest(page):
    out, data, _ = page
    text = (out / "index.html").read_text()
    assert 'class="verdicts" data-task="hard"' in text
    worse = data["analysis"]["tasks"].set_index("variant").loc["slow", "worse_by"]
    assert f"worse by &ge; {worse:.3f}" in text
    assert '<table class="cost">' in text and "<td>hard</td><td>steady</td>" in text
    assert '<section id="flags"><h4>Flags</h4>' in text
    assert '<details id="details">' in text and "<h4>Every measured number</h4>" in text
    assert 'href="plots/verdicts.png"' in text and 'href="tables/verdicts.csv"' in text
    assert (out / "plots" / "verdicts.png").stat().st_size > 1000


def _figure(monkeypatch, tasks: pd.DataFrame, margin):
    """The verdict figure's matplotlib figure, kept open instead of written."""
    matplotlib.use("Agg")
    kept = {}
    monkeypatch.setattr(plots, "_save", lambda fig, path, title, svg=None: kept.update(fig=fig, title=title))
    style = plots._Style(tasks[["task", "variant"]])
    written = plots._verdict_figure({"tasks": tasks, "spec": {"margin": margin}}, style, Path("unused"))
    assert written == [("verdicts.png", "verdicts: each variant's gap to the best of the others, simultaneous 95% "
                                        "intervals")]
    return kept


def test_with_15_variants_the_could_be_best_set_is_in_colour_and_the_rest_grey(monkeypatch):
    variants = [f"v{i:02d}" for i in range(15)]
    means = np.linspace(0.9, 0.2, 15)
    best = {"v00", "v01"}
    tasks = pd.DataFrame({"task": "t", "variant": variants, "primary_mean": means,
                          "gap_low": [-0.02, -0.05] + [-0.9 + 0.05 * i for i in range(12)] + [np.nan],
                          "gap_high": [0.05, 0.02] + [-0.6 + 0.05 * i for i in range(12)] + [np.nan],
                          "in_best_set": [v in best for v in variants],
                          "mark": ["not resolved"] * 2 + ["worse"] * 12 + ["too few seeds"], "saturated": False})
    kept = _figure(monkeypatch, tasks, MARGIN)
    ax = kept["fig"].axes[0]
    colours = {}
    for line in ax.lines:
        ys = set(np.asarray(line.get_ydata(), float))
        if len(ys) == 1 and len(line.get_xdata()) == 2 and line.get_linestyle() == "-":
            colours[variants[int(ys.pop())]] = matplotlib.colors.to_hex(line.get_color())
    assert colours["v00"] == plots.COLOURS[0] and colours["v01"] == plots.COLOURS[1]
    assert {colours[v] for v in variants[2:14]} == {plots.GREYS[0]}
    assert "v14" not in colours  # no interval to draw: named with its mark instead
    assert [t.get_text() for t in ax.texts] == [" too few seeds"]
    assert [label.get_text() for label in ax.get_yticklabels()] == variants  # ranked, best on top
    assert [label.get_fontweight() for label in ax.get_yticklabels()][:3] == ["bold", "bold", "normal"]
    zero = [line for line in ax.lines if list(line.get_xdata()) == [0, 0]]
    assert len(zero) == 1
    (band,) = ax.patches
    x0, x1 = band.get_window_extent().x0, band.get_window_extent().x1
    assert np.allclose(ax.transData.inverted().transform([(x0, 0), (x1, 0)])[:, 0], [-MARGIN, MARGIN])
    assert f"+-{MARGIN:g}" in kept["title"]
    kept_none = _figure(monkeypatch, tasks, None)
    assert not kept_none["fig"].axes[0].patches and "margin" not in kept_none["title"]


def test_markdown_becomes_escaped_html():
    md = ("#### Flags\n\nOne `a<b>` and **bold** and *em*, see [the table](tables/x.csv).\nSame paragraph.\n\n"
          "- first\n  continued\n- second\n\n| a | b \\| c |\n|---|---|\n| 1 | <2> |\n")
    assert html.markdown_html(md) == (
        "<h4>Flags</h4>\n<p>One <code>a&lt;b&gt;</code> and <strong>bold</strong> and <em>em</em>, see "
        '<a href="tables/x.csv">the table</a>. Same paragraph.</p>\n<ul><li>first continued</li><li>second</li></ul>\n'
        "<table><thead><tr><th>a</th><th>b | c</th></tr></thead><tbody><tr><td>1</td><td>&lt;2&gt;</td></tr>"
        "</tbody></table>")


def test_the_index_lists_every_matrix_folder_with_its_headline_and_link(page, tmp_path):
    out, data, _ = page
    root = tmp_path / "results"
    shutil.copytree(out, root / "a" / "tiny")
    other = root / "b"
    other.mkdir(parents=True)
    (other / "matrix.json").write_text("{}")
    (other / "README.md").write_text("# grpo-bench results\n\n### Matrix `b`: still running\n")
    lines = html.write_index(root)
    assert lines == [f"{root / 'index.html'}: 2 matrix folders"]
    text = (root / "index.html").read_text()
    first = next(s for s in data["analysis"]["sentences"] if not s.startswith("Primary metric"))
    assert html.headline(root / "a" / "tiny") == ("Matrix `tiny`: a <b>tiny</b> matrix", first)
    assert '<a href="a/tiny/index.html">a/tiny</a>' in text and html.inline(first) in text
    assert '<a href="b/README.md">b</a></td><td>Matrix <code>b</code>: still running</td><td>no verdicts yet' in text


def test_the_page_rounds_a_worse_by_bound_toward_zero_as_the_markdown_does():
    """An "at least" bound a reader quotes never overstates: 0.0199 reads 0.019 on the page, as in the README."""
    import pandas as pd

    from benchmarks.report.html import verdict_table

    rows = pd.DataFrame([
        {"task": "t", "variant": "a", "seeds": 8, "primary_mean": 0.5, "gap_low": -0.01, "gap_high": 0.03,
         "mark": "not resolved", "worse_by": float("nan"), "in_best_set": True, "p_best": 1.0, "saturated": False},
        {"task": "t", "variant": "b", "seeds": 8, "primary_mean": 0.4, "gap_low": -0.05, "gap_high": -0.0199,
         "mark": "worse", "worse_by": 0.0199, "in_best_set": False, "p_best": 0.0, "saturated": False},
    ])
    text = verdict_table(rows)
    assert "worse by &ge; 0.019<" in text and "worse by &ge; 0.020" not in text
