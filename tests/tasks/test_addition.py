"""The addition headroom task: the verifier, the corrupted pretraining data, deterministic pretraining,
and the cached starting policy's competence (partial, multi-token, some truncation)."""

import hashlib
import random
import statistics

import pytest
import torch

from tasks import TaskError
from tasks.addition import (
    MISTAKES, RECIPE, AdditionTask, build_addition_model, corpus, corrupted_solution, correctness, extracted_answer,
    is_held_out, parse_prompt, problem_sets, prompt_for, solution, well_formed,
)


@pytest.fixture(scope="module")
def task():
    return AdditionTask()


def test_solution_writes_columns_with_carries():
    assert solution(23, 58) == "3+8=11;2+5+1=8#81"
    assert solution(999, 1) == "9+1=10;9+0+1=10;9+0+1=10#1000"
    assert solution(5070, 12) == "0+2=2;7+1=8;0+0=0;5+0=5#5082"
    assert solution(12, 34) == "2+4=6;1+3=4#46"


@pytest.mark.parametrize("completion, correct, formatted", [
    ("3+8=11;2+5+1=8#81", 1.0, True),  # right
    ("3+8=11;2+5+1=8#82", 0.0, True),  # well formed, wrong answer
    ("3+8=12;2+5+1=8#82", 0.0, True),  # a wrong column, answer read off it
    ("3+8=11;2+5+1=9#81", 1.0, True),  # column arithmetic is not checked, only the answer
    ("#81", 1.0, False),  # right answer, no scratchpad
    ("81", 0.0, False),  # no "#": no answer
    ("3+8=11;2+5+1=8", 0.0, False),  # stopped before the answer
    ("3+8=11;2+5+1=8;2+5+1=8;2+5+1=8#81", 1.0, False),  # a loop that ended: right answer, wrong column count
    ("3+8=11;2+5+1=8;2+5+1=8;2+5+1=8;2+5+1", 0.0, False),  # a loop cut off (truncated)
    ("3+8=11#81", 1.0, False),  # one column short
    ("3+8=11;2+5+1=8#81#", 0.0, False),  # does not end with the answer's digits
    ("3+8=11;2+5+1=8#81;", 0.0, False),
    ("3+8=11;2+5+1=8#081", 0.0, False),  # a leading zero is not the sum's digits
    ("3+8=11;2+5+1=8# 81", 0.0, False),
    ("", 0.0, False),  # empty
    ("<unk>;;==#", 0.0, False),  # garbage
    ("3+8=11;2+5+1=8#81<eos>", 0.0, False),  # text after the answer
])
def test_verifier(task, completion, correct, formatted):
    assert correctness(23, 58, completion) == correct
    assert well_formed(23, 58, completion) == formatted
    (total,) = task.score(["23+58="], [completion])
    assert total == pytest.approx(correct + 0.1 * formatted)
    assert AdditionTask(reward_mode="correctness").score(["23+58="], [completion]) == [correct]


def test_extracted_answer_is_the_last_hash_group():
    assert extracted_answer("1+2=3#3") == "3"
    assert extracted_answer("#1#2") == "2"
    assert extracted_answer("1+2=3#") is None


def test_bad_prompt_and_options_are_task_errors(task):
    with pytest.raises(TaskError):
        parse_prompt("23-58=")
    with pytest.raises(TaskError):
        AdditionTask(eval_problems=0)
    with pytest.raises(TaskError):
        AdditionTask(reward_mode="partial")


@pytest.mark.parametrize("mistake", MISTAKES)
def test_corrupted_solutions_have_one_mistake_and_are_wrong_or_malformed(mistake):
    rng = random.Random(0)
    for _ in range(200):
        a, b = rng.randint(10, 9999), rng.randint(10, 9999)
        text = corrupted_solution(a, b, rng, mistake)
        assert text != solution(a, b)
        if mistake == "loop":  # the loop repeats a right column: right answer, wrong column count
            assert correctness(a, b, text) == 1.0 and not well_formed(a, b, text)
        elif mistake == "no_answer":
            assert correctness(a, b, text) == 0.0 and not well_formed(a, b, text)
        else:  # well formed, and the mistake makes the answer wrong
            assert well_formed(a, b, text) and correctness(a, b, text) == 0.0, text


