"""Published claims tested by pre-registered matrices (issue #47): [[analysis.claims]] is parsed and checked and
recorded with the analysis; a claim's contrast gets a simultaneous interval whose family-wise error over the
matrix's claims is <= 5% (simulated at the toy claims matrix's own design), planted differences are found, and
`grpo-bench claims` writes the table from a store."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from benchmarks.errors import UsageError
from benchmarks.matrix import parse
from benchmarks.matrix.execute import _stated_analysis
from benchmarks.matrix.plan import MatrixError
from benchmarks.report import inference
from benchmarks.store import ResultStore

ROOT = Path(__file__).resolve().parents[1]
CLAIMS_TOY = ROOT / "benchmarks" / "matrices" / "claims_toy.toml"

MATRIX = """\
seeds = [0, 1, 2]
budget = 64
eval_every = 32
[analysis]
primary = "last_2"
margin = 0.02
{claims}
[tasks.pizza]
[algorithms.grpo]
[algorithms.clip_higher]
algo = "grpo"
epsilon_high = 0.28
"""
CLAIM = """[[analysis.claims]]
id = "clip-higher"
source = "DAPO (Yu et al. 2025)"
claim = "an upper clip of 0.28 learns better than 0.2"
treatment = "clip_higher"
control = "grpo"
"""


def _plan(tmp_path, claims=CLAIM):
    path = tmp_path / "m.toml"
    path.write_text(MATRIX.format(claims=claims))
    return parse(path)


def test_claims_are_part_of_the_stated_analysis(tmp_path):
    plan = _plan(tmp_path)
    (claim,) = plan.analysis.claims
    assert (claim.treatment, claim.control, claim.expects, claim.task) == ("clip_higher", "grpo", "better", None)
    first = _stated_analysis(plan, {}, [])
    assert first["claims"][0]["id"] == "clip-higher" and first["stated_at"]
    changed = _plan(tmp_path, CLAIM + 'expects = "equal"\n')
    with pytest.raises(UsageError, match="changed since the first session"):  # the question cannot move after the answer
        _stated_analysis(changed, {"analysis": first}, [{"cells_run": 6}])
    # a matrix without claims records the analysis it recorded before claims existed
    assert "claims" not in _plan(tmp_path, "").analysis.as_dict()


@pytest.mark.parametrize("claims, message", [
    (CLAIM.replace('"clip_higher"', '"clip_hi"'), "treatment 'clip_hi' is not a variant of this matrix"),
    (CLAIM.replace('control = "grpo"', 'control = "clip_higher"'), "the treatment and the control are one variant"),
    (CLAIM + 'expects = "more"\n', "expects must be better, worse, equal or differs"),
    (CLAIM + 'alpha = 0.1\n', "unknown key 'alpha' of [[analysis.claims]]"),
    (CLAIM.replace('source = "DAPO (Yu et al. 2025)"\n', ""), "needs source"),
    (CLAIM + CLAIM, "claim ids repeat"),
    (CLAIM + 'task = "addition"\n', "task 'addition' is not one of this matrix's"),
])
def test_a_bad_claim_is_one_line_naming_the_file(tmp_path, claims, message):
    with pytest.raises(MatrixError) as info:
        _plan(tmp_path, claims)
    assert str(info.value).startswith(f"{tmp_path / 'm.toml'}:") and message in str(info.value)


@pytest.mark.parametrize("low, high, expects, mark", [
    (0.01, 0.03, "better", inference.SUPPORTED),
    (-0.03, -0.01, "better", inference.CONTRADICTED),
    (-0.01, 0.015, "better", inference.CLAIM_EQUIVALENT),
    (-0.01, 0.03, "better", inference.CLAIM_OPEN),
    (-0.03, -0.01, "worse", inference.SUPPORTED),
    (0.01, 0.03, "worse", inference.CONTRADICTED),
    (-0.01, 0.015, "equal", inference.SUPPORTED),
    (0.001, 0.015, "equal", inference.SUPPORTED),  # separated from 0 but within the margin: practically equal
    (0.001, 0.03, "equal", inference.CONTRADICTED),
    (-0.01, 0.03, "equal", inference.CLAIM_OPEN),
])
def test_marks(low, high, expects, mark):
    assert inference.contrast_mark(low, high, expects, margin=0.02) == mark


@pytest.mark.parametrize("low, high, mark", [
    (0.01, 0.03, inference.SUPPORTED),       # separated from 0, either sign
    (-0.05, -0.001, inference.SUPPORTED),
    (0.001, 0.03, inference.SUPPORTED),      # reaches past the margin: not a negligible difference
    (-0.01, 0.015, inference.CONTRADICTED),  # inside +-margin: no difference that matters
    (0.001, 0.015, inference.CONTRADICTED),  # separated but inside the margin: as "equal" reads it
    (-0.01, 0.03, inference.CLAIM_OPEN),
    (-0.03, 0.01, inference.CLAIM_OPEN),
])
def test_a_claim_of_a_difference_of_either_sign(low, high, mark):
    assert inference.contrast_mark(low, high, "differs", margin=0.02) == mark
    # the mirror of "equal": whatever supports one contradicts the other, and both are open together
    swap = {inference.SUPPORTED: inference.CONTRADICTED, inference.CONTRADICTED: inference.SUPPORTED}
    equal = inference.contrast_mark(low, high, "equal", margin=0.02)
    assert mark == swap.get(equal, equal)
    # without a margin nothing is contradicted, a separation still supports it
    assert inference.contrast_mark(low, high, "differs", margin=None) == \
        (inference.SUPPORTED if low > 0 or high < 0 else inference.CLAIM_OPEN)


def test_a_sensitivity_claim_is_parsed_and_judged(tmp_path):
    (claim,) = _plan(tmp_path, CLAIM + 'expects = "differs"\n').analysis.claims
    assert claim.expects == "differs"
    scores = _planted({"control": 0.0, "down": -0.05, "same": 0.0})
    claims = [{"id": "a", "treatment": "down", "control": "control", "expects": "differs"},
              {"id": "b", "treatment": "same", "control": "control", "expects": "differs"}]
    table, _ = inference.contrasts(scores, claims, margin=0.03)
    assert list(table["mark"]) == [inference.SUPPORTED, inference.CONTRADICTED]


def _planted(differences: dict[str, float], n: int = 8, sd: float = 0.01, seed: int = 0) -> dict:
    """Cells whose variant means differ by exactly ``differences``: each variant's own noise centred and scaled
    to ``sd``, plus the seed's shared part (which blocking removes)."""
    rng = np.random.default_rng(seed)
    block = rng.normal(0, 0.02, n)
    out = {}
    for v, d in differences.items():
        noise = rng.normal(0, 1, n)
        noise = sd * (noise - noise.mean()) / noise.std(ddof=1)
        out[v] = {s: 0.8 + d + block[s] + noise[s] for s in range(n)}
    return out


