"""``preference_pairs(..., max_samples=)``: DPO's pairs from at most the sample budget every other algorithm gets.

Every task's pair builder takes the cap the same way (``tasks.base.prompts_that_fit``): a round that would pass it
samples only the first prompts (bandit: contexts) of its seeded draw whose samples all fit, and building stops when
not one prompt's do. A cap below one prompt's samples leaves no pair: the "no preference pairs" TaskError line,
which then names the cap (the bandit, which returns no pairs uncapped as before, raises it too when capped). The
base builder (pizza), whose samples a prompt follow from n_pairs rather than a fixed k, first shrinks them (to as
few as 2) so that one round of every prompt fits the cap.

Built cheaply and offline: pizza and the bandit sample their shipped toy models; addition, reasoning_gym and gsm8k
get a stub sampler (each completion drawn, seeded by prompt, seed and index, from a right and a wrong answer), and
reasoning_gym and gsm8k a stub tokenizer without a chat template and (gsm8k) a small local question file.
"""

from __future__ import annotations

import json
import random
import string

import pytest
import torch

from tasks import TaskError, make_task
from tasks.base import Samples, prompts_that_fit

K, N_PAIRS = 4, 8  # the reward-ranked tasks: rounds of 8 prompts x 4 samples


def test_prompts_that_fit():
    assert prompts_that_fit(8, 4, 0, None) == 8  # no cap: every prompt
    assert prompts_that_fit(8, 4, 1000, None) == 8
    assert prompts_that_fit(8, 4, 0, 30) == 7  # 28 of 30
    assert prompts_that_fit(8, 4, 0, 32) == 8  # exactly the round
    assert prompts_that_fit(8, 4, 0, 10**6) == 8  # never more than the round
    assert prompts_that_fit(8, 4, 28, 30) == 0  # 2 left: not one prompt's 4
    assert prompts_that_fit(8, 4, 0, 3) == 0
    assert prompts_that_fit(8, 4, 40, 30) == 0  # past the cap already: none, never negative


def _stub_sampler(right, calls: list):
    """The evaluation sampler's signature: each of a prompt's k completions ``right(prompt)`` or "no idea", drawn
    seeded by (prompt, seed, index), none truncated; ``calls`` gets the number of prompts of every call."""

    def sampler(model, tokenizer, prompts, *, k, max_new_tokens, temperature, seed, **options):
        calls.append(len(prompts))
        texts = [[random.Random(f"{p}|{seed}|{j}").choice([right(p), "no idea"]) for j in range(k)] for p in prompts]
        return Samples(texts, [[False] * k for _ in prompts], k * len(prompts))

    return sampler


