"""The report of a matrix in its tuning stage: the grid so far, scored as the choice will score it."""

import json

import pytest

from benchmarks.cli.main import main
from benchmarks.matrix import parse
from benchmarks.report.matrix import report
from benchmarks.store import ResultStore
from tests.benchmarks.matrix.test_tuning import MATRIX as TUNING_MATRIX

# The tuning tests' matrix (2 learning rates; DPO also 2 betas), with an analysis stating its primary metric.
MATRIX = TUNING_MATRIX.replace("[tasks.pizza]", '[analysis]\nprimary = "last_2"\nmargin = 0.05\n\n[tasks.pizza]')


def _summary(after, completions=64, status="complete"):
    return {"status": status, "steps": 2, "accuracy_before": 0.1, "accuracy_after": after,
            "completions_generated": completions, "wall_clock_s": 12.0}


@pytest.fixture
def tuning_dir(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text(MATRIX)
    plan = parse(path)
    out = tmp_path / "out"
    out.mkdir()
    specs = {c.relpath: c.spec() for c in plan.tuning_cells()}
    meta = {"name": "m", "description": "a tuning test", "cells": [], "analysis": {"primary": "last_2", "margin": 0.05},
            "tuning": {"seeds": [10, 11], "cells": [{"dir": k, **v} for k, v in specs.items()], "table": None}}
    (out / "matrix.json").write_text(json.dumps(meta))
    store = ResultStore.open(out)
    grpo = "tune/pizza/grpo/learning_rate=1e-05/seed{}"
    rows = lambda mid: [{"step": 1, "completions": 32.0, "eval/accuracy": mid}, {"step": 2, "completions": 32.0}]
    store.put(grpo.format(10), specs[grpo.format(10)], _summary(0.5), rows(0.3))  # last_2 = (0.3 + 0.5) / 2 = 0.4
    store.put(grpo.format(11), specs[grpo.format(11)], _summary(0.7, completions=96), rows(0.5))  # 0.6, over budget
    failed = "tune/pizza/grpo/learning_rate=0.001/seed10"
    store.put(failed, specs[failed], {"status": "failed", "error": "diverged"}, [])
    stale = "tune/pizza/grpo/learning_rate=0.001/seed11"  # ran under other settings: not this matrix's cell
    store.put(stale, {**specs[stale], "budget": 32}, _summary(0.9), rows(0.9))
    store.write()
    return out


def test_the_grid_so_far_is_scored_as_the_choice_scores_it(tuning_dir):
    data = report(tuning_dir, plot=False)
    rows = {(r["variant"], r["point"]): r for r in data["tuning_stage"]}
    assert len(rows) == 2 + 4 and sum(r["planned"] for r in rows.values()) == 12
    first = rows[("grpo", "learning_rate=1e-05")]
    assert first["seeds"] == 2 and first["primary"] == pytest.approx((0.4 + 0.6) / 2)
    assert first["final_accuracy"] == pytest.approx(0.6) and first["completions"] == [64, 96]
    second = rows[("grpo", "learning_rate=0.001")]
    assert second["seeds"] == 0 and second["failed"] == 1  # the stale cell is not counted
    page = (tuning_dir / "README.md").read_text()
    assert "Tuning stage: 2 of 12 tuning cells finished, 1 failed; no evaluation cell has run." in page
    assert "| pizza | grpo | learning_rate=1e-05 | 2 of 2 | 0.500 | 0.600 | 64, 96 | 12, 12 |" in page
    assert "Over the budget: grpo learning_rate=1e-05." in page
    assert "chosen" not in page.split("Per grid point")[1]  # no choice is named on a partial grid


def test_the_report_command_on_a_tuning_stage_says_how_far(tuning_dir, capsys):
    assert main(["report", str(tuning_dir), "--no-plots"]) == 0
    assert "tuning stage: 2 of 12 tuning cells finished" in capsys.readouterr().out


def test_between_the_stages_the_verdict_section_still_shows_the_tuning():
    """Tuning done, no evaluation cell finished: nothing to rank, but each variant's chosen point and its grid."""
    import pandas as pd

    from benchmarks.report import verdicts

    rows = [{"task": "t", "variant": "grpo", "point": f"learning_rate={lr}", "chosen": lr == 1e-5, "at_edge": False,
             "chosen_by": "last_3", "score": score, "auc": score, "final_accuracy": score + 0.01, "tuning_seeds": 2,
             "failed": False, "sensitivity": 0.2} for lr, score in ((3e-6, 0.30), (1e-5, 0.34), (3e-5, 0.27))]
    text = verdicts.render({"tasks": pd.DataFrame(), "tuning": pd.DataFrame(rows)})
    assert "nothing to rank" in text and "#### `t`" in text
    assert "| grpo | learning_rate=1e-05 | 0.340 |" in text and "learning_rate=3e-05: 0.270 / 0.280" in text


def test_a_verdict_read_in_the_tuning_stage_says_how_far_the_tuning_is(tuning_dir):
    """The brief (and whatever reads a matrix's evaluation cells) said "the result store holds no cells" of a matrix
    whose store held its tuning cells: it counts the finished ones (the failed and the stale cell not among them)."""
    from benchmarks.errors import UsageError
    from benchmarks.report.matrix import collect

    with pytest.raises(UsageError, match=r"its evaluation cells are planned when the tuning stage chooses, and 2 of its "
                                         r"12 tuning cells have finished; resume the matrix"):
        collect(tuning_dir)