def test_planted_differences_are_found_and_an_equal_pair_is_equivalent():
    scores = _planted({"control": 0.0, "gain": 0.05, "loss": -0.05, "same": 0.0})
    claims = [{"id": "a", "treatment": "gain", "control": "control", "expects": "better"},
              {"id": "b", "treatment": "loss", "control": "control", "expects": "better"},
              {"id": "c", "treatment": "same", "control": "control", "expects": "better"},
              {"id": "d", "treatment": "same", "control": "control", "expects": "equal"}]
    table, f = inference.contrasts(scores, claims, margin=0.03)
    assert list(table["mark"]) == [inference.SUPPORTED, inference.CONTRADICTED, inference.CLAIM_EQUIVALENT,
                                   inference.SUPPORTED]
    assert f.model == inference.BLOCKED
    row = table.iloc[0]
    assert row["difference"] == pytest.approx(0.05) and row["low"] < 0.05 < row["high"]
    assert table.iloc[2]["difference"] == pytest.approx(0.0, abs=1e-12)
    # the claims' family of 4 contrasts (3 distinct) needs a smaller c than every pair of the 4 variants
    assert f.c < inference.fit(scores).c
    # without a margin nothing is called equivalent
    table, _ = inference.contrasts(scores, claims, margin=None)
    assert table.iloc[2]["mark"] == inference.CLAIM_OPEN and table.iloc[3]["mark"] == inference.CLAIM_OPEN


