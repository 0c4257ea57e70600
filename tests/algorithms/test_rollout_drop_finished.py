"""Greedy decoding that stops computing finished rows (``generate(drop_finished=True)``, Reasoning Gym's
``eval_drop_finished``): the same tokens as decoding every row to the end, with rows of many lengths, groups, padded
prompts and a shared prefix, and only greedy decoding may ask for it."""

from __future__ import annotations

import pytest
import torch

from algorithms import rollout as rollout_lib
from algorithms.rollout import generate
from tasks.tiny_lm import char_tokenizer, tiny_llama
from tests.algorithms.test_fast_llama import needs_gguf


def _model_that_stops_at_different_lengths():
    """A tiny Llama with weights drawn wide enough (sd 0.3) that greedy rows depend on their prompt: on PROMPTS they
    end after 1 to 15 tokens, and 3 of 12 never end (so a batch would otherwise decode every row to the cap)."""
    tokenizer = char_tokenizer(list("abcdefgh="))
    model = tiny_llama(tokenizer, seed=0).eval()
    draws = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for weight in model.parameters():
            if weight.dim() == 2:
                weight.copy_(torch.randn(weight.shape, generator=draws) * 0.3)
    return model, tokenizer


PROMPTS = ["a=", "bb=", "cab=", "h=", "gfe=", "dd=", "abcdefg=", "e=", "fh=", "ccc=", "g=", "hab="]


@pytest.mark.parametrize("group_size", [1, 3])
@pytest.mark.parametrize("share_prefix", [False, True])
def test_dropping_finished_rows_decodes_the_same_tokens(group_size, share_prefix, monkeypatch):
    model, tokenizer = _model_that_stops_at_different_lengths()
    prompts = ["xy" + p for p in PROMPTS] if share_prefix else PROMPTS  # 'x', 'y': unknown characters, one shared token
    every = generate(model, tokenizer, prompts, group_size, max_new_tokens=20, temperature=0.0, share_prefix=share_prefix)
    lengths = every.completion_mask.sum(1)
    # the case this is for: rows that end early beside rows that run to the cap
    assert int(lengths.min()) < 10 and bool(every.truncated.any()) and not bool(every.truncated.all())

    kept = []
    keep = rollout_lib._LeanDecode.keep
    monkeypatch.setattr(rollout_lib._LeanDecode, "keep", lambda self, rows: (kept.append(rows.numel()), keep(self, rows))[1])
    dropped = generate(model, tokenizer, prompts, group_size, max_new_tokens=20, temperature=0.0,
                       share_prefix=share_prefix, drop_finished=True)
    assert kept and kept[-1] < every.completion_ids.size(0)  # it did compact the batch
    assert torch.equal(dropped.completion_ids, every.completion_ids)
    assert torch.equal(dropped.completion_mask, every.completion_mask)
    assert torch.equal(dropped.truncated, every.truncated)
    assert dropped.completions == every.completions


def test_sampling_and_recorded_log_probs_cannot_drop_rows():
    model, tokenizer = _model_that_stops_at_different_lengths()
    with pytest.raises(ValueError, match="greedy"):
        generate(model, tokenizer, PROMPTS, 2, max_new_tokens=8, temperature=1.0, drop_finished=True,
                 generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="log-probs"):
        generate(model, tokenizer, PROMPTS, 2, max_new_tokens=8, temperature=0.0, drop_finished=True, record_logps=True)


def test_the_task_asks_for_it_only_when_greedy():
    """Reasoning Gym's evaluation hands the sampler drop_finished when the option is on and decoding is greedy."""
    from tasks.base import Samples
    from tasks.reasoning_gym import ReasoningGymTask

    calls = []

    def record(model, tokenizer, prompts, *, k, max_new_tokens, temperature, seed, **options):
        calls.append((temperature, options))
        return Samples([["1"] * k for _ in prompts], [[False] * k for _ in prompts], len(prompts) * k)

    task = ReasoningGymTask.__new__(ReasoningGymTask)  # the routing alone: no dataset, no model
    task.eval_batch, task.eval_share_prefix, task.tokenizer = 8, False, None
    task.generation = type("Generation", (), {"max_new_tokens": 4})()
    task.eval_sampler = record
    for drop in (True, False):
        task.eval_drop_finished = drop
        for temperature in (0.0, 1.0):
            task.sample(None, ["q"], k=1, temperature=temperature, seed=0)
    assert calls == [(0.0, {"drop_finished": True}), (1.0, {}), (0.0, {}), (1.0, {})]


@pytest.mark.slow  # loads SmolLM2-135M and decodes 64 questions twice: about a minute
@needs_gguf
def test_the_real_model_gives_the_same_greedy_answers():
    from tasks import make_task

    task = make_task("reasoning_gym", dataset='chain_sum:{"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}',
                     eval_problems=64, held_out=64, train_problems=50)
    model = task.load_policy(torch.device("cpu"))
    prompts = list(task.eval_prompts)
    every = generate(model, task.tokenizer, prompts, 1, max_new_tokens=24, temperature=0.0, share_prefix=True)
    dropped = generate(model, task.tokenizer, prompts, 1, max_new_tokens=24, temperature=0.0, share_prefix=True,
                       drop_finished=True)
    assert dropped.completions == every.completions
