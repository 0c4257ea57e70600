"""Every bad input gets one clear line and exit status 2, never a traceback."""

import textwrap

import pytest

import torch


def assert_one_line_error(result, *fragments):
    code, _, err = result
    assert code == 2, err
    lines = [l for l in err.strip().splitlines() if l.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("grpo-bench: error: ")
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


BASE = ("run", "--task", "pizza", "--algo", "grpo", "--steps", "1", "--eval-every", "0", "--checkpoint-every", "0")


@pytest.mark.parametrize(
    "args, fragments",
    [
        (("run", "--task", "chess", "--algo", "grpo"), ("unknown task 'chess'", "pizza")),
        (("run", "--task", "pizza", "--algo", "sac"), ("unknown algorithm 'sac'", "grpo")),
        (BASE + ("--level", "word"), ("--level", "word")),
        (BASE + ("--loss-type", "ppo"), ("--loss-type", "ppo")),
        (BASE + ("--group-size", "1"), ("group_size must be >= 2",)),
        (BASE + ("--mu", "0"), ("mu must be >= 1",)),
        (("run", "--task", "pizza", "--algo", "grpo", "--steps", "0"), ("--steps must be >= 1",)),
        (BASE + ("--epsilon", "-0.1"), ("epsilon must be >= 0",)),
        (BASE + ("--beta", "-1"), ("beta must be >= 0",)),
        (BASE + ("--model", "/nonexistent/model/dir"), ("cannot load a causal LM from '/nonexistent/model/dir'",)),
        (BASE + ("--reward-mode", "fuzzy"), ("no reward mode 'fuzzy'",)),
        (BASE + ("--steps", "many"), ("--steps", "many")),
        (BASE + ("--reward-fn", "no_colon_here"), ("MODULE:FUNC",)),
    ],
)
def test_bad_input_one_line_exit_2(run_cli, tmp_path, args, fragments):
    assert_one_line_error(run_cli(*args, "--out", tmp_path / "run"), *fragments)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda(run_cli, tmp_path):
    assert_one_line_error(run_cli(*BASE, "--device", "cuda", "--out", tmp_path), "CUDA is not available")


BAD_REWARDS = textwrap.dedent(
    """
    def raises(prompts, completions):
        raise ZeroDivisionError("division by zero in my reward")

    def nan(prompts, completions):
        return [float("nan")] * len(completions)

    def too_few(prompts, completions):
        return [1.0] * (len(completions) - 1)

    def text(prompts, completions):
        return ["good"] * len(completions)
    """
)


@pytest.mark.parametrize(
    "func, fragments",
    [
        ("raises", ("reward function raises raised ZeroDivisionError", "division by zero in my reward")),
        ("nan", ("reward function nan returned nan for completion 0",)),
        ("too_few", ("reward function too_few returned 255 values for 256 completions",)),  # caught at evaluation
        ("text", ("reward function text returned non-numeric values",)),
    ],
)
def test_misbehaving_reward_functions_are_named(run_cli, tmp_path, func, fragments):
    module = tmp_path / "my_rewards.py"
    module.write_text(BAD_REWARDS)
    result = run_cli(*BASE, "--reward-fn", f"{module}:{func}", "--out", tmp_path / "run")
    assert_one_line_error(result, *fragments)


def test_a_package_that_takes_one_of_our_import_names_is_one_line(tmp_path):
    """grpo-bench installs algorithms, tasks and benchmarks as top-level names: a shadowing package is refused."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "shadow" / "tasks").mkdir(parents=True)
    (tmp_path / "shadow" / "tasks" / "__init__.py").write_text("")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "shadow"), str(root)])}
    shadowed = subprocess.run([sys.executable, "-m", "benchmarks.cli.main", "--help"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
    assert_one_line_error((shadowed.returncode, shadowed.stdout, shadowed.stderr),
                          "the import name 'tasks' is not grpo-bench's", str(tmp_path / "shadow" / "tasks"))
    env["PYTHONPATH"] = str(root)  # the same command without the shadow starts
    clean = subprocess.run([sys.executable, "-m", "benchmarks.cli.main", "--help"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
    assert clean.returncode == 0 and "usage: grpo-bench" in clean.stdout
