"""The harness's adversary, one test per defect: two variant names for one folder, a resume that would shrink a
finished run or change its reward function, an empty prompt, a full disk while checkpointing, a reward
function that calls sys.exit. Each is one line and exit status 2, and the run on disk is left as it was."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil

import pytest
import torch

from benchmarks.io import read_jsonl
from tests.benchmarks.cli.test_main import assert_one_line_error

FAST = ("--eval-every", "0", "--checkpoint-every", "1", "--eval-samples", "8", "--device", "cpu")
GRPO = ("run", "--task", "pizza", "--algo", "grpo", "--group-size", "2", "--prompts-per-step", "1")
REWARDS = """\
def score(prompts, completions):
    return [float(c.startswith("pizza")) for c in completions]

def other(prompts, completions):
    return [100.0 * float(c.startswith("pizza")) for c in completions]

def quits(prompts, completions):
    import sys
    sys.exit(0)
"""


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 3-step pizza GRPO run with its own reward (rewards.py:score), checkpoints after steps 1 and 2."""
    from benchmarks.cli.main import main

    root = tmp_path_factory.mktemp("adversary")
    (root / "rewards.py").write_text(REWARDS)
    out = root / "finished"
    assert main([*GRPO, *FAST, "--steps", "3", "--reward-fn", f"{root / 'rewards.py'}:score", "--out", str(out)]) == 0
    return out


@pytest.fixture
def reward(finished):
    """The finished run's --reward-fn."""
    return f"{finished.parent / 'rewards.py'}:score"


def _files(run_dir):
    return {p.relative_to(run_dir): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file() and p.name != ".run.lock"}


# --- 1. two variant names, one folder -----------------------------------------------------------------


@pytest.mark.parametrize("tables, fragments", [
    ('[algorithms."fast lr"]\nalgo = "reinforce"\nlearning_rate = 0.01\n'
     '[algorithms.fast_lr]\nalgo = "reinforce"\nlearning_rate = 0.001\n',
     (":7: ", "'fast lr' and 'fast_lr'", "share the folder 'fast_lr'")),
    ('[algorithms.Fast]\nalgo = "reinforce"\n[algorithms.fast]\nalgo = "reinforce"\n',  # one folder on macOS
     (":6: ", "'Fast' and 'fast'",)),
    ('[tasks.pizza]\nmodel = ["m/a b", "m/a_b"]\n[algorithms.grpo]\n',
     (":3: ", "'pizza(model=m/a b) grpo seed 0' and 'pizza(model=m/a_b) grpo seed 0'",)),
])
def test_two_names_for_one_folder_are_refused(run_cli, tmp_path, tables, fragments):
    path = tmp_path / "m.toml"
    path.write_text("seeds = [0]\nbudget = 64\n" + ("" if "[tasks." in tables else "[tasks.pizza]\n") + tables)
    assert_one_line_error(run_cli("matrix", path, "--out", tmp_path / "out"), str(path), *fragments)
    assert not (tmp_path / "out").exists()


# --- 2. a finished run only grows ---------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["none", "no checkpoints", "unfinished"])
def test_resume_with_fewer_steps_is_refused_and_changes_nothing(run_cli, run_dir, reward, damage):
    if damage == "no checkpoints":  # resuming would start over: a fresh 2-step run in place of the 3-step one
        shutil.rmtree(run_dir / "checkpoints")
    if damage == "unfinished":  # killed after step 3: its rows are kept all the same
        (run_dir / "summary.json").unlink()
    before = _files(run_dir)
    result = run_cli(*GRPO, *FAST, "--steps", "2", "--reward-fn", reward, "--resume", "--out", run_dir)
    assert_one_line_error(result, "--resume with --steps 2, fewer than the 3 steps", str(run_dir))
    assert _files(run_dir) == before


# --- 3. the reward function is part of the run ----------------------------------------------------------


def test_resume_with_the_same_reward_function_continues(run_cli, run_dir, reward):
    code, _, err = run_cli(*GRPO, *FAST, "--steps", "4", "--reward-fn", reward, "--resume", "--out", run_dir)
    assert code == 0, err
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")] == [1, 2, 3, 4]


@pytest.mark.parametrize("change, fragments", [
    ("another function", ("rewards:score (source sha256 ", "-> rewards:other (source sha256 ")),
    ("its source edited", ("rewards:score (source sha256 ", "-> rewards:score (source sha256 ")),
    ("none", ("-> the task's own reward",)),
])
def test_resume_with_another_reward_function_is_refused(run_cli, run_dir, reward, tmp_path, change, fragments):
    if change == "another function":
        reward = reward.replace(":score", ":other")
    if change == "its source edited":  # the same module and name, another scale
        edited = tmp_path / "edited" / "rewards.py"
        edited.parent.mkdir()
        edited.write_text(REWARDS.replace("return [float(", "return [10 * float("))
        reward = f"{edited}:score"
    before = _files(run_dir)
    result = run_cli(*GRPO, *FAST, "--steps", "4", *(() if change == "none" else ("--reward-fn", reward)),
                     "--resume", "--out", run_dir)
    assert_one_line_error(result, f"--resume with another reward function than the run in {run_dir}", *fragments)
    assert _files(run_dir) == before


