"""grpo-bench brief: the front page's real-LM verdict across skills. Each made-up skill is analysed by the real
verdict procedure (benchmarks/report/verdicts.py's ``analyse``) from cells whose primary metric is set seed by seed,
so the marks, P(best) and MDD the brief shows are the procedure's; the brief must carry them, the tuned settings and
the costs without change, and compare the rankings across skills and against a toy with transfer's numbers."""

import math

import numpy as np
import pandas as pd
import pytest

from benchmarks.report import brief as brief_module
from benchmarks.report import verdicts
from benchmarks.report.brief import brief, render
from benchmarks.commands import algorithm_settings

STATED = {"primary": "last_3", "margin": 0.03, "target_mdd": 0.05, "stated_at": "2026-11-27T10:00:00+00:00"}


@pytest.fixture(scope="module")
def settings():
    return algorithm_settings()


def _skill(task, means, *, sd=0.002, seeds=6, seed=0, tuned=None, seconds=None):
    """A verdict matrix of one task as ``read_matrix`` gives it: each variant's cells at ``means`` plus seed noise
    ``sd`` (seed effects shared by every variant, as blocked cells), each variant's training seconds (``seconds``,
    default 100 x its position) and, for the variants in ``tuned`` ({variant: (chosen index, [grid points])}),
    a tuning table."""
    rng = np.random.default_rng(seed)
    block = 0.01 * rng.standard_normal(seeds)
    per_cell, cells, planned = [], [], []
    for i, (variant, mean) in enumerate(means.items()):
        for s in range(seeds):
            value = mean + block[s] + sd * rng.standard_normal()
            per_cell.append({"task": task, "variant": variant, "seed": s, "primary": value, "final_accuracy": value,
                             "auc": value, "accuracy_before": 0.1, "collapsed": False, "never_learned": False,
                             "completions_to_threshold": 100.0, "budget": 1280.0})
            cells.append({"task": task, "variant": variant, "seed": s, "status": "complete", "precision": "bf16",
                          "wall_clock_s": (seconds or {}).get(variant, 100.0 * (i + 1)),
                          "training_cpu_s": 90.0 * (i + 1) if i % 2 else math.nan,  # b and d recorded it
                          "steps": 17 + s % 2 if variant == "c" else 40, "steps_planned": 40,  # c: DAPO's refills
                          "peak_memory_bytes": (1000 + i) * 2.0**20})
            planned.append({"variant": variant, "seed": s, "algo": "grpo",
                            "settings": {"learning_rate": 1e-4, "group_size": 8}})
    table = [{"task": task, "variant": v, "chosen": chosen,
              "points": [{"point": p, "settings": {"learning_rate": float(p.split(",")[0].split("=")[1])}, "seeds": 2,
                          "final_accuracy": 0.5, "auc": 0.5, "primary": 0.5, "failed": 0} for p in points]}
             for v, (chosen, points) in (tuned or {}).items()]
    meta = {"analysis": STATED, "cells": planned, "tuning": {"table": table, "cells": []}}
    curves = {"cells": pd.DataFrame(per_cell), "thresholds": {task: 0.5}}
    cells = pd.DataFrame(cells)
    return {"meta": meta, "cells": cells, "curves": curves,
            "analysis": verdicts.analyse(cells, curves, reps=200, meta=meta, scaling=False)}


def _read(monkeypatch, matrices):
    monkeypatch.setattr(brief_module, "read_matrix", lambda d, reps=None: matrices[d.name])


SEPARATED = {"a": 0.60, "b": 0.50, "c": 0.40, "d": 0.30, "e": 0.20}


