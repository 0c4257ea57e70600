"""The fp32 LM head under bf16 autocast (ScaleRL's fp32 logits; RunConfig.logits_precision): the logits are the fp32
product of the final hidden states and the fp32 output weights, in training, log-probs and sampling; everything
before the head keeps autocast's bf16 casts; and a run, a matrix variant and the store carry the setting."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from algorithms import fast_llama
from algorithms.rollout import _positions
from benchmarks.harness import build, resolve
from benchmarks.store import same_experiment_spec
from tests.algorithms.test_fast_llama import _gqa_llama, _padded_batch


def _head_input(model, ids, mask):
    """The final normed hidden states (B, L, H) under autocast, as the head receives them."""
    captured = {}
    handle = model.lm_head.register_forward_pre_hook(lambda _, args: captured.setdefault("x", args[0]))
    try:  # transformers' forward under autocast: the same hidden states fast_llama computes (tested elsewhere)
        model(input_ids=ids, attention_mask=mask, position_ids=_positions(mask))
    finally:
        handle.remove()
    return captured["x"]


def test_the_head_runs_in_fp32_inside_fp32_head_and_in_bf16_outside():
    model = _gqa_llama()
    ids, mask = _padded_batch(model.config.vocab_size)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = _head_input(model, ids, mask)
        bf16 = fast_llama.forward(model, ids, _positions(mask), mask)
        with fast_llama.fp32_head():
            assert fast_llama.head_in_fp32()
            fp32 = fast_llama.forward(model, ids, _positions(mask), mask)
        assert not fast_llama.head_in_fp32()  # the context is left as it was
    assert bf16.dtype == torch.bfloat16 and fp32.dtype == torch.float32
    exact = F.linear(hidden.float(), model.lm_head.weight)  # fp32 hidden states times fp32 weights
    assert torch.allclose(fp32, exact, atol=1e-6, rtol=1e-6)
    assert not torch.equal(fp32, bf16.float())  # the bf16 head rounds: a wrong flag that did nothing fails here
    # autocast's bf16 head is the bf16 product of the same hidden states
    assert torch.equal(bf16, F.linear(hidden.to(torch.bfloat16), model.lm_head.weight.to(torch.bfloat16)))


def test_gradients_reach_the_head_and_the_trunk_through_the_fp32_head():
    model = _gqa_llama()
    ids, mask = _padded_batch(model.config.vocab_size)
    with torch.autocast("cpu", dtype=torch.bfloat16), fast_llama.fp32_head():
        logits = fast_llama.forward(model, ids, _positions(mask), mask)
    grads = torch.autograd.grad(logits.logsumexp(-1).sum(), [model.lm_head.weight, model.model.layers[0].mlp.up_proj.weight])
    assert all(g.dtype == torch.float32 and g.abs().sum() > 0 for g in grads)


def test_sampling_weights_keep_the_head_fp32_inside_fp32_head():
    model = _gqa_llama()
    with fast_llama.fp32_head():
        fused = fast_llama.FusedProjections(model, torch.bfloat16)
    assert fused.head.dtype == torch.float32 and fused.qkv[0].dtype == torch.bfloat16
    plain = fast_llama.FusedProjections(model, torch.bfloat16)
    assert plain.head.dtype == torch.bfloat16


def _build(**options):
    rc, config, task_options = resolve({"task": "pizza", "algo": "grpo", "steps": 1, "device": "cpu", "out": "/dev/null",
                                        **options})
    return build(rc, config, task_options)


def test_a_run_records_and_applies_the_setting():
    *_, algo, resolved = _build(precision="bf16", logits_precision="fp32")
    assert resolved["logits_precision"] == "fp32" and resolved["settings"]["logits_precision"] == "fp32"
    with algo.autocast():
        assert fast_llama.head_in_fp32() and torch.is_autocast_enabled("cpu")
    *_, algo, _ = _build(precision="bf16")
    with algo.autocast():
        assert not fast_llama.head_in_fp32() and torch.is_autocast_enabled("cpu")
    *_, algo, _ = _build(precision="fp32", logits_precision="fp32")  # fp32 throughout: nothing to switch
    with algo.autocast():
        assert not torch.is_autocast_enabled("cpu")


def test_a_bad_value_is_one_usage_line(tmp_path):
    from benchmarks.errors import UsageError

    with pytest.raises(UsageError, match="logits_precision' must be same or fp32, got 'fp16'"):
        resolve({"task": "pizza", "algo": "grpo", "logits_precision": "fp16"})


def test_a_stored_spec_from_before_the_setting_is_the_same_experiment():
    planned = {"cell": "x", "settings": {"seed": 0, "precision": "bf16", "logits_precision": "same"}}
    stored = {"cell": "x", "settings": {"seed": 0, "precision": "bf16"}}
    assert same_experiment_spec(stored, planned)
    assert not same_experiment_spec(stored, {**planned, "settings": {**planned["settings"], "logits_precision": "fp32"}})


def test_a_matrix_variant_sets_its_own_precision(tmp_path):
    from benchmarks.matrix.plan import MatrixError, parse

    path = tmp_path / "m.toml"
    path.write_text('name = "p"\nseeds = [0]\nbudget = 64\nprecision = "fp32"\n[tasks.pizza]\n[algorithms.grpo]\n'
                    '[algorithms.bf16]\nalgo = "grpo"\nprecision = "bf16"\nlogits_precision = "fp32"\n')
    cells = {c.variant: c for c in parse(path).cells}
    assert (cells["grpo"].precision, cells["grpo"].settings["logits_precision"]) == ("fp32", "same")
    assert (cells["bf16"].precision, cells["bf16"].settings["precision"], cells["bf16"].settings["logits_precision"]) \
        == ("bf16", "bf16", "fp32")
    path.write_text(path.read_text().replace('logits_precision = "fp32"', 'logits_precision = "fp16"'))
    with pytest.raises(MatrixError, match="logits_precision must be one of same, fp32"):
        parse(path)
