"""Each verdict section's population line (benchmarks/report/population.py): which population the marks speak for,
and, for a fixed question set with per-question records, what the crossed seeds x questions analysis would change."""

from __future__ import annotations

import numpy as np
import pandas as pd

from benchmarks.report import inference, population, verdicts


def _frame(question_sd: float, *, own_draws: bool = False, seeds: int = 8, questions: int = 40) -> pd.DataFrame:
    """Per-question scores of two variants 0.05 apart: seed noise 0.005 a cell, and per variant and question an
    effect of sd ``question_sd`` (the two variants answer different questions well: a question part of the gap)."""
    rng = np.random.default_rng(0)
    rows = []
    for variant, mu in (("a", 0.6), ("b", 0.55)):
        effect = question_sd * rng.standard_normal(questions)
        effect -= effect.mean()  # the gap on these questions stays 0.05
        for seed in range(seeds):
            cell = mu + effect + 0.005 * rng.standard_normal() + 0.001 * rng.standard_normal(questions)
            rows += [{"task": "t", "variant": variant, "seed": seed, "question": q, "score": x}
                     for q, x in enumerate(cell)]
    frame = pd.DataFrame(rows)
    options = {v: ({f'{{"problem_seed": {s}}}' for s in range(seeds)} if own_draws else {"{}"}) for v in "ab"}
    frame.attrs["task_options"] = {"t": options}
    return frame


def _judged(frame: pd.DataFrame):
    scores = {v: g.groupby("seed")["score"].mean().to_dict() for v, g in frame.groupby("variant")}
    marks, fit = inference.compare(scores)
    return fit, marks.assign(task="t")


def test_a_fixed_question_set_speaks_for_its_questions_and_the_crossed_part_can_move_a_mark():
    frame = _frame(0.3)
    fit, marks = _judged(frame)
    assert list(marks.set_index("variant")["mark"]) == [inference.BEST, inference.WORSE]  # seeds alone: resolved
    text = population.line(frame, "t", fit, marks, None)
    assert text.startswith("Population: these 40 questions, new seeds.")
    assert "indicative, not the registered procedure" in text and "median over 1 pairs" in text
    # the question part, var(effect_a - effect_b) / Q = 2 * 0.09 / 40, dwarfs the seeds-only 2 * 0.005^2 / 8
    share = float(text.split("seeds-only variance is ")[1].split(" ")[0])
    assert share > 100
    assert "`a` best -> not resolved; `b` worse -> not resolved." in text


def test_no_question_part_changes_no_mark_and_own_draws_need_no_crossed_line():
    fit, marks = _judged(_frame(0.0))
    text = population.line(_frame(0.0), "t", fit, marks, None)
    assert "is 0.00 (median over 1 pairs)" in text and text.endswith("c unchanged, no mark changes.")
    own = _frame(0.3, own_draws=True)
    fit, marks = _judged(own)
    text = population.line(own, "t", fit, marks, None)
    assert text.startswith(f"Population: {population.crossed.NEW_DRAW} (each seed evaluates its own draw of 40")
    assert "crossed seeds x questions analysis" not in text


def test_a_store_without_per_question_records_says_so(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise population.UsageError("no complete evaluation cell kept per-question records")

    monkeypatch.setattr(population.crossed, "question_scores", refuse)
    analysis = {"tasks": pd.DataFrame({"task": ["t", "t"], "variant": ["a", "b"]}), "spec": {"primary": "final"}}
    assert population.task_lines(tmp_path, analysis) == {"t": population.NO_RECORDS}


def test_the_verdict_section_prints_the_population_line_under_the_task_heading():
    from tests.benchmarks.report.test_procedures import _analysis, _wide

    analysis = _analysis(_wide(), {})
    assert set(analysis["fits"]) == {"t"} and analysis["fits"]["t"].procedure == inference.PROCEDURE
    assert "Population:" not in verdicts.render(analysis, scaling=False)
    analysis["population"] = {"t": "Population: these 7 questions, new seeds."}
    text = verdicts.render(analysis, scaling=False)
    assert text.index("#### `t`") < text.index("Population: these 7 questions") < text.index("| rank |")