def test_resume_from_python_compares_a_lambda_by_its_code(pizza_model, tmp_path):
    """A lambda's source is the whole train(...) statement: its code is what is compared, so the same lambda
    in another call continues the run and another lambda is refused."""
    from benchmarks.api import train
    from benchmarks.errors import UsageError
    from tasks.base import load_pretrained

    model, tokenizer = load_pretrained(str(pizza_model))
    settings = dict(eval_samples=2, group_size=2, prompts_per_step=1, checkpoint_every=1, eval_every=0, progress=False,
                    out=tmp_path / "run")
    train(model, tokenizer, lambda p, c: [float(x == "pizza") for x in c], ["ravin likes "], steps=2, **settings)
    with pytest.raises(UsageError, match="another reward function .*<lambda> \\(code sha256 "):
        train(model, tokenizer, lambda p, c: [9.0 * (x == "pizza") for x in c], ["ravin likes "], steps=3,
              resume=True, **settings)
    result = train(model, tokenizer, lambda p, c: [float(x == "pizza") for x in c], ["ravin likes "], steps=3,
                   resume=True, **settings)
    assert [r["step"] for r in result.metrics] == [1, 2, 3]


# --- 8. an empty prompt ---------------------------------------------------------------------------------


def test_an_empty_prompt_from_python_is_one_task_error(pizza_model):
    from benchmarks.api import train
    from tasks import TaskError
    from tasks.base import load_pretrained

    model, tokenizer = load_pretrained(str(pizza_model))
    for prompts, eval_prompts, message in ((["ravin likes ", ""], None, "prompts[1] is empty"),
                                           (["ravin likes "], [""], "eval_prompts[0] is empty")):
        with pytest.raises(TaskError, match=r"^" + message.replace("[", r"\[")) as caught:
            train(model, tokenizer, lambda p, c: [0.0] * len(c), prompts, eval_prompts=eval_prompts, steps=1,
                  progress=False)
        assert "--" not in str(caught.value)  # the API's words, not the command line's flags


def test_an_empty_prompt_in_a_prompts_file_is_one_line(run_cli, pizza_model, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "ravin likes "}\n\n{"prompt": ""}\n')
    (tmp_path / "rewards.py").write_text(REWARDS)
    result = run_cli("run", "--task", "prompts", "--algo", "grpo", "--model", pizza_model, "--prompts", prompts,
                     "--reward-fn", f"{tmp_path / 'rewards.py'}:score", "--steps", "1", "--out", tmp_path / "run")
    assert_one_line_error(result, f"{prompts}:3: the prompt must be a non-empty string, got ''")


# --- 9. a full disk while checkpointing ---------------------------------------------------------------


def test_a_full_disk_while_checkpointing_is_one_line_and_keeps_the_older_checkpoint(run_cli, tmp_path, monkeypatch):
    saves = []
    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        """The second checkpoint meets a full disk as torch.save reports it: a RuntimeError, the OSError its context."""
        saves.append(obj["step"])
        if len(saves) < 2:
            return real_save(obj, f, *args, **kwargs)
        with open(f, "wb") if isinstance(f, (str, os.PathLike)) else contextlib.nullcontext(f) as file:
            file.write(b"half a checkpoint")
        try:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    monkeypatch.setattr(torch, "save", save)
    out = tmp_path / "run"
    result = run_cli(*GRPO, *FAST, "--steps", "4", "--out", out)
    newest = out / "checkpoints" / "step_0000002.pt"
    code, printed, err = result  # the progress line says where the run stopped; then the one error line
    assert_one_line_error((code, printed, re.sub(r"(?m)^pizza/grpo seed 0: 2/4 steps, .*\n", "", err)),
                          f"{newest}: cannot write the checkpoint: No space left on device")
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_0000001.pt"]  # no half-written file
    assert torch.load(out / "checkpoints" / "step_0000001.pt", weights_only=False)["step"] == 1
    assert not (out / "summary.json").exists()
    monkeypatch.undo()  # space again: the run continues from the checkpoint it kept
    code, _, err = run_cli(*GRPO, *FAST, "--steps", "4", "--resume", "--out", out)
    assert code == 0, err
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [1, 2, 3, 4]


# --- 12. a reward function that exits ------------------------------------------------------------------


def test_a_reward_function_calling_sys_exit_is_a_reward_error(run_cli, tmp_path):
    (tmp_path / "rewards.py").write_text(REWARDS)
    result = run_cli(*GRPO, *FAST, "--steps", "1", "--reward-fn", f"{tmp_path / 'rewards.py'}:quits",
                     "--out", tmp_path / "run")
    assert_one_line_error(result, "reward function quits called sys.exit(0)")
    assert not (tmp_path / "run" / "summary.json").exists()


def test_a_second_run_with_other_settings_gets_a_hint_that_works(tmp_path):
    """--resume would be refused for a run with other settings: the hint names the difference and the way out."""
    from benchmarks.api import train
    from benchmarks.errors import UsageError

    out = tmp_path / "r"
    train(task="pizza", algo="grpo", steps=1, out=str(out), learning_rate=1e-3)
    with pytest.raises(UsageError, match=r"holds a finished run with other settings \(learning_rate 0.001 -> 0.002\): "
                                         r"give this run its own --out, or --overwrite replaces that one"):
        train(task="pizza", algo="grpo", steps=1, out=str(out), learning_rate=2e-3)
    with pytest.raises(UsageError, match="holds a finished run: --resume continues it"):
        train(task="pizza", algo="grpo", steps=1, out=str(out), learning_rate=1e-3)