def test_the_family_wise_error_over_the_toy_claims_is_at_most_5_percent():
    plan = parse(CLAIMS_TOY)
    claims = plan.analysis.claims
    names = list(dict.fromkeys(v for c in claims for v in (c.treatment, c.control)))
    pairs = [(names.index(c.treatment), names.index(c.control)) for c in claims]
    n = len({c.seed for c in plan.cells})
    rng = np.random.default_rng(5)
    # the global null, spreads unequal up to 4x (a variant that collapses on some seeds), a shared seed part
    sds = np.exp(rng.normal(0.0, 0.5, len(names))) * 0.01
    sims = 1000
    rates = inference.contrast_error(len(names), n, pairs, sds=sds, block_sd=0.01, margin=plan.analysis.margin,
                                     sims=sims, reps=1000, seed=11)
    assert rates["false_claim"] <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / sims), rates
    # a planted gap of 3 MDDs in one contrast is found
    truth = np.zeros(len(names))
    truth[pairs[0][0]] = 0.05
    found = inference.contrast_error(len(names), n, pairs[:1], sds=np.full(len(names), 0.01), means=truth, sims=200,
                                     reps=500, seed=12)
    assert found["false_claim"] <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / 200)


def _write(out: Path, differences: dict[str, float], claims_toml: str, seeds: int = 4) -> Path:
    """A finished matrix folder (store, matrix.json with its stated analysis) whose cells' evaluations end at
    0.8 + the variant's difference, the same seed noise for every variant."""
    out.mkdir(parents=True)
    store = ResultStore.open(out)
    cells = []
    rng = np.random.default_rng(1)
    noise = {v: rng.normal(0, 0.004, seeds) for v in differences}
    for variant, d in differences.items():
        for seed in range(seeds):
            final = 0.8 + d + 0.01 * seed + noise[variant][seed]
            rel = f"pizza/{variant}/seed{seed}"
            spec = {"task_label": "pizza", "task": "pizza", "variant": variant, "algo": "grpo", "seed": seed,
                    "steps": 2, "budget": 64, "completions_per_step": 32, "eval_every": 1}
            entropy = 1.0 + (0.2 if variant == "b" else 0.0) + 0.02 * seed  # b keeps its entropy up by 0.2
            rows = [{"step": 1, "completions": 32.0, "eval/accuracy": final - 0.001, "time/wall": 1.0, "entropy": 9.0},
                    {"step": 2, "completions": 32.0, "time/wall": 2.0, "entropy": entropy}]
            summary = {"status": "complete", "steps": 2, "accuracy_before": 0.2, "accuracy_after": final,
                       "completions_generated": 64.0, "wall_clock_s": 2.0, "process_wall_clock_s": 3.0}
            store.put(rel, spec, summary, rows)
            cells.append({"dir": rel, **spec})
    store.write()
    analysis = {"primary": "last_2", "margin": 0.02, "target_mdd": None, "stated_at": "2026-11-26T00:00:00Z",
                "claims": [dict({"expects": "better", "task": None, "secondary": None}, **c) for c in claims_toml]}
    (out / "matrix.json").write_text(json.dumps({"name": out.name, "cells": cells, "sessions": [],
                                                 "analysis": analysis}))
    return out


def test_the_claims_command_writes_the_table(run_cli, tmp_path):
    claims = [{"id": "gain", "source": "Paper A", "claim": "B learns better than A", "treatment": "b", "control": "a",
               "secondary": "entropy"},
              {"id": "none", "source": "Paper B", "claim": "C learns better than A", "treatment": "c", "control": "a"}]
    matrix = _write(tmp_path / "m", {"a": 0.0, "b": 0.06, "c": 0.0}, claims)
    readme = tmp_path / "README.md"
    readme.write_text("# x\n")
    code, out, err = run_cli("claims", matrix, "--out", tmp_path / "claims.md", "--readme", readme)
    assert code == 0, err
    text = (tmp_path / "claims.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| B learns") or line.startswith("| C learns")]
    assert len(rows) == 2
    assert "| supported |" in rows[0] and "`b` vs `a` on pizza" in rows[0] and "+0.06" in rows[0]
    assert "no difference beyond +-0.02 (equivalent)" in rows[1]
    # the secondary metric: each cell's last quarter of steps (step 2 of 2), per-seed difference exactly 0.2
    assert "entropy 1.23 vs 1.03: +0.2 [+0.2, +0.2]" in rows[0] and "| - |" in rows[1]
    assert "stated 2026-11-26T00:00:00Z" in text and "mean accuracy of the last 2 evaluations" in text
    assert "[m](m/README.md)" in text
    assert "<!-- grpo-bench:claims -->" in readme.read_text() and "| supported |" in readme.read_text()


def test_a_matrix_without_claims_is_one_line(run_cli, tmp_path):
    matrix = _write(tmp_path / "m", {"a": 0.0, "b": 0.0}, [])
    code, _, err = run_cli("claims", matrix, "--out", tmp_path / "claims.md")
    assert code == 2 and "states no claims" in err and "Traceback" not in err
