"""pass@k in a run's summary (--pass-at-k, --pass-samples) and in ``grpo-bench eval`` against the starting policy;
bad values are one line and exit status 2."""

from __future__ import annotations

import json

import pytest

from benchmarks.errors import UsageError
from benchmarks.io import decode_correct
from benchmarks.passk import parse_ks


def test_parse_ks():
    assert parse_ks("16,1,4,4", None) == ((1, 4, 16), 16)
    assert parse_ks("1,4", 32) == ((1, 4), 32)
    assert parse_ks(None, None) == ((), 0)
    for text, samples, message in (("1,x", None, "comma-separated whole numbers"),
                                   ("0,4", None, "every k must be >= 1"),
                                   ("1,16", 8, r"--pass-samples \(8\) must be >= the largest k"),
                                   (None, 8, "give --pass-at-k too")):
        with pytest.raises(UsageError, match=message):
            parse_ks(text, samples)


def test_a_run_records_pass_at_k_before_and_after(run_cli, tmp_path):
    out = tmp_path / "run"
    code, _, err = run_cli("run", "--task", "pizza", "--algo", "grpo", "--steps", "2", "--eval-every", "0",
                           "--checkpoint-every", "0", "--eval-samples", "16", "--pass-at-k", "1,4,16",
                           "--pass-samples", "32", "--out", out, "--save-model")
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    for when in ("before", "after"):
        curve = summary[f"pass_at_k_{when}"]
        assert set(curve) == {"1", "4", "16"} and curve["1"] <= curve["4"] <= curve["16"] <= 1
        record = summary["eval_questions"][f"pass_at_k_{when}"]
        assert record["questions/samples"] == 32
        assert decode_correct(record["questions/correct"], 32) == [pytest.approx(curve["1"])]  # one question

    code, stdout, err = run_cli("eval", "--task", "pizza", "--eval-samples", "8", "--model", out / "final",
                                "--pass-at-k", "1,2", "--pass-samples", "8", "--out", tmp_path / "eval")
    assert code == 0, err
    passk = json.loads((tmp_path / "eval" / "eval.json").read_text())["pass_at_k"]
    assert set(passk) == {str(out / "final"), "pizza starting policy"}
    assert all(set(r["pass_at_k"]) == {"1", "2"} for r in passk.values())
    assert "pass@1 | pass@2" in stdout


def test_a_run_without_pass_at_k_records_none(run_cli, tmp_path):
    out = tmp_path / "run"
    assert run_cli("run", "--task", "pizza", "--algo", "grpo", "--steps", "1", "--eval-every", "0",
                   "--checkpoint-every", "0", "--eval-samples", "8", "--out", out)[0] == 0
    summary = json.loads((out / "summary.json").read_text())
    assert not any(k.startswith("pass_at_k") for k in summary)


@pytest.mark.parametrize("args, message", [
    (("--pass-at-k", "1,8", "--pass-samples", "4"), "--pass-samples (4) must be >= the largest k of --pass-at-k (8)"),
    (("--pass-samples", "4"), "--pass-samples is the samples per question of --pass-at-k; give --pass-at-k too"),
])
def test_bad_pass_at_k_is_one_line_and_exit_2(run_cli, tmp_path, args, message):
    code, _, err = run_cli("run", "--task", "pizza", "--algo", "grpo", "--steps", "1", "--out", tmp_path / "r", *args)
    assert code == 2 and message in err and "Traceback" not in err
    code, _, err = run_cli("eval", "--task", "pizza", *args)
    assert code == 2 and message in err and "Traceback" not in err