def test_each_skill_carries_the_procedures_marks_power_tuning_and_costs(tmp_path, monkeypatch, settings):
    grid = ["learning_rate=3e-06,beta=0.1", "learning_rate=3e-06,beta=0.3", "learning_rate=1e-05,beta=0.1"]
    skill = _skill("chain_sum", SEPARATED, tuned={"a": (1, ["learning_rate=1e-05", "learning_rate=3e-05"]),
                                                  "b": (0, grid)}, seconds={"a": 425.4, "b": 1900.0})
    _read(monkeypatch, {"cs": skill})
    result = brief([tmp_path / "cs"], settings)
    rows = result["skills"][0]["rows"].set_index("variant")
    marks = skill["analysis"]["tasks"].set_index("variant")
    assert list(rows.index) == ["a", "b", "c", "d", "e"]  # ranked by the primary metric
    for v in rows.index:
        assert rows.loc[v, "mark"] == marks.loc[v, "mark"] and rows.loc[v, "p_best"] == marks.loc[v, "p_best"]
        assert rows.loc[v, "mean"] == pytest.approx(marks.loc[v, "primary_mean"])
    assert rows.loc["a", "mark"] == "best" and (rows.loc[["b", "c", "d", "e"], "mark"] == "worse").all()
    assert rows.loc["a", "tuned"] == "lr 3e-05 (grid edge)"  # the larger of two rates chosen
    assert rows.loc["b", "tuned"] == "lr 3e-06, beta 0.1 (grid edge)"
    assert rows.loc["c", "tuned"] == "lr 0.0001, untuned"
    assert rows.loc["a", "train_s"] == pytest.approx(425.4) and rows.loc["b", "peak_mib"] == pytest.approx(1001)
    text = render(result, tmp_path)
    power = skill["analysis"]["power"].iloc[0]
    assert f"MDD {power['mdd']:.3f} at 6 seeds a variant" in text
    assert "On `chain_sum`, `a` is best: above every other variant by at least" in text
    assert "mean accuracy of the last 3 evaluations, margin +-0.03, stated before its cells ran (2026-11-27)" in text
    assert "| `a` | " in text and "**best** by >= " in text and "| 425 s, 1000 |" in text  # no CPU seconds: none shown
    assert "| 1900 s (180 CPU), 1001 |" in text
    assert "| 300 s in 17.5 of 40 steps, 1002 |" in text  # fewer steps than planned: said; as planned: not
    table = verdicts.render(skill["analysis"])  # the verdict table shows them too, where recorded
    assert "| 1900.0 (180 CPU) | 1001 |" in table and "| 425.4 | 1000 |" in table
    assert f"[{tmp_path / 'cs'}](cs/README.md)" in text  # the folder as given, linked from the page's folder


def test_an_mdd_above_the_target_says_how_many_seeds_the_target_needs(tmp_path, monkeypatch, settings):
    close = _skill("chain_sum", {"a": 0.50, "b": 0.49, "c": 0.48}, sd=0.05, seeds=3)
    _read(monkeypatch, {"cs": close})
    text = render(brief([tmp_path / "cs"], settings), tmp_path)
    power = close["analysis"]["power"].iloc[0]
    assert power["mdd"] > 0.05
    assert f"MDD {power['mdd']:.3f} at 3 seeds a variant; the stated target 0.05 needs {int(power['seeds_for_target'])} seeds" in text


def test_rankings_across_skills_agree_only_when_they_do(tmp_path, monkeypatch, settings):
    reversed_ = dict(zip(SEPARATED, reversed(list(SEPARATED.values()))))
    _read(monkeypatch, {"cs": _skill("chain_sum", SEPARATED), "lc": _skill("letter_counting", SEPARATED, seed=1),
                        "rev": _skill("letter_counting", reversed_, seed=2)})
    same = brief([tmp_path / "cs", tmp_path / "lc"], settings)
    entry = same["across"][0]
    # 5 untied algorithms in one order: tau +1, exact two-sided p 2/120; every resample keeps the order
    assert entry["ranking"]["tau"] == pytest.approx(1.0) and entry["ranking"]["p_value"] == pytest.approx(2 / 120)
    assert (entry["ranking"]["tau_low"], entry["ranking"]["tau_high"]) == pytest.approx((1.0, 1.0))
    assert entry["best_on_both"] == ["a"]
    assert ("the rankings of the 5 algorithms both ran agree: Kendall's tau-b +1.00 [+1.00, +1.00 over the seeds] "
            "(p 0.02; with 5 algorithms only tau >= 1.00 reaches p < 0.05); could be best on both: `a`.") in render(same, tmp_path)
    flipped = brief([tmp_path / "cs", tmp_path / "rev"], settings)
    assert flipped["across"][0]["ranking"]["tau"] == pytest.approx(-1.0) and flipped["across"][0]["best_on_both"] == []
    assert "both ran are not shown to agree: Kendall's tau-b -1.00" in render(flipped, tmp_path)


