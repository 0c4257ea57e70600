"""Encoding the prompts' common prefix once (``generate(share_prefix=True)``, Reasoning Gym's ``eval_share_prefix``):
the same next-token logits at every decoding step to float rounding, on prompts of different lengths, with groups,
and the same greedy answers from the real model."""

from __future__ import annotations

import pytest
import torch

from algorithms.rollout import _lean_sampler, _prefill, shared_prefix_length
from tests.algorithms.test_fast_llama import _gqa_llama, needs_gguf


def _batch(prefix: int, own: list[int], vocab: int = 50):
    """Left-padded prompts that share ``prefix`` leading tokens, then ``own[i]`` tokens of their own."""
    g = torch.Generator().manual_seed(3)
    common = torch.randint(3, vocab, (prefix,), generator=g)
    rows = [torch.cat([common, torch.randint(3, vocab, (n,), generator=g)]) for n in own]
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):], mask[i, width - len(r):] = r, 1
    return ids, mask


def test_the_shared_length_leaves_every_row_a_token_of_its_own():
    ids, mask = _batch(10, [1, 3, 5])
    assert shared_prefix_length(ids, mask) == 10
    ids, mask = _batch(10, [0, 4])  # the first prompt is the prefix itself: one token stays its own
    assert shared_prefix_length(ids, mask) == 9
    ids, mask = _batch(0, [4, 6])
    assert shared_prefix_length(ids, mask) == 0


@pytest.mark.parametrize("own, group_size", [([1, 3, 5], 1), ([2, 2, 6, 1], 3), ([4, 4], 2)])
def test_shared_and_whole_prompts_decode_alike(own, group_size):
    model = _gqa_llama().eval()
    ids, mask = _batch(12, own)
    steps = 6
    with torch.no_grad():
        lean = _lean_sampler(model, torch.device("cpu"), ids.size(0) * group_size)
        assert lean is not None
        whole, decode_whole = _prefill(model, lean, ids, mask, group_size, steps)
        shared, decode_shared = _prefill(model, lean, ids, mask, group_size, steps, share_prefix=True)
        torch.testing.assert_close(shared, whole, atol=1e-5, rtol=1e-5)
        for step in range(steps - 1):
            token = whole.argmax(-1, keepdim=True)  # the same tokens fed to both
            whole, shared = decode_whole(step, token).float(), decode_shared(step, token).float()
            torch.testing.assert_close(shared, whole, atol=1e-5, rtol=1e-5)


def test_a_prefix_too_short_to_share_is_the_whole_prompt_path():
    model = _gqa_llama().eval()
    ids, mask = _batch(4, [3, 5])
    with torch.no_grad():
        lean = _lean_sampler(model, torch.device("cpu"), 2)
        whole, _ = _prefill(model, lean, ids, mask, 1, 3)
        shared, _ = _prefill(model, lean, ids, mask, 1, 3, share_prefix=True)
    assert torch.equal(shared, whole)  # under SHARED_PREFIX_MIN_TOKENS: one call, bit for bit


@pytest.mark.slow  # loads SmolLM2-135M and decodes 16 questions twice: about 30 s
@needs_gguf
def test_the_real_model_gives_the_same_greedy_answers():
    from tasks import make_task
    from algorithms.rollout import generate

    task = make_task("reasoning_gym", dataset='chain_sum:{"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}',
                     eval_problems=16, held_out=16, train_problems=50)
    model = task.load_policy(torch.device("cpu"))
    prompts = list(task.eval_prompts)
    whole = generate(model, task.tokenizer, prompts, 1, max_new_tokens=24, temperature=0.0)
    shared = generate(model, task.tokenizer, prompts, 1, max_new_tokens=24, temperature=0.0, share_prefix=True)
    assert shared.completions == whole.completions
    assert torch.equal(shared.completion_ids, whole.completion_ids)
