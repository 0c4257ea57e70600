"""Claims on pass@K and against the policy before training, and a matrix's claims under a section heading: the
matrix file states them (parsed and checked with the rest of its analysis, recorded as before where unused), and
`grpo-bench claims` judges each metric's claims as one family at 95% / (the number of metrics) and writes the
section's claims under its heading."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks.matrix import parse
from benchmarks.matrix.plan import MatrixError
from benchmarks.report import inference
from benchmarks.report.claims import claims_of, claims_table, render
from benchmarks.store import ResultStore
from tests.conftest import ROOT

MATRIX = """\
seeds = [0, 1, 2]
budget = 64
eval_every = 32
[analysis]
primary = "last_2"
margin = 0.02
{analysis}
[[analysis.claims]]
id = "narrows"
source = "Paper R"
claim = "RL narrows pass@16"
treatment = "grpo"
control = "start"
expects = "worse"
metric = "pass@16"
{claims}
[tasks.pizza]
[algorithms.grpo]
pass_at_k = "1,16"
[algorithms.other]
algo = "grpo"
epsilon_high = 0.28
{other}
"""


def _plan(tmp_path, analysis="", claims="", other='pass_at_k = "16"\npass_samples = 16'):
    path = tmp_path / "m.toml"
    path.write_text(MATRIX.format(analysis=analysis, claims=claims, other=other))
    return parse(path)


def test_a_pass_at_k_claim_against_the_start_is_stated_and_the_cells_evaluate_pass_at_k(tmp_path):
    plan = _plan(tmp_path, analysis='section = "2026"')
    (claim,) = plan.analysis.claims
    assert (claim.metric, claim.control) == ("pass@16", "start")
    stated = plan.analysis.as_dict()
    assert stated["section"] == "2026" and stated["claims"][0]["metric"] == "pass@16"
    settings = {c.variant: c.settings for c in plan.cells}
    assert (settings["grpo"]["pass_at_k"], settings["grpo"]["pass_samples"]) == ("1,16", None)
    assert (settings["other"]["pass_at_k"], settings["other"]["pass_samples"]) == ("16", 16)


def test_an_analysis_stated_before_metrics_and_sections_is_recorded_as_before():
    stated = parse(ROOT / "benchmarks" / "matrices" / "claims_toy.toml").analysis.as_dict()
    assert "section" not in stated
    assert {key for claim in stated["claims"] for key in claim} == {"id", "source", "claim", "treatment", "control",
                                                                    "expects", "task", "secondary"}




@pytest.mark.parametrize("change, message", [
    (dict(analysis="section = 3"), "section must be a heading (text), got 3"),
    (dict(other=""), "claim 'wider' reads pass@16, but variant 'other' does not evaluate it"),
    (dict(other='pass_at_k = "1,4"'), "claim 'wider' reads pass@16, but variant 'other' does not evaluate it"),
    (dict(other="pass_at_k = 16"), 'pass_at_k must be text such as "1,16", got 16'),
    (dict(other='pass_at_k = "1,x"'), "takes comma-separated whole numbers"),
    (dict(other='pass_at_k = "16"\npass_samples = 8'), "must be >= the largest k"),
])
def test_a_bad_pass_at_k_claim_or_setting_is_one_line_naming_the_file(tmp_path, change, message):
    claims = ('[[analysis.claims]]\nid = "wider"\nsource = "Paper M"\nclaim = "O keeps pass@16"\ntreatment = "other"\n'
              'control = "grpo"\nmetric = "pass@16"\n')
    with pytest.raises(MatrixError) as info:
        _plan(tmp_path, claims=claims, **change)
    assert str(info.value).startswith(f"{tmp_path / 'm.toml'}:") and message in str(info.value)


@pytest.mark.parametrize("metric", ["auc", "pass@0", "pass@k", "last_3"])
def test_a_metric_other_than_pass_at_k_is_refused(tmp_path, metric):
    path = tmp_path / "m.toml"
    path.write_text(MATRIX.format(analysis="", claims="", other="").replace('"pass@16"', f'"{metric}"'))
    with pytest.raises(MatrixError, match=f"claim 'narrows': metric must be pass@K .* got '{metric}'"):
        parse(path)


# --- the report -------------------------------------------------------------------------------------------------------

SEEDS = 6


def _store(out: Path, section: str | None = "2026") -> Path:
    """A finished matrix folder with four variants on pizza: each cell's evaluations end at ``final`` (plus the seed's
    part and noise), its pass@16 before training 0.9 + 0.01 seed (the same for every variant of a seed) and after
    it that plus the planted change and a quarter of the noise; "same" ends exactly where it began."""
    out.mkdir(parents=True)
    store = ResultStore.open(out)
    rng = np.random.default_rng(3)
    # (final, pass@16 after - before; None: exactly before's)
    planted = {"grpo": (0.80, -0.05), "maxrl": (0.80, 0.0), "dapo": (0.70, 0.0), "same": (0.80, None)}
    cells = []
    for variant, (final, change) in planted.items():
        noise = rng.normal(0, 0.004, SEEDS)
        for seed in range(SEEDS):
            rel = f"pizza/{variant}/seed{seed}"
            spec = {"task_label": "pizza", "task": "pizza", "variant": variant, "algo": "grpo", "seed": seed,
                    "steps": 2, "budget": 64, "completions_per_step": 32, "eval_every": 1}
            accuracy = final + 0.01 * seed + noise[seed]
            before = 0.9 + 0.01 * seed
            rows = [{"step": 1, "completions": 32.0, "eval/accuracy": accuracy, "time/wall": 1.0},
                    {"step": 2, "completions": 32.0, "time/wall": 2.0}]
            summary = {"status": "complete", "steps": 2, "accuracy_before": 0.3 + 0.01 * seed,
                       "accuracy_after": accuracy, "completions_generated": 64.0, "wall_clock_s": 1.0,
                       "pass_at_k_before": {"1": 0.3, "16": before},
                       "pass_at_k_after": {"1": accuracy,
                                           "16": before if change is None else before + change + noise[seed] / 4}}
            store.put(rel, spec, summary, rows)
            cells.append({"dir": rel, **spec})
    store.write()
    claims = [{"id": "pass1", "source": "S", "claim": "RL raises accuracy", "treatment": "grpo", "control": "start"},
              {"id": "dapo", "source": "S", "claim": "D learns as G", "treatment": "dapo", "control": "grpo",
               "expects": "equal"},
              {"id": "narrows", "source": "S", "claim": "RL narrows pass@16", "treatment": "grpo", "control": "start",
               "expects": "worse", "metric": "pass@16"},
              {"id": "keeps", "source": "S", "claim": "M keeps pass@16 above G", "treatment": "maxrl",
               "control": "grpo", "metric": "pass@16"},
              {"id": "same", "source": "S", "claim": "S keeps pass@16", "treatment": "same", "control": "start",
               "expects": "equal", "metric": "pass@16"}]
    analysis = {"primary": "last_2", "margin": 0.02, "target_mdd": None, "stated_at": "2026-12-01T00:00:00Z",
                "claims": [dict({"expects": "better", "task": None, "secondary": None}, **c) for c in claims],
                **({"section": section} if section else {})}
    (out / "matrix.json").write_text(json.dumps({"name": out.name, "cells": cells, "sessions": [],
                                                 "analysis": analysis}))
    return out


def test_pass_at_k_and_start_claims_read_the_cells_before_and_after_training(tmp_path):
    table = claims_of(_store(tmp_path / "m")).set_index("id")
    # pass@16 after minus before: -0.05 planted, plus a quarter of the cell noise (mean over 6 seeds)
    assert table.loc["narrows", "difference"] == pytest.approx(-0.05, abs=0.004)
    assert table.loc["narrows", "mark"] == inference.SUPPORTED
    # maxrl's pass@16 after (0.9 + 0.01 s + 0) against grpo's (0.9 + 0.01 s - 0.05): +0.05
    assert table.loc["keeps", "difference"] == pytest.approx(0.05, abs=0.004)
    # the primary metric against the start: the mean of the last 2 evaluations against the accuracy before training
    # (0.3 + 0.01 s): 0.80 - 0.30 = 0.5 on average
    assert table.loc["pass1", "difference"] == pytest.approx(0.5, abs=0.006)
    assert table.loc["pass1", "control_mean"] == pytest.approx(0.3 + 0.01 * np.mean(range(SEEDS)))
    assert list(table["metric"].fillna("-")) == ["-", "-", "pass@16", "pass@16", "pass@16"]
    assert set(table["section"]) == {"2026"}


def test_each_metric_is_a_family_at_95_percent_over_the_number_of_metrics(tmp_path):
    table = claims_of(_store(tmp_path / "m")).set_index("id")
    # the primary family alone, at 0.05 / 2: the same interval as the report's; at 0.05 it would be narrower
    from benchmarks.report import curves
    from benchmarks.report.matrix import collect

    data = collect(tmp_path / "m")
    per_cell = curves.build(data["cells"], data["evals"], "last_2")["cells"]
    scores = {v: dict(zip(g["seed"].astype(int), g["primary"].astype(float))) for v, g in per_cell.groupby("variant")}
    scores["start"] = {s: 0.3 + 0.01 * s for s in range(SEEDS)}
    family = [{"id": "pass1", "treatment": "grpo", "control": "start", "expects": "better"},
              {"id": "dapo", "treatment": "dapo", "control": "grpo", "expects": "equal"}]
    half, _ = inference.contrasts(scores, family, margin=0.02, alpha=0.025)
    whole, _ = inference.contrasts(scores, family, margin=0.02)
    row = table.loc["dapo"]
    assert (row["low"], row["high"]) == pytest.approx((half["low"][1], half["high"][1]))
    assert whole["high"][1] - whole["low"][1] < row["high"] - row["low"]


def test_a_section_s_claims_sit_under_its_heading_after_the_others(tmp_path):
    table = claims_table([str(_store(tmp_path / "old", section=None)), str(_store(tmp_path / "new"))])
    text = render(table, link_from=tmp_path, command="grpo-bench claims old new")
    head, section = text.split("#### 2026\n")
    assert head.count("| RL narrows pass@16") == 1 and section.count("| RL narrows pass@16") == 1
    assert "[old](old/README.md)" in head and "[new](new/README.md)" in section and "[old]" not in section
    row = next(line for line in section.splitlines() if line.startswith("| RL narrows pass@16"))
    assert "`grpo` vs its policy before training on pizza, pass@16 after training" in row and "| supported |" in row
    row = next(line for line in section.splitlines() if line.startswith("| D learns as G"))
    assert "`dapo` vs `grpo` on pizza |" in row and "contradicted" in row
    assert "95% divided by its number of metrics" in section and "#### None" not in text
    # pass@16 counts solved questions: equal on every seed is no difference, not "identical runs"
    row = next(line for line in section.splitlines() if line.startswith("| S keeps pass@16"))
    assert "| the same pass@16 on every seed: no difference (equivalent) |" in row


@pytest.mark.parametrize("name", ["claims_2026.toml", "claims_2026_small_budget.toml"])
def test_the_2026_matrices_state_their_claims_under_2026_at_equal_completions_and_updates(name):
    plan = parse(ROOT / "benchmarks" / "matrices" / name)
    assert plan.analysis.section == "2026" and plan.analysis.margin == 0.02 and plan.analysis.primary == "last_3"
    cells = {c.variant: c for c in plan.cells if c.seed == 0}
    assert {c.seed for c in plan.cells} == set(range(8))
    assert {c.settings["reward_mode"] for c in plan.cells} == {"correctness"}  # MaxRL's and REAL's binary reward
    for claim in plan.analysis.claims:
        treatment = cells[claim.treatment]
        if claim.control == "start":
            assert claim.metric == "pass@16" or claim.expects == "better"
            continue
        control = cells[claim.control]
        # one knob: the same budget, completions a step and steps (so the same optimizer updates at equal mu)
        assert (treatment.budget, treatment.completions_per_step, treatment.steps) == \
               (control.budget, control.completions_per_step, control.steps), claim.id
        assert treatment.settings.get("mu", 1) == control.settings.get("mu", 1), claim.id
        assert treatment.settings["learning_rate"] == control.settings["learning_rate"] == 1e-4