def test_the_toy_is_compared_with_each_skill_on_the_pairs_it_holds(tmp_path, monkeypatch, settings):
    toy = _skill("addition", {"toy_a": 0.9, "toy_b": 0.8, "toy_c": 0.7, "toy_d": 0.6})
    cs = _skill("chain_sum", {"a": 0.6, "b": 0.5, "c": 0.4, "d": 0.3})
    lc = _skill("letter_counting", {"a": 0.6, "b": 0.5, "x": 0.4})
    _read(monkeypatch, {"toy": toy, "cs": cs, "lc": lc})
    pairs = [("toy_a", "a"), ("toy_b", "b"), ("toy_c", "c"), ("toy_d", "d")]
    result = brief([tmp_path / "cs", tmp_path / "lc"], settings, toy=tmp_path / "toy", pairs=pairs)
    on_cs, on_lc = result["toys"]
    assert on_cs["ranking"]["tau"] == pytest.approx(1.0) and on_cs["ranking"]["n"] == 4
    assert on_cs["ranking"]["like_for_like"] == 4
    assert on_lc["n"] == 2 and on_lc["ranking"] is None
    assert result["across"][0]["n"] == 2 and result["across"][0]["ranking"] is None
    text = render(result, tmp_path)
    # one order, but 4 algorithms cannot reach p < 0.05 (exact p 2/24): not shown to agree
    assert ("against `chain_sum`, the rankings are not shown to agree: Kendall's tau-b +1.00 [+1.00, +1.00 over the "
            "seeds] (p 0.08; with 4 algorithms no ranking reaches p < 0.05), 4 of 4 pairings like for like") in text
    assert "against `letter_counting`, 2 paired algorithms, fewer than 3: no ranking to compare" in text
    assert "- **Across `chain_sum` and `letter_counting`:** 2 algorithms in common, fewer than 3" in text
    assert "| `x` | - | - | - | - | 0.4" in text  # a variant one skill lacks: dashes there


def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, run_cli):
    for name in ("cs", "lc", "toy"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "matrix.json").write_text("{}")
    _read(monkeypatch, {"cs": _skill("chain_sum", SEPARATED), "lc": _skill("chain_sum", SEPARATED, seed=1),
                        "toy": _skill("addition", {"t": 0.9, "u": 0.8, "w": 0.7})})
    out = tmp_path / "brief.md"
    cases = [
        (("brief", tmp_path / "cs", "--out", out, "--pair", "t", "a"), "--pair needs --toy"),
        (("brief", tmp_path / "cs", "--out", out, "--toy", tmp_path / "toy"), "--toy needs --pair"),
        (("brief", tmp_path / "cs", tmp_path / "cs", "--out", out), "a directory is given twice"),
        (("brief", tmp_path / "nothing", "--out", out), "no such folder"),
        (("brief", tmp_path / "cs", tmp_path / "lc", "--out", out), "rank a different task"),
        (("brief", tmp_path / "cs", "--out", out, "--toy", tmp_path / "toy", "--pair", "nope", "a", "--pair", "u", "b",
          "--pair", "w", "c"), "has no finished cells of nope"),
        (("brief", tmp_path / "cs", "--out", out, "--toy", tmp_path / "toy", "--pair", "t", "a", "--pair", "t", "b"),
         "each variant at most once on each side"),
    ]
    for args, message in cases:
        code, stdout, stderr = run_cli(*args)
        assert code == 2 and message in stderr and len(stderr.strip().splitlines()) == 1, (args, stderr)
    assert not out.exists()


def test_the_readme_section_is_written_with_links_from_the_readme(tmp_path, monkeypatch, run_cli):
    (tmp_path / "results" / "cs").mkdir(parents=True)
    (tmp_path / "results" / "cs" / "matrix.json").write_text("{}")
    _read(monkeypatch, {"cs": _skill("chain_sum", SEPARATED)})
    readme = tmp_path / "README.md"
    readme.write_text("# front\n\n<!-- grpo-bench:real-lm -->\nold\n<!-- /grpo-bench:real-lm -->\n\nafter\n")
    code, stdout, _ = run_cli("brief", tmp_path / "results" / "cs", "--out", tmp_path / "results" / "brief.md",
                              "--readme", readme, "--section", "real-lm")
    assert code == 0 and "wrote" in stdout
    text = readme.read_text()
    assert "old" not in text and text.endswith("<!-- /grpo-bench:real-lm -->\n\nafter\n")
    assert f"[{tmp_path / 'results' / 'cs'}](results/cs/README.md)" in text
    page = (tmp_path / "results" / "brief.md").read_text()
    assert page.startswith("# Which algorithm on a real LM") and "(cs/README.md)" in page
    assert not math.isnan(float(page.split("MDD ")[1].split(" ")[0]))


