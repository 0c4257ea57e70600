"""GSM8K's evaluation decoding options ``eval_share_prefix`` and ``eval_drop_finished`` (Reasoning Gym's, through
``Task.eval_sampler_options``): what the evaluation hands its sampler, what describe() records, and the same greedy
answers from the harness's shared sampler with both on as with both off.

No SmolLM: the tokenizer is a character tokenizer without a chat template (prompts are then plain text, the system
prompt their shared prefix), the questions a small local file.
"""

from __future__ import annotations

import json
import string

import pytest
import torch

from tasks import gsm8k
from tasks.base import EVAL_DECODING_HELP, Samples
from tasks.tiny_lm import char_tokenizer, tiny_llama

QUESTIONS = ["a", "bb", "cab", "h", "gfe", "dd", "abcdefg", "e", "fh", "ccc", "g", "hab"]


@pytest.fixture
def tokenizer(monkeypatch):
    tokenizer = char_tokenizer(list(string.printable))
    monkeypatch.setattr(gsm8k, "load_tokenizer", lambda model=None: tokenizer)
    return tokenizer


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "gsm8k.jsonl"  # train and test alike
    path.write_text("".join(json.dumps({"question": q, "answer": f"x\n#### {i}"}) + "\n" for i, q in enumerate(QUESTIONS)))
    return str(path)


def _answers(prompts, k):
    return Samples([["<answer>1</answer>"] * k for _ in prompts], [[False] * k for _ in prompts], len(prompts) * k)


def _recorder(calls):
    def sampler(model, tokenizer, prompts, *, k, max_new_tokens, temperature, seed, **options):
        calls.append((temperature, options))
        return _answers(prompts, k)
    return sampler


@pytest.mark.parametrize("share, drop, temperature, expected", [
    (False, False, 0.0, {}),
    (True, False, 0.0, {"share_prefix": True}),
    (False, True, 0.0, {"drop_finished": True}),
    (True, True, 0.0, {"share_prefix": True, "drop_finished": True}),
    (True, True, 0.7, {"share_prefix": True}),  # sampling never drops rows (generate refuses it)
    (False, True, 0.7, {}),
])
def test_the_installed_sampler_gets_the_options_that_are_on(tokenizer, data, share, drop, temperature, expected):
    task = gsm8k.GSM8KTask(data=data, eval_questions=5, eval_batch=2, eval_temperature=temperature,
                           eval_share_prefix=share, eval_drop_finished=drop)
    calls = []
    task.eval_sampler = _recorder(calls)
    task.evaluate(None, seed=0)
    assert calls == [(temperature, expected)] * 3  # every batch of 2, 2 and 1 questions


def test_transformers_generate_gets_neither(tokenizer, data, monkeypatch):
    calls = []

    def sample_batched(model, tokenizer, prompts, *, k, max_new_tokens, temperature, seed):  # takes neither option
        calls.append(len(prompts))
        return _answers(prompts, k)

    monkeypatch.setattr(gsm8k, "sample_batched", sample_batched)
    task = gsm8k.GSM8KTask(data=data, eval_questions=3, eval_temperature=0.0, eval_share_prefix=True,
                           eval_drop_finished=True)
    assert task.eval_sampler is None and task.eval_sampler_options(0.0) == {}
    task.evaluate(None, seed=0)
    assert calls == [3]


def test_the_options_are_task_options_and_recorded(tokenizer, data):
    options = gsm8k.GSM8KTask.options()
    for name in ("eval_share_prefix", "eval_drop_finished"):
        assert options[name].kind is bool and options[name].default is False
        assert options[name].help == EVAL_DECODING_HELP[name]
    described = gsm8k.GSM8KTask(data=data, eval_questions=2).describe()
    assert described["eval_share_prefix"] is False and described["eval_drop_finished"] is False
    described = gsm8k.GSM8KTask(data=data, eval_questions=2, eval_share_prefix=True, eval_drop_finished=True).describe()
    assert described["eval_share_prefix"] is True and described["eval_drop_finished"] is True


def test_the_shared_sampler_gives_the_same_greedy_answers_with_both_on(tokenizer, data, monkeypatch):
    """The harness's sampler on a tiny Llama whose wide weights (sd 0.3) end greedy rows at different lengths: the
    evaluation with both options on drops finished rows and encodes the system prompt once, and answers the same."""
    from algorithms import rollout as rollout_lib
    from benchmarks.harness.loop import rollout_sampler

    model = tiny_llama(tokenizer, max_positions=512, seed=0).eval()
    draws = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for weight in model.parameters():
            if weight.dim() == 2:
                weight.copy_(torch.randn(weight.shape, generator=draws) * 0.3)
    kept = []
    keep = rollout_lib._LeanDecode.keep
    monkeypatch.setattr(rollout_lib._LeanDecode, "keep", lambda self, rows: (kept.append(rows.numel()), keep(self, rows))[1])
    runs = {}
    for on in (False, True):
        task = gsm8k.GSM8KTask(data=data, eval_questions=8, eval_batch=8, eval_temperature=0.0, eval_max_new_tokens=20,
                               eval_share_prefix=on, eval_drop_finished=on)
        calls = []

        def sampler(*args, **kwargs):
            calls.append({k: kwargs[k] for k in ("share_prefix", "drop_finished") if k in kwargs})
            return rollout_sampler(*args, **kwargs)

        task.eval_sampler = sampler
        runs[on] = task.evaluate(model, seed=0)
        assert calls == [{"share_prefix": True, "drop_finished": True} if on else {}]
        assert bool(kept) == on  # only the run with drop_finished compacted its batch
    every, both = runs[False].per_question, runs[True].per_question
    # the case this is for: rows that end early beside rows that run to the cap
    assert any(t == [True] for t in every["truncated"]) and any(t == [False] for t in every["truncated"])
    assert both["completions"] == every["completions"] and both["truncated"] == every["truncated"]
    assert runs[True]["accuracy"] == runs[False]["accuracy"]
    assert runs[True]["tokens_per_completion"] == runs[False]["tokens_per_completion"]
