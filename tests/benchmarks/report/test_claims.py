"""Published claims tested by pre-registered matrices: [[analysis.claims]] is parsed and checked and
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
from tests.conftest import ROOT

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
    (0.001, 0.03, "equal", inference.CLAIM_OPEN),  # separated from 0, not from the margin: the margin both ways
    (0.02, 0.03, "equal", inference.CONTRADICTED),  # a difference of at least the margin
    (-0.05, -0.021, "equal", inference.CONTRADICTED),
    (-0.01, 0.03, "equal", inference.CLAIM_OPEN),
])
def test_marks(low, high, expects, mark):
    assert inference.contrast_mark(low, high, expects, margin=0.02) == mark


@pytest.mark.parametrize("low, high, mark", [
    (0.02, 0.03, inference.SUPPORTED),       # outside +-margin, either sign: a difference that matters
    (-0.05, -0.021, inference.SUPPORTED),
    (0.001, 0.03, inference.CLAIM_OPEN),     # separated from 0 but could be inside the margin
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


def _write(out: Path, differences: dict[str, float], claims_toml: str, seeds: int = 4,
           costs: dict[str, tuple[float, int]] | None = None, stated: bool = True) -> Path:
    """A finished matrix folder (store, matrix.json with its stated analysis, or none) whose cells' evaluations end
    at 0.8 + the variant's difference, the same seed noise for every variant; ``costs``: a variant's training
    seconds (times 1 + 1% per seed) and trained-state bytes."""
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
            seconds, state = (costs or {}).get(variant, (2.0, 1000))
            summary = {"status": "complete", "steps": 2, "accuracy_before": 0.2, "accuracy_after": final,
                       "completions_generated": 64.0, "wall_clock_s": seconds * (1 + 0.01 * seed),
                       "process_wall_clock_s": 3.0, "param_bytes": state, "peak_memory_bytes": 2**30}
            store.put(rel, spec, summary, rows)
            cells.append({"dir": rel, **spec})
    store.write()
    analysis = {"primary": "last_2", "margin": 0.02, "target_mdd": None, "stated_at": "2026-11-26T00:00:00Z",
                "claims": [dict({"expects": "better", "task": None, "secondary": None}, **c) for c in claims_toml]}
    meta = {"name": out.name, "cells": cells, "sessions": [], **({"analysis": analysis} if stated else {})}
    (out / "matrix.json").write_text(json.dumps(meta))
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


# ------------------------------------------------------------------------------------------------
# Cost claims read from stored matrices (claim 9: GRPO costs less than PPO at equal accuracy)
# ------------------------------------------------------------------------------------------------

READING = """\
name = "cost"
stated = "2026-11-27"
[[cost_claims]]
id = "cheaper"
source = "Paper C"
claim = "G costs less than P at equal accuracy"
store = "{store}"
task = "pizza"
treatment = "g"
control = "p"
{extra}"""


def _reading(tmp_path, store: Path, extra: str = "") -> Path:
    path = tmp_path / "reading.toml"
    path.write_text(READING.format(store=store, extra=extra))
    return path


@pytest.mark.parametrize("accuracy, costs, mark, words", [
    # equal accuracy, 3x faster, half the trained state: every part holds
    ({"g": 0.0, "p": 0.0}, {"g": (10.0, 500), "p": (30.0, 1000)}, "supported", "supported"),
    # slower: contradicted whatever the accuracy says
    ({"g": 0.0, "p": 0.0}, {"g": (30.0, 500), "p": (10.0, 1000)}, "contradicted", "contradicted: slower"),
    # the same trained state: "less memory" fails
    ({"g": 0.0, "p": 0.0}, {"g": (10.0, 1000), "p": (30.0, 1000)}, "contradicted", "no smaller trained state"),
    # less accurate by more than the margin (0.1 > 0.02): contradicted
    ({"g": -0.1, "p": 0.0}, {"g": (10.0, 500), "p": (30.0, 1000)}, "contradicted", "less accurate by more than 0.02"),
    # 0.02 below: the interval straddles -margin, so equal accuracy is open; cheaper is shown
    ({"g": -0.02, "p": 0.0}, {"g": (10.0, 500), "p": (30.0, 1000)}, "not resolved",
     "(faster and smaller trained state: shown)"),
])
def test_a_cost_claim_is_judged_by_its_three_parts(tmp_path, accuracy, costs, mark, words):
    from benchmarks.report.cost_claims import cost_claims_of, cost_mark_text

    store = _write(tmp_path / "m", accuracy, [], seeds=6, costs=costs)
    (row,) = [r for _, r in cost_claims_of(_reading(tmp_path, store)).iterrows()]
    assert row["mark"] == mark and words in cost_mark_text(row)
    seconds = {v: [c[0] * (1 + 0.01 * s) for s in range(6)] for v, c in costs.items()}
    assert row["time_ratio"] == pytest.approx(np.exp(np.mean(np.log(np.divide(seconds["g"], seconds["p"])))))
    assert row["state_ratio"] == pytest.approx(costs["g"][1] / costs["p"][1])
    assert row["difference"] == pytest.approx(accuracy["g"] - accuracy["p"], abs=0.012)
    assert row["stated_at"] == "2026-11-26T00:00:00Z" and row["margin"] == 0.02  # the store's own analysis


def test_the_accuracy_interval_is_the_97_5_percent_half_of_a_bonferroni_pair(tmp_path):
    from benchmarks.report.cost_claims import cost_claims_of

    store = _write(tmp_path / "m", {"g": 0.0, "p": 0.0}, [], seeds=6, costs={"g": (10.0, 500), "p": (30.0, 1000)})
    row = cost_claims_of(_reading(tmp_path, store)).iloc[0]
    narrow, _ = inference.contrasts(_scores_of(store), [{"id": "x", "treatment": "g", "control": "p",
                                                         "expects": "equal"}], margin=0.02)
    wide, _ = inference.contrasts(_scores_of(store), [{"id": "x", "treatment": "g", "control": "p",
                                                       "expects": "equal"}], margin=0.02, alpha=0.025)
    assert row["high"] - row["low"] == pytest.approx(wide["high"][0] - wide["low"][0])
    assert wide["high"][0] - wide["low"][0] > narrow["high"][0] - narrow["low"][0]


def _scores_of(store: Path) -> dict:
    from benchmarks.report import curves
    from benchmarks.report.matrix import collect

    data = collect(store)
    cells = curves.build(data["cells"], data["evals"], "last_2")["cells"]
    return {v: dict(zip(g["seed"].astype(int), g["primary"].astype(float))) for v, g in cells.groupby("variant")}


def test_a_reading_cannot_change_what_the_store_stated(tmp_path, run_cli):
    store = _write(tmp_path / "m", {"g": 0.0, "p": 0.0}, [], costs={"g": (1.0, 5), "p": (2.0, 10)})
    code, _, err = run_cli("claims", _reading(tmp_path, store, "margin = 0.05\n"), "--out", tmp_path / "c.md")
    assert code == 2 and "stated margin 0.02 before its cells ran; a reading cannot use 0.05" in err
    assert "Traceback" not in err


def test_a_store_that_stated_nothing_needs_the_reading_to_state_it(tmp_path, run_cli):
    store = _write(tmp_path / "m", {"g": 0.0, "p": 0.0}, [], costs={"g": (1.0, 5), "p": (2.0, 10)}, stated=False)
    code, _, err = run_cli("claims", _reading(tmp_path, store), "--out", tmp_path / "c.md")
    assert code == 2 and "states no analysis, so the reading must state primary and margin" in err
    code, _, err = run_cli("claims", _reading(tmp_path, store, 'primary = "final"\nmargin = 0.05\n'),
                           "--out", tmp_path / "c.md")
    assert code == 0, err
    text = (tmp_path / "c.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| G costs less"))
    assert "(a reading: stored cells, no cell ran for it)" in row and "trained state x0.50" in row
    assert "final accuracy, margin +-0.05, stated by the reading, after its cells ran" in text


@pytest.mark.parametrize("text, message", [
    (READING.replace('stated = "2026-11-27"\n', ""), 'needs stated = "YYYY-MM-DD"'),
    (READING.replace("2026-11-27", "yesterday"), "is not a date"),
    (READING + "alpha = 0.1\n", "unknown key 'alpha' of [[cost_claims]]"),
    (READING.replace('control = "p"', 'control = "g"'), "the treatment and the control are one variant"),
    (READING.replace('treatment = "g"', 'treatment = "x"'), "has no variant 'x' on task 'pizza'"),
    ("name = [", "cannot read it as TOML"),
])
def test_a_bad_reading_is_one_line(tmp_path, run_cli, text, message):
    store = _write(tmp_path / "m", {"g": 0.0, "p": 0.0}, [], costs={"g": (1.0, 5), "p": (2.0, 10)})
    path = tmp_path / "reading.toml"
    path.write_text(text.format(store=store, extra=""))
    code, _, err = run_cli("claims", path, "--out", tmp_path / "c.md")
    assert code == 2 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_the_matrix_command_refuses_a_reading(run_cli, tmp_path):
    code, _, err = run_cli("matrix", ROOT / "benchmarks" / "matrices" / "claims_cost.toml", "--out", tmp_path / "o",
                           "--dry-run")
    assert code == 2 and "a reading of stored matrices ([[cost_claims]]), not a matrix" in err


def test_an_equal_claim_is_contradicted_only_outside_the_margin():
    # separated from 0 but inside +-0.02 is equal within the margin (was "contradicted"); straddling it, open
    assert inference.contrast_mark(0.004, 0.018, "equal", margin=0.02) == inference.SUPPORTED
    assert inference.contrast_mark(0.004, 0.025, "equal", margin=0.02) == inference.CLAIM_OPEN
    assert inference.contrast_mark(-0.03, -0.021, "equal", margin=0.02) == inference.CONTRADICTED
    assert inference.contrast_mark(0.004, 0.025, "equal", margin=None) == inference.CONTRADICTED


def test_bit_identical_runs_are_not_a_comparison():
    scores = _planted({"control": 0.0, "other": 0.03})
    scores["copy"] = dict(scores["control"])
    claims = [{"id": "a", "treatment": "copy", "control": "control", "expects": "equal"},
              {"id": "b", "treatment": "other", "control": "control", "expects": "better"}]
    table, _ = inference.contrasts(scores, claims, margin=0.03)
    assert list(table["mark"]) == [inference.IDENTICAL, inference.SUPPORTED]