def test_the_front_answer_is_a_table_per_skill_with_the_marks_intervals_and_costs(tmp_path, monkeypatch, settings):
    from scipy import stats

    skill = _skill("chain_sum", SEPARATED, tuned={"a": (1, ["learning_rate=1e-05", "learning_rate=3e-05"])},
                   seconds={"a": 425.4})
    close = _skill("letter_counting", {"a": 0.50, "b": 0.49, "c": 0.30}, sd=0.02, seeds=4, seed=3)
    _read(monkeypatch, {"cs": skill, "lc": close})
    result = brief([tmp_path / "results" / "cs", tmp_path / "results" / "lc"], settings)
    text = brief_module.front(result, tmp_path, figure_path=tmp_path / "results" / "v.png",
                              page=tmp_path / "results" / "v.md")
    marks = skill["analysis"]["tasks"].set_index("variant")
    values = skill["curves"]["cells"].query("variant == 'a'")["primary"]
    half = stats.t.ppf(0.975, 5) * values.std(ddof=1) / math.sqrt(6)  # the 95% Student-t interval over 6 seeds
    best = f"**best** (by >= {brief_module.lower_bound(marks.loc['a', 'gap_low'])})"
    assert (f"| `a` | {best} | {marks.loc['a', 'primary_mean']:.3f} ± {half:.3f} | {marks.loc['a', 'p_best']:.2f} "
            "| 425 | 1000 | lr 3e-05 (grid edge) |") in text
    assert "| `c` | worse (by >= " in text and "| 300 (17.5 of 40 steps) | 1002 | lr 0.0001, untuned |" in text
    assert "**`chain_sum`**: `a` is best; worse: `b`, `c`, `d`, `e` (6 seeds an algorithm" in text
    assert "(results/cs/README.md)" in text and "last-3 accuracy ± 95% CI" in text
    lead = text.split("**`letter_counting`**: ")[1].split(" (4 seeds")[0]
    rows = close["analysis"]["tasks"]
    assert lead.startswith(f"{int(rows['in_best_set'].sum())} of 3 could be best")  # a set, not a best
    assert "![Per skill" in text and "(results/v.png)" in text and "[v.md](results/v.md)" in text
    assert "[glossary](results/glossary.md#how-to-read-the-marks)" in text
    prose = [line for line in text.splitlines() if not line.startswith("|")]
    assert max(map(len, prose)) <= 120
    assert text.index("**`chain_sum`**") < text.index("| `a` |") < text.index("**`letter_counting`**")


def test_the_front_figure_has_a_panel_per_skill(tmp_path, monkeypatch, settings):
    from matplotlib.image import imread

    _read(monkeypatch, {"cs": _skill("chain_sum", SEPARATED), "lc": _skill("letter_counting", SEPARATED, seed=1)})
    one = brief_module.figure(brief([tmp_path / "cs"], settings), tmp_path / "one.png")
    two = brief_module.figure(brief([tmp_path / "cs", tmp_path / "lc"], settings), tmp_path / "two.png")
    height, width = imread(one).shape[:2]
    height2, width2 = imread(two).shape[:2]
    assert width2 > 1.6 * width and abs(height2 - height) < 0.2 * height  # a second panel beside the first


def test_brief_front_writes_the_front_pages_section_and_the_figure_beside_its_page(tmp_path, monkeypatch, run_cli):
    (tmp_path / "results" / "cs").mkdir(parents=True)
    (tmp_path / "results" / "cs" / "matrix.json").write_text("{}")
    _read(monkeypatch, {"cs": _skill("chain_sum", SEPARATED)})
    readme = tmp_path / "README.md"
    readme.write_text("# front\n\n<!-- grpo-bench:front-answer -->\nold\n<!-- /grpo-bench:front-answer -->\n\nafter\n")
    code, stdout, _ = run_cli("brief", tmp_path / "results" / "cs", "--out", tmp_path / "results" / "brief.md",
                              "--front", readme)
    assert code == 0 and "front-answer section" in stdout
    text = readme.read_text()
    assert "old" not in text and text.endswith("<!-- /grpo-bench:front-answer -->\n\nafter\n")
    assert "| `a` | **best** (by >= " in text and "(results/brief.png)" in text and "(results/cs/README.md)" in text
    assert (tmp_path / "results" / "brief.png").read_bytes().startswith(b"\x89PNG")
    assert "(brief.png)" in (tmp_path / "results" / "brief.md").read_text()  # the brief's page shows it too
