"""grpo-bench transfer: a toy matrix's ranking against a real one's, Kendall's tau-b with its exact p-value
and the smallest tau its number of algorithms can call. The committed tuned verdict matrix is read once
(its analysis takes seconds); the other tests hand the report that table, or a made-up one."""

import pandas as pd
import pytest

from benchmarks.report import transfer as transfer_module
from benchmarks.report.matrix import matrix_verdicts
from benchmarks.report.transfer import smallest_significant_tau, transfer

TUNED = "results/verdicts-tuned"
SIX = ["reinforce", "reinforce_pp_baseline", "rloo", "dapo", "remax", "dpo"]  # by their committed means, high to low


@pytest.fixture(scope="module")
def tuned_verdicts():
    return matrix_verdicts(TUNED)


@pytest.fixture
def committed(monkeypatch, tuned_verdicts):
    monkeypatch.setattr(transfer_module, "matrix_verdicts", lambda directory: tuned_verdicts)


def test_smallest_significant_tau_matches_the_exact_tables():
    # Two-sided 5% critical values of Kendall's tau for n untied items (exact null distribution).
    assert smallest_significant_tau(4) is None
    assert smallest_significant_tau(5) == pytest.approx(1.0)
    assert smallest_significant_tau(6) == pytest.approx(13 / 15)
    assert smallest_significant_tau(10) == pytest.approx(23 / 45)


def test_a_matrix_against_itself_carries_over_and_reversed_it_does_not(committed):
    same = transfer(TUNED, TUNED, [(v, v) for v in SIX])
    assert same["tau"] == pytest.approx(1.0) and same["p_value"] < 0.01 and same["n"] == 6
    assert list(same["table"]["toy_rank"]) == list(same["table"]["real_rank"]) == [1, 2, 3, 4, 5, 6]
    reversed_ = transfer(TUNED, TUNED, list(zip(SIX, reversed(SIX))))
    assert reversed_["tau"] == pytest.approx(-1.0)


def test_the_report_states_the_verdict_and_the_power(tmp_path, run_cli, committed):
    out = tmp_path / "transfer.md"
    pairs = [arg for v in SIX[:5] for arg in ("--pair", v, v)]
    code, stdout, _ = run_cli("transfer", TUNED, TUNED, *pairs, "--out", out)
    assert code == 0
    text = out.read_text()
    assert "**The toy ranking carries over: Kendall's tau-b +1.00 (p 0.02; with 5 algorithms only tau >= 1.00" in text
    assert "the toy's first of these, reinforce, is also in addition's could-be-best set" in text
    assert text.count("\n| ") == 6  # the header and five algorithms (the rule starts "|---")


def _made_up(task, rows):
    return pd.DataFrame([{"task": task, "variant": v, "seeds": 3, "final_mean": m, "final_mean_low": m - 0.05,
                          "final_mean_high": m + 0.05, "mark": mark, "in_best_set": mark != "worse"} for v, m, mark in rows])


def test_a_toy_winner_outside_the_real_best_group_is_said(tmp_path, monkeypatch):
    toy = _made_up("addition", [("a", 0.9, "best"), ("b", 0.8, "worse"), ("c", 0.7, "worse"), ("d", 0.6, "worse")])
    real = _made_up("chain_sum", [("a", 0.3, "worse"), ("b", 0.5, "not resolved"), ("c", 0.45, "not resolved"),
                                  ("d", 0.2, "worse")])
    monkeypatch.setattr(transfer_module, "matrix_verdicts", lambda d: toy if d.name == "toy" else real)
    result = transfer(tmp_path / "toy", tmp_path / "real", [(v, v) for v in "abcd"])
    # Concordant pairs: (b, c), (b, d), (c, d), (a, d); discordant: (a, b), (a, c). tau = (4 - 2) / 6.
    assert result["tau"] == pytest.approx(1 / 3)
    assert result["tau_needed"] is None
    text = transfer_module.headline(result)
    assert "is not shown to carry over: Kendall's tau-b +0.33" in text
    assert "with 4 algorithms no ranking reaches p < 0.05" in text
    assert "the toy's first of these, a, is not in chain_sum's could-be-best set; first on chain_sum: b." in text


@pytest.mark.parametrize("args, message", [
    (["--pair", "rloo", "rloo", "--pair", "dapo", "dapo"], "a ranking needs at least 3 algorithms, got 2"),
    (["--pair", "rloo", "rloo", "--pair", "dapo", "dapo", "--pair", "nope", "dpo"], "no finished cells for results/verdicts-tuned: nope"),
    (["--pair", "rloo", "rloo", "--pair", "dapo", "rloo", "--pair", "dpo", "dpo"], "each variant at most once on each side"),
])
def test_bad_input_is_one_line(tmp_path, run_cli, committed, args, message):
    code, _, err = run_cli("transfer", TUNED, TUNED, *args, "--out", tmp_path / "t.md")
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_not_a_matrix_directory_is_one_line(tmp_path, run_cli):
    pairs = [arg for v in SIX[:3] for arg in ("--pair", v, v)]
    code, _, err = run_cli("transfer", TUNED, tmp_path, *pairs, "--out", tmp_path / "t.md")
    assert code == 2 and f"{tmp_path}: not a matrix directory (no matrix.json)" in err