def test_problem_sets_are_seeded_distinct_and_held_out():
    train, held_out = problem_sets(0, 500, 64)
    assert (train, held_out) == problem_sets(0, 500, 64)
    assert problem_sets(1, 500, 64)[0] != train
    assert len(set(train)) == 500 and len(set(held_out)) == 64
    assert not set(train) & set(held_out)
    assert all(is_held_out(a, b) for a, b in held_out) and not any(is_held_out(a, b) for a, b in train)
    texts = corpus({**RECIPE, "examples": 2000})
    assert not any(is_held_out(*parse_prompt(t[:t.index("=") + 1])) for t in texts)


def test_corpus_corruption_rate_is_the_recipes():
    recipe = {**RECIPE, "examples": 4000}
    texts = corpus(recipe)
    clean = sum(t == prompt_for(*parse_prompt(t[:t.index("=") + 1])) + solution(*parse_prompt(t[:t.index("=") + 1]))
                for t in texts)
    assert clean / len(texts) == pytest.approx(1 - recipe["corruption_rate"], abs=0.03)


def _rollout_sampler():
    """The harness's evaluation sampler (its module moved in the benchmarks/ restructure)."""
    try:
        from benchmarks.harness.loop import rollout_sampler
    except ImportError:
        from benchmarks.harness import rollout_sampler
    return rollout_sampler


def _state_hash(model) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def test_pretraining_is_deterministic():
    tiny = {**RECIPE, "examples": 500, "steps": 20, "batch_size": 16, "hidden_size": 32, "num_layers": 1}
    first, _ = build_addition_model(tiny)
    second, _ = build_addition_model(tiny)
    assert _state_hash(first) == _state_hash(second)
    third, _ = build_addition_model({**tiny, "seed": 1})
    assert _state_hash(third) != _state_hash(first)


@pytest.fixture(scope="module")
def start_metrics(task):
    task.eval_sampler = _rollout_sampler()  # what the harness evaluates with
    policy = task.load_policy(torch.device("cpu"))
    return task.evaluate(policy, seed=0)


def test_cached_policy_is_partially_competent(start_metrics):
    assert 0.10 <= start_metrics["accuracy"] <= 0.50
    assert start_metrics["format"] > start_metrics["accuracy"]  # format is measured apart from correctness
    assert 0.0 < start_metrics["truncated"] < 0.25


def test_completions_are_multi_token(task):
    policy = task.load_policy(torch.device("cpu"))
    samples = _rollout_sampler()(policy, task.tokenizer, task.eval_prompts[:64], k=2,
                              max_new_tokens=task.generation.max_new_tokens, temperature=1.0, seed=0)
    lengths = [len(task.tokenizer(t, add_special_tokens=False)["input_ids"]) for g in samples.texts for t in g]
    assert statistics.median(lengths) >= 8


def test_preference_pairs_rank_by_reward(task):
    policy = task.load_policy(torch.device("cpu"))
    pairs = task.preference_pairs(policy, 16, seed=0)
    assert 0 < len(pairs["chosen"]) <= 16
    for prompt, chosen, rejected in zip(pairs["prompts"], pairs["chosen"], pairs["rejected"]):
        assert task.score([prompt], [chosen])[0] > task.score([prompt], [rejected])[0]
    assert pairs == task.preference_pairs(policy, 16, seed=0)


def test_greedy_evaluation_has_no_sampling_noise():
    greedy = AdditionTask(eval_problems=32, eval_k=1, eval_temperature=0.0)
    greedy.eval_sampler = _rollout_sampler()
    policy = greedy.load_policy(torch.device("cpu"))
    first, second = greedy.evaluate(policy, seed=0), greedy.evaluate(policy, seed=1)
    assert first == second  # another sampling seed, the same score: the policy's, not the draw's
    sampled = AdditionTask(eval_problems=32, eval_k=1)
    sampled.eval_sampler = _rollout_sampler()
    assert sampled.evaluate(policy, seed=0) != sampled.evaluate(policy, seed=1)
    assert greedy.describe()["eval_temperature"] == 0.0
    with pytest.raises(TaskError, match="eval_temperature must be >= 0"):
        AdditionTask(eval_temperature=-1.0)
