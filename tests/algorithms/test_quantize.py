"""int8 sampling (W8A8 dynamic quantisation, algorithms/quantize.py): the codes and the product by hand, the
fused projections' codes equal the separate weights', the quantised forward stays close to fp32, seeded
sampling repeats, GRPO records the mismatch and corrects it, and a policy it cannot serve is one line."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from algorithms import fast_llama
from algorithms.base import Sampling
from algorithms.grpo import GRPO, GRPOConfig
from algorithms.quantize import dequantize, int8_linear, quantize_rows, quantize_weight
from algorithms.rollout import _positions, check_int8_sampling, generate, tokenize_prompts
from tasks import make_task


def test_codes_and_scales_by_hand():
    # Row 0: max |w| 2.54 -> scale 0.02; 1.0 / 0.02 = 50, -2.54 / 0.02 = -127, 0.31 / 0.02 = 15.5 -> 16 (half to even).
    # Row 1: all zeros -> codes 0 with a tiny positive scale (no division by zero).
    weight = torch.tensor([[1.0, -2.54, 0.31], [0.0, 0.0, 0.0]])
    q = quantize_weight(weight)
    assert q.codes.dtype == torch.int8
    assert q.codes.tolist() == [[50, -127, 16], [0, 0, 0]]
    assert q.scale[0].item() == pytest.approx(0.02) and 0 < q.scale[1].item() < 1e-12
    assert torch.allclose(dequantize(q)[0], torch.tensor([1.0, -2.54, 0.32]))


def test_the_product_is_the_integer_sum_rescaled():
    # x = [1.27, -0.635] -> scale 0.01, codes [127, -64 (-63.5 to even)]; W as above (row 0).
    x = torch.tensor([[1.27, -0.635, 0.0]])
    weight = torch.tensor([[1.0, -2.54, 0.31], [0.5, 0.0, -0.5]])
    bias = torch.tensor([0.25, -1.0])
    q = quantize_weight(weight)  # row 1: scale 0.5 / 127, codes [127, 0, -127]
    out = int8_linear(x, q, bias)
    row0 = (127 * 50 + (-64) * (-127) + 0 * 16) * 0.01 * 0.02 + 0.25
    row1 = (127 * 127 + 0 + 0) * 0.01 * (0.5 / 127) - 1.0
    assert out.shape == (1, 2)
    assert out[0].tolist() == pytest.approx([row0, row1], rel=1e-6)


def test_stacked_weights_quantise_as_their_parts():
    torch.manual_seed(0)
    parts = [torch.randn(1500, 24), torch.randn(3, 24) * 10, torch.randn(700, 24)]  # crosses the 1024-row blocks
    stacked = quantize_weight(*parts)
    alone = [quantize_weight(p) for p in parts]
    assert torch.equal(stacked.codes, torch.cat([a.codes for a in alone]))
    assert torch.equal(stacked.scale, torch.cat([a.scale for a in alone]))
    codes, scale = quantize_rows(torch.cat(parts))
    assert torch.equal(stacked.codes, codes) and torch.equal(stacked.scale, scale.squeeze(-1))


def test_random_products_within_a_percent():
    torch.manual_seed(0)
    x, weight = torch.randn(16, 256), torch.randn(96, 256)
    exact = x @ weight.t()
    approx = int8_linear(x, quantize_weight(weight), None)
    assert ((approx - exact).norm() / exact.norm()).item() < 0.02


@pytest.fixture(scope="module")
def pizza():
    return make_task("pizza")


def test_quantised_forward_stays_close_to_fp32(pizza):
    model = pizza.load_policy(torch.device("cpu")).eval()
    ids, mask = tokenize_prompts(pizza.tokenizer, ["ravin likes ", "a b c ravin likes "], torch.device("cpu"))
    with torch.no_grad():
        exact = fast_llama.forward(model, ids, _positions(mask), mask, fused=fast_llama.FusedProjections.of(model))
        int8 = fast_llama.FusedProjections.of(model, int8=True)
        approx = fast_llama.forward(model, ids, _positions(mask), mask, fused=int8)
    real = mask.bool()
    log_p, log_q = exact.log_softmax(-1)[real], approx.log_softmax(-1)[real]
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    assert 0 < kl.max().item() < 0.01  # changed, but not much
    assert (log_p.argmax(-1) == log_q.argmax(-1)).float().mean().item() >= 0.9


def test_seeded_int8_sampling_repeats_and_records_its_own_logps(pizza):
    model = pizza.load_policy(torch.device("cpu"))

    def sample(seed):
        return generate(model, pizza.tokenizer, ["ravin likes "], 8, max_new_tokens=6, temperature=1.0,
                        generator=torch.Generator().manual_seed(seed), record_logps=True, int8=True)

    a, b = sample(0), sample(0)
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.sampling_logps, b.sampling_logps)
    fp32 = generate(model, pizza.tokenizer, ["ravin likes "], 8, max_new_tokens=6, temperature=1.0,
                    generator=torch.Generator().manual_seed(0), record_logps=True)
    same_tokens = torch.equal(a.completion_ids, fp32.completion_ids)
    # Where both drew the same tokens, the recorded log-probs are the int8 model's, not the fp32 one's.
    assert not same_tokens or not torch.equal(a.sampling_logps, fp32.sampling_logps)
    assert (a.sampling_logps <= 0).all()


def _grpo(task, **options):
    torch.manual_seed(0)
    policy = task.load_policy(torch.device("cpu"))
    config = GRPOConfig(learning_rate=task.recommended_learning_rate, group_size=4, **options)
    return GRPO(policy, copy.deepcopy(policy).requires_grad_(False), task, config,
                Sampling(max_new_tokens=task.generation.max_new_tokens), seed=0)


def test_grpo_with_int8_sampling_measures_and_corrects_the_mismatch(pizza):
    metrics = _grpo(pizza, sampling_precision="int8", importance_sampling_mode="token_truncate").step(
        pizza.train_prompts() * 4)
    assert 0 < metrics["mismatch/mean"] <= metrics["mismatch/max"]  # int8 sampler vs the fp32 update
    assert metrics["mismatch/is_ratio_min"] < 1 < metrics["mismatch/is_ratio_max"] <= 3.0  # the correction acts
    runs = [_grpo(pizza, sampling_precision="int8").step(pizza.train_prompts() * 4) for _ in range(2)]
    assert [{k: v for k, v in r.items() if not k.startswith("time/")} for r in runs][0] == \
        {k: v for k, v in runs[1].items() if not k.startswith("time/")}  # seeded: repeats exactly


def test_a_policy_int8_cannot_serve_is_refused():
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=20))
    with pytest.raises(ValueError, match="int8 sampling needs a Llama-architecture policy with sdpa attention; "
                                         "GPT2LMHeadModel is not one"):
        check_int8_sampling(gpt2)


def test_int8_on_a_policy_it_cannot_serve_is_one_line_and_exit_2(run_cli, tmp_path, monkeypatch):
    monkeypatch.setattr(fast_llama, "llama_of", lambda model: None)
    code, _, err = run_cli("run", "--task", "pizza", "--algo", "grpo", "--sampling-precision", "int8", "--steps", "1",
                           "--out", tmp_path / "run")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "int8 sampling needs a Llama-architecture policy" in err
