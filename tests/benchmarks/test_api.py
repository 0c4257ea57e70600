"""The Python API: the README's snippet (its ```python block, run verbatim) learns pizza and matches
`grpo-bench run` with the same seed and settings metric for metric; --model takes a save_pretrained
directory; the prompts task uses a chat template when the tokenizer has one and says which it used."""

import json
import runpy
from pathlib import Path

from benchmarks.io import read_jsonl
from tasks.pizza import PizzaTask
from tests.conftest import ROOT, strip_timing

README = ROOT / "README.md"


def _readme_snippet(tmp_path: Path) -> Path:
    """The README's ```python block, verbatim, as a file to run."""
    import re

    block = re.search(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    assert block, "the README has no ```python block"
    path = tmp_path / "readme_snippet.py"
    path.write_text(block.group(1))
    return path
SAME_RUN = ("run", "--task", "pizza", "--algo", "grpo", "--learning-rate", "1e-3", "--steps", "8",
            "--max-new-tokens", "12", "--eval-samples", "32", "--seed", "0")


def test_snippet_learns_and_matches_the_command_line(run_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runpy.run_path(str(_readme_snippet(tmp_path)))["result"]
    s = result.summary
    assert s["accuracy_after"] > s["accuracy_before"]
    assert result.metrics == read_jsonl(tmp_path / "runs/pizza-api/metrics.jsonl")
    code, _, err = run_cli(*SAME_RUN, "--out", tmp_path / "cli")
    assert code == 0, err
    cli = json.loads((tmp_path / "cli" / "summary.json").read_text())
    assert strip_timing(result.metrics) == strip_timing(read_jsonl(tmp_path / "cli" / "metrics.jsonl"))
    for key in ("accuracy_before", "accuracy_after", "reward_before", "reward_after", "steps", "tokens_generated",
                "param_bytes", "grad_bytes", "optimizer_bytes"):
        assert s[key] == cli[key], key
    assert s["config"]["task"]["prompt_format"] == "plain text (the tokenizer has no chat template)"


def _save_pizza_model(path: Path, chat_template=None):
    task = PizzaTask(eval_samples=1)
    model, tokenizer = task.load_policy("cpu"), task.tokenizer
    if chat_template:
        tokenizer.chat_template = chat_template
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


def test_model_from_a_save_pretrained_directory(run_cli, tmp_path):
    _save_pizza_model(tmp_path / "model")
    code, _, err = run_cli("run", "--task", "pizza", "--algo", "grpo", "--model", tmp_path / "model", "--steps", "2",
                           "--eval-samples", "32", "--out", tmp_path / "a")
    assert code == 0, err
    code, _, err = run_cli("run", "--task", "pizza", "--algo", "grpo", "--steps", "2", "--eval-samples", "32",
                           "--out", tmp_path / "b")
    assert code == 0, err
    same = [strip_timing(read_jsonl(tmp_path / d / "metrics.jsonl")) for d in "ab"]
    assert same[0] == same[1]  # the saved copy is the same model
    assert json.loads((tmp_path / "a" / "config.json").read_text())["task"]["model"] == str(tmp_path / "model")


def test_prompts_task_from_the_command_line_uses_the_chat_template(run_cli, tmp_path):
    _save_pizza_model(tmp_path / "model", chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}")
    (tmp_path / "prompts.txt").write_text("ravin likes \nalice likes \n")
    (tmp_path / "rewards.py").write_text("def score(prompts, completions):\n"
                                         "    return [float(c == 'pizza') for c in completions]\n")
    code, _, err = run_cli("run", "--task", "prompts", "--algo", "grpo", "--model", tmp_path / "model",
                           "--prompts", tmp_path / "prompts.txt", "--reward-fn", f"{tmp_path / 'rewards.py'}:score",
                           "--steps", "2", "--max-new-tokens", "12", "--eval-samples", "4", "--out", tmp_path / "run")
    assert code == 0, err
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["task"]["prompt_format"] == "the tokenizer's chat template (one user message)"
    assert config["task"]["train_prompts"] == 2 and config["sampling"]["max_new_tokens"] == 12


def test_the_python_api_names_settings_as_keywords_not_flags():
    """An error from Python names the keyword the caller wrote ('steps'), not a command-line flag (--steps)."""
    import pytest

    from benchmarks.api import train
    from benchmarks.errors import UsageError

    for kwargs, message in [({"steps": 0}, "'steps' must be >= 1, got 0"), ({"seed": -1}, "'seed' must be an integer"),
                            ({"nproc": 0}, "'nproc' must be >= 1, got 0")]:
        with pytest.raises(UsageError, match=message) as info:
            train(task="pizza", algo="grpo", **kwargs)
        assert "--" not in str(info.value)