def _check_cap(build, per_prompt: int, caps, calls=None):
    """The contract, for ``build(**options)`` = the task's ``preference_pairs`` with fixed policy, n_pairs and seed,
    on a task whose every prompt of a round gets ``per_prompt`` samples."""
    uncapped = build()
    # (c) max_samples=None is exactly the uncapped builder; (d) so is a cap that does not bind, even one that
    # every round exactly fits
    assert build(max_samples=None) == uncapped
    assert build(max_samples=uncapped["samples"]) == uncapped
    assert build(max_samples=10**9) == uncapped
    for cap in caps:
        assert uncapped["samples"] > cap  # so that the cap binds
        if calls is not None:
            calls.clear()
        capped = build(max_samples=cap)
        # (a) never past the cap: the most whole prompt-groups that fit
        assert capped["samples"] <= cap
        assert capped["samples"] == per_prompt * (cap // per_prompt)
        if calls is not None:  # the sampler was asked for exactly those prompts
            assert sum(calls) == cap // per_prompt
        # the rounds it did sample are the uncapped builder's: its pairs are the uncapped pairs' first ones
        n = len(capped["chosen"])
        assert 0 < n <= len(uncapped["chosen"])
        for key in ("prompts", "chosen", "rejected"):
            assert capped[key] == uncapped[key][:n]
    # (b) a cap below one prompt's samples: no sample, no pair, the one-line TaskError naming the cap
    if calls is not None:
        calls.clear()
    with pytest.raises(TaskError, match=f"no preference pairs: all 0 .*max_samples {per_prompt - 1}") as raised:
        build(max_samples=per_prompt - 1)
    assert "\n" not in str(raised.value)
    if calls is not None:
        assert calls == []
    return uncapped


# --- pizza: Task.preference_pairs (every train prompt a round, sample_completions) ---------------------------------
def test_pizza():
    task = make_task("pizza")
    policy = task.load_policy(torch.device("cpu"))
    assert len(task.train_prompts()) == 1

    def build(n_pairs=N_PAIRS, **options):
        return task.preference_pairs(policy, n_pairs, seed=0, **options)

    # (b)-(d); the samples a prompt gets follow from n_pairs and, under a cap, shrink to as few as 2: a cap of 1
    # is the one below a prompt's samples
    uncapped = _check_cap(build, 2, caps=[])
    assert uncapped["samples"] == 48  # 8 pairs: three rounds of 16 (2 x 8 pairs / 1 prompt)
    # (a) a cap of 19 keeps round 1 (16), the uncapped builder's first pairs
    capped = build(max_samples=19)
    assert capped["samples"] == 16
    assert all(capped[key] == uncapped[key][:len(capped["chosen"])] for key in ("prompts", "chosen", "rejected"))
    # a cap below one round samples fewer a prompt (an even number whose round fits) rather than nothing: 256 pairs
    # take 512 a round; a cap of 41, 40
    small = build(256, max_samples=41)
    assert small["samples"] == 40 and len(small["chosen"]) > 0


# --- bandit: 2 sampled actions per context, rounds of n_pairs contexts ----------------------------------------------
def test_bandit():
    task = make_task("bandit", reward_mode="rm")
    policy = task.load_policy(torch.device("cpu"))
    # 200 contexts a round: 451 keeps round 1's 400 samples and 25 contexts of round 2 (450); 399, 199 of round 1
    _check_cap(lambda **o: task.preference_pairs(policy, 200, seed=1, **o), 2, caps=[451, 399])


# --- the reward-ranked tasks: addition, reasoning_gym (reward_ranked_pairs) and gsm8k (its own loop) --------------
def _addition():
    from tasks.addition import AdditionTask, parse_prompt, solution

    task = AdditionTask()
    return task, lambda p: solution(*parse_prompt(p))


def _reasoning_gym(monkeypatch):
    pytest.importorskip("reasoning_gym")
    from tasks import reasoning_gym as rg_task

    class _PlainTokenizer:
        chat_template = None

    monkeypatch.setattr(rg_task, "load_tokenizer", lambda model=None: _PlainTokenizer())
    task = make_task("reasoning_gym", dataset="chain_sum", eval_problems=20, train_problems=50, held_out=20,
                     dataset_config='{"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}')
    return task, lambda p: f"<answer>{task.entry_for(p)['answer']}</answer>"


def _gsm8k(monkeypatch, tmp_path):
    from tasks import gsm8k
    from tasks.tiny_lm import char_tokenizer

    tokenizer = char_tokenizer(list(string.printable))
    monkeypatch.setattr(gsm8k, "load_tokenizer", lambda model=None: tokenizer)
    path = tmp_path / "gsm8k.jsonl"  # train and test alike
    path.write_text("".join(json.dumps({"question": f"what is {i} plus 0?", "answer": f"x\n#### {i}"}) + "\n"
                            for i in range(40)))
    task = gsm8k.GSM8KTask(data=str(path), eval_questions=5, eval_batch=3)
    assert len(task.train_prompts()) >= 2 * N_PAIRS
    return task, lambda p: f"</think><answer>{task.answer_for(p):g}</answer>"


@pytest.mark.parametrize("name", ["addition", "reasoning_gym", "gsm8k"])
def test_reward_ranked(name, monkeypatch, tmp_path):
    task, right = {"addition": _addition, "reasoning_gym": lambda: _reasoning_gym(monkeypatch),
                   "gsm8k": lambda: _gsm8k(monkeypatch, tmp_path)}[name]()
    calls: list = []
    task.eval_sampler = _stub_sampler(right, calls)
    # round 1 is 8 prompts x 4 = 32 samples: a cap of 30 samples 7 prompts (28); 45, round 1 and 3 of round 2 (44)
    uncapped = _check_cap(lambda **o: task.preference_pairs(None, N_PAIRS, seed=0, k=K, **o), K, caps=[30, 45],
                          calls=calls)
    assert uncapped["ties_dropped"] > 0  # the stub's ties made the uncapped builder sample a second round
