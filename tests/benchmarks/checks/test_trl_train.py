"""grpo-bench check trl-train: argument checks and the settings the command line builds (fast), and a one-step
end-to-end run (slow)."""

import json

import pytest

from benchmarks.cli.main import main


@pytest.mark.parametrize("argv", [["--steps", "0"], ["--seeds", "0"]])
def test_bad_counts_are_one_line_exit_2(argv, capsys):
    assert main(["check", "trl-train", *argv]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.mark.slow
def test_one_step_one_seed_writes_both_implementations(tmp_path):
    assert main(["check", "trl-train", "--steps", "2", "--seeds", "1", "--out", str(tmp_path)]) == 0
    runs = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert [r["impl"] for r in runs] == ["grpo-bench", "TRL GRPOTrainer"]
    assert all(len(r["rewards"]) == 2 and r["peak_memory_bytes"] > 0 for r in runs)
    assert runs[0]["accuracy_before"] == runs[1]["accuracy_before"]  # same model, same evaluation seed
    assert (tmp_path / "rewards.png").stat().st_size > 0


def test_the_command_line_hands_the_check_typed_settings_and_the_command_as_typed(monkeypatch):
    from benchmarks.checks import studies
    from benchmarks.checks.trl_train import TrlTrainSettings

    seen = []
    monkeypatch.setattr(studies, "run_trl_train_check", lambda settings, command: seen.append((settings, command)) or 0)
    assert main(["check", "trl-train", "--seeds", "1"]) == 0
    assert seen == [(TrlTrainSettings(seeds=1), "grpo-bench check trl-train --seeds 1")]
