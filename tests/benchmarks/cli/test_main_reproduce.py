"""A recorded command reproduces its result: run it again, as typed, in the same directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from benchmarks.io import read_jsonl
from tests.conftest import strip_timing

RUN = ["run", "--task", "pizza", "--algo", "grpo", "--steps", "3", "--eval-samples", "16", "--eval-every", "0",
       "--checkpoint-every", "2", "--device", "cpu", "--seed", "1", "--out", "runs/pizza grpo"]


def replay(command: str, cwd: Path) -> None:
    """``command`` through the shell in ``cwd``, with this interpreter's grpo-bench and thread count
    (bit-identical metrics need the same thread count)."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "OMP_NUM_THREADS": str(torch.get_num_threads())}
    done = subprocess.run(command, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def test_a_run_records_the_command_that_reproduces_it(tmp_path, monkeypatch, run_cli):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(*RUN)
    assert code == 0, err
    first = Path("runs/pizza grpo")
    config = json.loads((first / "config.json").read_text())
    command = config["run"]["command"]
    assert command == "grpo-bench " + " ".join(RUN[:-1]) + " 'runs/pizza grpo'"  # quoted for the shell
    assert "command" not in config["settings"]  # how a run was asked for is no setting of it
    first.rename("original")
    replay(command, tmp_path)
    rows = strip_timing(read_jsonl(Path("original/metrics.jsonl")))
    assert len(rows) == 3 and strip_timing(read_jsonl(first / "metrics.jsonl")) == rows


def test_a_resume_typed_differently_is_accepted_and_recorded(tmp_path, run_cli):
    out = tmp_path / "run"
    assert run_cli(*RUN[:-1], out)[0] == 0
    code, _, err = run_cli(*RUN[:-1], out, "--resume", "--steps", "4")
    assert code == 0, err
    config = json.loads((out / "config.json").read_text())
    assert config["run"]["command"].endswith("--resume --steps 4")
    assert config["resumed"][-1]["changed"] == {"resume": [False, True], "steps": [3, 4]}
