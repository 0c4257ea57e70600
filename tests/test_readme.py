"""The README's set-up commands are the ones CI runs (.ci/run reads them from the README)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands():
    spec = importlib.util.spec_from_file_location("readme_commands", ROOT / ".ci" / "readme_commands.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_has_the_two_commands_ci_runs():
    module = _readme_commands()
    commands = module.commands()
    assert commands["main"].startswith("pip install torch==2.13.0 && pip install -e .")
    assert module.DEFAULT_MATRIX in commands["main"] and module.DEFAULT_OUT in commands["main"]
    assert (ROOT / module.DEFAULT_MATRIX).is_file()
    assert commands["tests"].startswith("pip install torch==2.13.0 && ") and commands["tests"].endswith("pytest tests")


def test_ci_runs_the_readme_commands_not_a_copy():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "readme_commands.py main" in ci and "readme_commands.py tests" in ci
    assert "python3 -m venv" in ci  # a fresh environment, not the machine's Python
    commands = _readme_commands().commands()
    assert commands["tests"] not in ci and commands["main"] not in ci


def test_ci_runs_the_main_job_as_written_into_a_scratch_directory(capsys):
    module = _readme_commands()
    module.main(["main", "--out", "/tmp/x"])
    command = capsys.readouterr().out.strip()
    assert module.DEFAULT_MATRIX in command and "--out /tmp/x" in command and module.DEFAULT_OUT not in command
    module.main(["main", "--matrix", "benchmarks/matrices/smoke.toml", "--out", "/tmp/x"])
    command = capsys.readouterr().out.strip()
    assert "benchmarks/matrices/smoke.toml" in command and "default.toml" not in command
