"""A lean forward pass for Llama-architecture causal LMs (SmolLM2, the toy tasks' tiny models).

Why it exists. Two costs dominate sampling and log-probs on a CPU, and neither is the model's arithmetic:
  * transformers' per-call machinery (mask factories, cache classes, kwargs plumbing, output
    dataclasses): 0.66 ms per decoding step of the 2-layer pizza model, whose matmuls take 0.13 ms;
  * at a handful of rows, MKL's sgemm for ``x @ W.T`` runs far below memory bandwidth: SmolLM2's
    49152 x 576 output layer takes 13.2 ms for 4 rows, 3.1 ms as ``W @ x.T`` (2 cores, fp32).

What it computes. The same function as ``LlamaForCausalLM`` with sdpa attention, from the module's own
parameters (so optimizer updates are seen and gradients reach them), op for op in transformers' order
(embedding, RMSNorm, rotary embedding, GQA attention and masks as its sdpa integration builds them, SiLU
MLP, tied or untied head). Logits equal transformers' exactly (tested), except where sampling runs a large
matrix through another kernel: prepacked for oneDNN on a CPU (``PackedWeight``, every step, the prefill too),
or else as ``W @ x.T`` in a step of at most ``FEW_ROWS`` rows (``WIDE_FEW_ROWS`` through a vocabulary-wide
output layer): same products, another summation order, so those logits differ in the last bits (~1e-6
relative). Log-probs and their gradients always take F.linear, transformers' own.

Under autocast the same ops take the same casts, so the logits still equal transformers' (tested); the gradients
too, but for attention's backward on a CPU, which runs at fp32 (``_CpuAttentionFp32Backward``: torch's bf16 one is
2-5x slower there, and its gradient no closer to the exact one). Decoding then runs the separate projections, whose
bf16 copies autocast caches per parameter. Inside ``fp32_head()`` the output layer alone runs in fp32 under bf16
autocast (ScaleRL's fp32 LM head, Khatri et al. 2025): the logits are the fp32 product of the final hidden states
and the fp32 weights, where autocast would round both to bf16 (a logit of magnitude 20 then carries an error of up
to 0.06).

``llama_of(model)`` says when it applies: a plain Llama (``supports``) or one under PEFT LoRA adapters, which
it runs as PEFT does; everything else (other architectures, eager/flash attention, merged or DoRA adapters,
attention dropout in training) keeps transformers' forward.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
import torch.nn.functional as F

from algorithms.quantize import Int8Weight, int8_linear, quantize_weight

# W @ x.T beats x @ W.T up to 4 rows and loses or ties beyond (2-core EPYC, MKL, fp32: 576x1536 at 4 rows
# 153 vs 85 us, at 8 rows 165 vs 171 us). An output layer as wide as a vocabulary is the exception: there x @ W.T
# stays far below the memory bandwidth for dozens of rows (SmolLM2's 49152 x 576 head, same machine: 8 rows
# 17.7 vs 8.1 ms, 16 rows 20.1 vs 17.2, 32 rows 25.3 vs 23.5, 64 rows 36.1 vs 45.0), so it keeps W @ x.T up to
# WIDE_FEW_ROWS. Fixed rules, not timing-based choices, so seeded runs repeat.
FEW_ROWS = 4
WIDE_OUTPUT = 1 << 14  # output features from which a layer is vocabulary-wide
WIDE_FEW_ROWS = 32
LARGE_WEIGHT = 1 << 18  # below this the two orders cost the same, and the toy models keep transformers' exact order

# Set inside ``fp32_head()``: the output layer's product runs in fp32 whatever autocast says.
_FP32_HEAD: contextvars.ContextVar[bool] = contextvars.ContextVar("fp32_head", default=False)


@contextlib.contextmanager
def fp32_head() -> Iterator[None]:
    """Within it, ``forward`` (training, log-probs and sampling) computes the logits in fp32 under bf16 autocast."""
    token = _FP32_HEAD.set(True)
    try:
        yield
    finally:
        _FP32_HEAD.reset(token)


def head_in_fp32() -> bool:
    return _FP32_HEAD.get()


def supports(model) -> bool:
    """Whether ``forward`` computes this model's function: a plain transformers Llama with sdpa attention."""
    return _plain_llama(model, lambda m: type(m) is torch.nn.Linear)


def llama_of(model):
    """The Llama whose function ``forward`` computes for ``model``, or None: ``model`` itself (``supports``),
    or the Llama under a PEFT LoRA model. ``forward`` runs its LoRA projections as PEFT does, unmerged (base
    output + scaling x B(A(dropout(x))) per active adapter, the adapters' own modules), so log-probs and
    their gradients take the packed and cached routes of a plain Llama; ``FusedProjections`` folds them for
    sampling (W + scaling x B A: the same function without dropout, as sampling runs it, other rounding).
    Without the fold a LoRA policy sampled through PEFT's and transformers' forward: chain_sum's GRPO step
    at 1.95x TRL's against 2.54x with full fine-tuning."""
    if not isinstance(model, torch.nn.Module):
        return None  # a stand-in for a model (the adapter-off reference) computes through its own __call__
    if supports(model):
        return model
    base = getattr(getattr(model, "base_model", None), "model", None)
    if base is None or not hasattr(model, "peft_config") or model._forward_hooks or model._forward_pre_hooks:
        return None
    return base if _plain_llama(base, lambda m: type(m) is torch.nn.Linear or _foldable_lora(m)) else None


def _foldable_lora(module) -> bool:
    """A PEFT LoRA ``Linear`` over a plain ``nn.Linear``, unmerged, without DoRA or hooks: its function is
    its base weight plus each active adapter's ``get_delta_weight``."""
    cls = type(module)
    if cls.__name__ != "Linear" or not cls.__module__.startswith("peft.tuners.lora"):
        return False
    if type(getattr(module, "base_layer", None)) is not torch.nn.Linear or getattr(module, "merged", True):
        return False
    if any(getattr(module, "use_dora", {}).values()) or getattr(module, "lora_variant", None):
        return False  # DoRA and the other variants compute something else than B A
    if module._forward_hooks or module._forward_pre_hooks:
        return False
    return all(name in module.lora_A for name in module.active_adapters) or bool(module.disable_adapters)


def _weight_and_bias(module) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """A projection's effective weight and bias: a Linear's own, or a LoRA layer's with its adapters folded in."""
    if type(module) is torch.nn.Linear:
        return module.weight, module.bias
    weight = module.base_layer.weight
    if not module.disable_adapters:
        for name in module.active_adapters:
            weight = weight + module.get_delta_weight(name).to(weight.dtype)
    return weight, module.base_layer.bias


def _project(x: torch.Tensor, module, few_rows_fast: bool) -> torch.Tensor:
    """``module``(x) for a projection ``llama_of`` accepts: a Linear, or an unmerged PEFT LoRA Linear computed
    as its own forward does (the same modules in the same order, so dropout draws the same masks)."""
    if type(module) is torch.nn.Linear:
        return linear(x, module.weight, module.bias, few_rows_fast)
    base = module.base_layer
    out = linear(x, base.weight, base.bias, few_rows_fast)
    if module.disable_adapters:
        return out
    dtype = out.dtype
    for name in module.active_adapters:
        if name in module.lora_A:
            lora_a = module.lora_A[name]
            out = out + module.lora_B[name](lora_a(module.lora_dropout[name](x.to(lora_a.weight.dtype)))) * module.scaling[name]
    return out.to(dtype)


def _plain_llama(model, plain_linear) -> bool:
    if type(model).__name__ != "LlamaForCausalLM" or type(getattr(model, "model", None)).__name__ != "LlamaModel":
        return False
    if any(m._forward_hooks or m._forward_pre_hooks for m in (model, model.model)):
        return False  # hooks on the model (a user's, accelerate's offloading) expect its forward to run
    config = model.config
    if len(model.model.layers) != config.num_hidden_layers:
        return False
    if getattr(config, "_attn_implementation", None) != "sdpa" or getattr(config, "hidden_act", None) != "silu":
        return False
    if model.training and getattr(config, "attention_dropout", 0.0):
        return False
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        linears = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        if not all(plain_linear(m) for m in linears):  # LoRA and quantised layers wrap their own forward
            return False
        if type(layer.input_layernorm).__name__ != "LlamaRMSNorm":
            return False
    return plain_linear(model.lm_head)


class KVCache:
    """Keys and values per layer, (B, kv_heads, length, head_dim).

    With ``capacity`` the tensors are preallocated and each step writes in place (decoding, no grad);
    without, each step concatenates, which autograd can follow (log-probs with a shared prompt).
    """

    def __init__(self, num_layers: int):
        self.keys: list[Optional[torch.Tensor]] = [None] * num_layers
        self.values: list[Optional[torch.Tensor]] = [None] * num_layers
        self.length = 0
        self.capacity: Optional[int] = None
        # (1,) position on the device: each call writes its one position there and attends over the whole buffers
        # (``StaticDecodeStep``: no shape or Python number depends on the step)
        self.write_at: Optional[torch.Tensor] = None

    def fan_out(self, repeats: int, capacity: int) -> "KVCache":
        """Each row's entries repeated ``repeats`` times into preallocated buffers of ``capacity`` positions
        (a prompt's cache shared by the G completions of its group)."""
        for i, (k, v) in enumerate(zip(self.keys, self.values)):
            rows, heads, _, dim = k.shape
            self.keys[i] = k.new_empty(rows * repeats, heads, capacity, dim)
            self.values[i] = v.new_empty(rows * repeats, heads, capacity, dim)
            self.keys[i].view(rows, repeats, heads, capacity, dim)[:, :, :, : self.length] = k[:, None]
            self.values[i].view(rows, repeats, heads, capacity, dim)[:, :, :, : self.length] = v[:, None]
        self.capacity = capacity
        return self

    def batch_repeat_interleave(self, repeats: int) -> "KVCache":
        """Each row's cache repeated ``repeats`` times (a prompt's cache fanned out to its group), under
        the name transformers' DynamicCache gives it, so callers treat both caches alike."""
        self.keys = [k.repeat_interleave(repeats, dim=0) for k in self.keys]
        self.values = [v.repeat_interleave(repeats, dim=0) for v in self.values]
        return self

    def keep_rows(self, rows: torch.Tensor) -> "KVCache":
        """Only the rows ``rows`` (R,) from now on, in that order (decoding drops the rows that finished)."""
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]
        return self

    def append(self, layer: int, keys: torch.Tensor, values: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.write_at is not None:
            self.keys[layer].index_copy_(2, self.write_at, keys)
            self.values[layer].index_copy_(2, self.write_at, values)
            return self.keys[layer], self.values[layer]
        end = start + keys.size(2)
        if self.keys[layer] is None:
            self.keys[layer], self.values[layer] = keys, values
        elif self.capacity is not None:
            self.keys[layer].narrow(2, start, end - start).copy_(keys)
            self.values[layer].narrow(2, start, end - start).copy_(values)
            return self.keys[layer].narrow(2, 0, end), self.values[layer].narrow(2, 0, end)
        else:
            self.keys[layer] = torch.cat([self.keys[layer], keys], dim=2)
            self.values[layer] = torch.cat([self.values[layer], values], dim=2)
        return self.keys[layer], self.values[layer]


@dataclass(frozen=True)
class PackedWeight:
    """A weight (N, K) reordered once into oneDNN's blocked layout for products of about ``rows`` rows.

    Why: x86 MKL's sgemm streams a weight far below the memory bandwidth at the few rows of a decoding step;
    oneDNN's kernel over a prepacked weight runs near it (SmolLM2-135M's matrices, 2-core EPYC, fp32, one
    decoding step's products at 8 rows: 16.5 ms against 41 ms for the better of x @ W.T and W @ x.T; at 64 rows
    87 against 121 ms). Reordering costs about one copy of the weights, once per ``generate`` call. Same
    products, another summation order: logits differ from F.linear's in the last bits (~1e-6 relative)."""

    blocked: torch.Tensor

    @classmethod
    def of(cls, weight: torch.Tensor, rows: int) -> "PackedWeight":
        return cls(torch.ops.mkldnn._reorder_linear_weight(weight.detach(), rows))


def can_pack(device: torch.device, dtype: Optional[torch.dtype] = None) -> bool:
    """Whether ``PackedWeight`` runs on ``device`` for weights of ``dtype``: a CPU build of torch with oneDNN, and
    for bf16 a CPU whose instructions oneDNN's bf16 reorder needs (AVX512-BF16 class or AVX-NE-CONVERT; an AVX2
    EPYC has neither, and the reorder raised there)."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    return dtype != torch.bfloat16 or bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def in_features(weight) -> int:
    """The input width of a weight ``linear`` takes: a tensor (N, K), an ``Int8Weight`` or a ``PackedWeight``."""
    if type(weight) is Int8Weight:
        return weight.codes.size(1)
    return (weight.blocked if type(weight) is PackedWeight else weight).size(1)


def linear(x: torch.Tensor, weight, bias: Optional[torch.Tensor], few_rows_fast: bool) -> torch.Tensor:
    if type(weight) is Int8Weight:
        return int8_linear(x, weight, bias)
    if type(weight) is PackedWeight:  # autocast does not see this op: the input takes the weight's dtype, as autocast casts it
        return torch.ops.mkldnn._linear_pointwise(x.to(weight.blocked.dtype), weight.blocked, bias, "none", [], "")
    rows = x.numel() // x.size(-1)
    few = WIDE_FEW_ROWS if weight.size(0) >= WIDE_OUTPUT else FEW_ROWS
    if few_rows_fast and rows <= few and weight.numel() >= LARGE_WEIGHT and not torch.is_grad_enabled():
        out = torch.mm(weight, x.reshape(rows, -1).t()).t().contiguous()
        if bias is not None:
            out = out + bias
        return out.reshape(*x.shape[:-1], weight.size(0))
    return F.linear(x, weight, bias)


def _cat_or_none(tensors):
    return None if all(t is None for t in tensors) else torch.cat(tensors)


class FusedProjections:
    """The weights decoding reads, prepared once per ``generate`` call (they do not change while sampling):
    each layer's q/k/v and gate/up weights concatenated, one matmul instead of three and two, whose outputs
    equal the separate ones bit for bit (the same dot products; tested); the other projections and the
    output layer as they are. Never used under autograd, where the fused input gradient would sum in
    another order.

    With ``dtype`` (autocast's, bf16) every weight is cast once here, where autocast would cast each one at
    every decoding step (under inference mode its weight cache stays empty): the same casts of the same
    numbers, so the same logits (tested), in a bf16 SmolLM2 decoding step 40% of the time went to them.

    With ``int8`` every weight matrix is quantised once here (``algorithms.quantize``: int8 codes, one scale
    per output row) and every projection, the output layer included, runs W8A8; biases and norms stay fp32.
    Per-row scales make the fused q/k/v and gate/up codes those of the separate weights.

    With ``pack_rows`` (not with int8; ``can_pack``) every weight of at least ``LARGE_WEIGHT`` elements is a
    ``PackedWeight`` for products of about that many rows (the decoding batch): the other kernel's rounding.
    """

    def __init__(self, model, dtype: Optional[torch.dtype] = None, int8: bool = False, pack_rows: Optional[int] = None):
        """``model`` is a Llama that ``llama_of`` returned (LoRA layers are folded)."""
        self.qkv, self.qkv_bias, self.gate_up = [], [], []
        self.o, self.o_bias, self.down, self.down_bias = [], [], [], []

        def cast(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
            return t if t is None or dtype is None or int8 else t.to(dtype)

        def weight(*parts: torch.Tensor):
            if int8:  # quantised piece by piece: no full-precision copy of the stacked weight
                return quantize_weight(*parts)
            whole = cast(torch.cat(parts) if len(parts) > 1 else parts[0])
            return PackedWeight.of(whole, pack_rows) if pack_rows and whole.numel() >= LARGE_WEIGHT else whole

        with torch.no_grad():
            for layer in model.model.layers:
                attn, mlp = layer.self_attn, layer.mlp
                (q, q_bias), (k, k_bias), (v, v_bias) = (_weight_and_bias(p) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
                (gate, gate_bias), (up, up_bias) = _weight_and_bias(mlp.gate_proj), _weight_and_bias(mlp.up_proj)
                if sum(b is None for b in (q_bias, k_bias, v_bias)) not in (0, 3) or gate_bias is not None or up_bias is not None:
                    raise ValueError("mixed biases")
                self.qkv.append(weight(q, k, v))
                self.qkv_bias.append(cast(_cat_or_none([q_bias, k_bias, v_bias])))
                self.gate_up.append(weight(gate, up))
                o, o_bias = _weight_and_bias(attn.o_proj)
                down, down_bias = _weight_and_bias(mlp.down_proj)
                self.o.append(weight(o))
                self.o_bias.append(cast(o_bias))
                self.down.append(weight(down))
                self.down_bias.append(cast(down_bias))
            head, head_bias = _weight_and_bias(model.lm_head)
            if head_in_fp32() and not int8:  # the output layer keeps its fp32 weights (``fp32_head``)
                self.head, self.head_bias = head, head_bias
            else:
                self.head, self.head_bias = weight(head), cast(head_bias)

    def in_reading_order(self) -> list[tuple]:
        """(weight, bias) of every product a decoding step runs, in the order it runs them."""
        per_layer = zip(zip(self.qkv, self.qkv_bias), zip(self.o, self.o_bias), zip(self.gate_up, [None] * len(self.gate_up)),
                        zip(self.down, self.down_bias))
        return [pair for layer in per_layer for pair in layer] + [(self.head, self.head_bias)]

    @classmethod
    def of(cls, model, dtype: Optional[torch.dtype] = None, int8: bool = False,
           pack_rows: Optional[int] = None) -> Optional["FusedProjections"]:
        try:
            return cls(model, dtype, int8, pack_rows)
        except ValueError:
            return None


def sampling_weights(llama, batch: int, dtype: Optional[torch.dtype] = None, int8: bool = False) -> Optional[FusedProjections]:
    """The weights the sampler reads for ``batch``-row decoding steps: fused, cast to ``dtype`` or quantised
    (``int8``), and, unquantised on a CPU with oneDNN, packed for ``batch`` rows; None where they cannot be fused."""
    pack_rows = batch if can_pack(next(llama.parameters()).device, dtype) and not int8 else None
    return FusedProjections.of(llama, dtype, int8=int8, pack_rows=pack_rows)


def _rms_norm(x: torch.Tensor, norm) -> torch.Tensor:
    if x.dtype == torch.float32:  # torch's op: transformers' numbers, values and gradients, bit for bit (tested)
        return F.rms_norm(x, norm.weight.shape, norm.weight, norm.variance_epsilon)
    dtype = x.dtype
    x = x.to(torch.float32)
    variance = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + norm.variance_epsilon)
    return norm.weight * x.to(dtype)


def _signed(sin: torch.Tensor) -> torch.Tensor:
    half = sin.size(-1) // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def _rotary(cos: torch.Tensor, signed_sin: torch.Tensor):
    """RoPE as ``x * cos + roll(x) * signed_sin``, with the sign of rotate_half's negated half moved onto
    sin: (-a) * b == a * (-b) exactly, so transformers' numbers, values and gradients, in 4 ops instead of 7."""
    half = signed_sin.size(-1) // 2

    def rotate(x: torch.Tensor) -> torch.Tensor:
        return (x * cos) + (torch.roll(x, half, dims=-1) * signed_sin)

    return rotate


@dataclass(frozen=True)
class PromptGroups:
    """The layout of packed rows [prompt, completion 1, ..., completion G, padding]: each completion holds only
    its real inputs (k_g positions, a completion's tokens but its last), so the padding after an ended
    completion is never computed. A prompt position sees the earlier prompt, a completion position the whole
    prompt and its own earlier positions.

    Attention runs in two parts, the prompts' queries over their prompts and each completion's queries over
    its prompt and itself (gathered into a (n G, S) block, S = max k_g), instead of every position over the
    whole row: for a GSM8K group (P 153, G 4, S 127) 165k scored pairs instead of 437k. The projections and
    the MLP still run on the whole packed row, one matrix product per weight.

    ``prompt_mask`` (n, 1, P, P) and ``completion_mask`` (n G, 1, S, P + S) say which keys each query sees
    (causality and real tokens); ``gather`` (n G S,) indexes each block position's packed position in the
    (n L) flattened rows, ``scatter`` (n (L - P),) each packed completion position's block position."""

    prompt_length: int
    group_size: int
    segment_length: int
    prompt_mask: torch.Tensor
    completion_mask: torch.Tensor
    gather: torch.Tensor
    scatter: torch.Tensor

    @classmethod
    def of(cls, prompt_real: torch.Tensor, inputs: torch.Tensor, length: int) -> "PromptGroups":
        """From (n, P) real prompt tokens, (n, G) inputs per completion and the packed rows' length L."""
        n, G = inputs.shape
        P = prompt_real.size(1)
        S = int(inputs.max()) if inputs.numel() else 0
        device = prompt_real.device
        prompt_real = prompt_real.bool()
        prompt_mask = prompt_real[:, None, None, :] & torch.ones(P, P, dtype=torch.bool, device=device).tril()
        step = torch.arange(S, device=device)
        own_real = step < inputs[..., None]  # (n, G, S)
        seen = torch.cat([torch.ones(S, P, dtype=torch.bool, device=device),
                          torch.ones(S, S, dtype=torch.bool, device=device).tril()], dim=1)  # (S, P + S)
        keys_real = torch.cat([prompt_real[:, None].expand(n, G, P), own_real], dim=2)  # (n, G, P + S)
        completion_mask = keys_real.reshape(n * G, 1, 1, P + S) & seen
        offsets = inputs.cumsum(1) - inputs  # (n, G): where each completion starts after its prompt
        row_start = torch.arange(n, device=device)[:, None, None] * length + P
        gather = torch.where(own_real, row_start + offsets[..., None] + step, row_start).reshape(-1)
        # Each packed completion position's block position; a row's trailing padding reads block position 0.
        scatter = torch.zeros(n, length - P, dtype=torch.long, device=device)
        row = torch.arange(n, device=device)[:, None, None].expand(n, G, S)
        scatter[row[own_real], (offsets[..., None] + step)[own_real]] = torch.arange(n * G * S, device=device).view(n, G, S)[own_real]
        return cls(P, G, S, prompt_mask, completion_mask, gather, scatter.reshape(-1))


def _attend_groups(query, keys, values, layout: PromptGroups, scaling: float, groups: int) -> torch.Tensor:
    """``_attend`` over packed rows laid out as ``layout`` says: (n, H, L, D) -> (n, L, H * D)."""
    n, heads, length, dim = query.shape
    P, G, S = layout.prompt_length, layout.group_size, layout.segment_length
    prompt_out = _attend(query[:, :, :P], keys[:, :, :P], values[:, :, :P], layout.prompt_mask, scaling, groups)
    if length == P:
        return prompt_out

    def blocks(x: torch.Tensor) -> torch.Tensor:  # (n, h, L, D) -> (n G, h, S, D): each completion's own positions
        h = x.size(1)
        return x.transpose(1, 2).reshape(n * length, h, dim).index_select(0, layout.gather).view(n * G, S, h, dim).transpose(1, 2)

    def with_prompt(x: torch.Tensor) -> torch.Tensor:  # (n, h, L, D) -> (n G, h, P + S, D): its prompt, then itself
        h = x.size(1)
        return torch.cat([x[:, None, :, :P].expand(n, G, h, P, dim).reshape(n * G, h, P, dim), blocks(x)], dim=2)

    out = _attend(blocks(query), with_prompt(keys), with_prompt(values), layout.completion_mask, scaling, groups)
    completion_out = out.reshape(n * G * S, -1).index_select(0, layout.scatter).view(n, length - P, -1)
    return torch.cat([prompt_out, completion_out], dim=1)


def _attention_mask(attention_mask, query_length: int, key_length: int, device: torch.device):
    """transformers' sdpa mask: None when nothing is padded and the query is one token or the whole
    sequence (sdpa's own is_causal then), else a (B, 1, L, K) bool mask: padding and causality.
    A 4-D mask or a ``PromptGroups`` layout is the caller's own (packed sequences) and is used as it is."""
    if isinstance(attention_mask, PromptGroups) or (attention_mask is not None and attention_mask.dim() == 4):
        return attention_mask
    if attention_mask is None or bool(attention_mask.all()):
        if query_length == 1 or query_length == key_length:
            return None
    if attention_mask is None:
        attention_mask = torch.ones(1, key_length, dtype=torch.bool, device=device)
    kv_index = torch.arange(key_length, device=attention_mask.device)
    q_index = torch.arange(key_length - query_length, key_length, device=attention_mask.device)
    causal = kv_index[None, :] <= q_index[:, None]  # (L, K)
    return attention_mask.bool()[:, None, None, :] & causal[None, None]


# bf16 attention of several queries on a CPU calls sdpa's kernel itself. Its backward at bf16 runs 2-5x slower
# than at fp32 (torch 2.13, one thread: (24, 9, 23, 64) queries over 85 keys 16.3 vs 4.8 ms; 62 over 62 keys 33.8
# vs 6.8 ms), and in a bf16 update it was the largest op: where a gradient will be taken, the backward runs the fp32
# kernel on the bf16 inputs, output and saved log-sum-exp, the gradient rounded to bf16 at the end. The kernel takes
# grouped-query keys as they are (the kv head of query head h is h // groups, as repeating each kv head would
# make it), so nothing copies the keys and values out per query head. The forward's output is sdpa's bit for bit.
_flash_cpu = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_cpu_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def _cpu_bf16_attention(query, mask) -> bool:
    """Several queries on a CPU at bf16 (autocast's dtype, which sdpa takes, or the inputs' own), under a bool mask or
    none: the attention ``_attend`` runs through the kernel itself."""
    if query.device.type != "cpu" or query.size(2) < 2 or not (mask is None or mask.dtype == torch.bool):
        return False
    dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else query.dtype
    return dtype == torch.bfloat16


def _additive(mask: Optional[torch.Tensor], dtype: torch.dtype) -> Optional[torch.Tensor]:
    """A bool mask as sdpa hands it to the kernel: 0 where a key is seen, -inf elsewhere, in ``dtype``."""
    if mask is None:
        return None
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


class _CpuAttentionFp32Backward(torch.autograd.Function):
    """sdpa's CPU flash attention at bf16, its backward at fp32: (B, H, L, D) queries over (B, KVH, K, D) keys and
    values -> (B, H, L, D)."""

    @staticmethod
    def forward(ctx, query, keys, values, mask, scale: float, is_causal: bool):
        out, logsumexp = _flash_cpu(query, keys, values, 0.0, is_causal, attn_mask=_additive(mask, query.dtype),
                                    scale=scale)
        ctx.save_for_backward(query, keys, values, out, logsumexp, mask)
        ctx.scale, ctx.is_causal = scale, is_causal
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        query, keys, values, out, logsumexp, mask = ctx.saved_tensors
        with torch.autocast("cpu", enabled=False):
            grads = _flash_cpu_backward(grad_out.float(), query.float(), keys.float(), values.float(), out.float(),
                                        logsumexp, 0.0, ctx.is_causal, attn_mask=_additive(mask, torch.float32),
                                        scale=ctx.scale)
        return (*(g.to(t.dtype) for g, t in zip(grads, (query, keys, values))), None, None, None)


def _attend(query, keys, values, mask, scaling: float, groups: int) -> torch.Tensor:
    """(B, H, L, D) queries over (B, KVH, K, D) keys/values -> (B, L, H * D), as transformers' sdpa path."""
    batch, heads, length, dim = query.shape
    if _cpu_bf16_attention(query, mask):
        query, keys, values = (t.to(torch.bfloat16) for t in (query, keys, values))  # autocast's casts for sdpa
        if torch.is_grad_enabled() and any(t.requires_grad for t in (query, keys, values)):
            out = _CpuAttentionFp32Backward.apply(query, keys, values, mask, scaling, mask is None)
        else:
            out, _ = _flash_cpu(query, keys, values, 0.0, mask is None, attn_mask=_additive(mask, torch.bfloat16),
                                scale=scaling)
        return out.transpose(1, 2).reshape(batch, length, -1)
    kwargs = {}
    if groups > 1:
        if mask is None:
            kwargs["enable_gqa"] = True
        elif length == 1:  # one query token: attend on the kv heads with the group's queries as rows
            query = query.reshape(batch, heads // groups, groups, dim)
        else:
            keys = keys[:, :, None].expand(-1, -1, groups, -1, -1).reshape(batch, heads, keys.size(2), dim)
            values = values[:, :, None].expand(-1, -1, groups, -1, -1).reshape(batch, heads, values.size(2), dim)
    is_causal = length > 1 and mask is None
    out = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, scale=scaling, is_causal=is_causal, **kwargs)
    if length == 1:  # (B, heads, 1, D) and (B, 1, heads * D) are the same memory order
        return out.reshape(batch, 1, -1)
    out = out.reshape(batch, -1, length, values.size(-1)).transpose(1, 2).contiguous()
    return out.reshape(batch, length, -1)


def rotary_table(model, position_ids: torch.Tensor):
    """cos and sign-folded sin for ``position_ids`` (B, L), to slice per decoding step instead of
    recomputing them (elementwise, so a slice holds the numbers a one-step call would compute)."""
    hidden = model.model.embed_tokens.weight.new_empty(position_ids.size(0), position_ids.size(1), 0)
    cos, sin = model.model.rotary_emb(hidden, position_ids)
    return cos.unsqueeze(1), _signed(sin).unsqueeze(1)  # (B, 1, L, D) each


def forward(model, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
            cache: Optional[KVCache] = None, logits_to_keep: int = 0, few_rows_fast: bool = False,
            fused: Optional[FusedProjections] = None, rotary=None, logits_at: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Logits (B, L or logits_to_keep, V) of ``LlamaForCausalLM`` for ``input_ids`` (B, L); with ``logits_at``
    (R,) positions of the flattened (B L) rows, (R, V) logits at those positions only.

    ``attention_mask`` (B, cached + L) marks real tokens (left padding 0), as transformers takes it, or
    is a (B, 1, L, cached + L) bool mask of which keys each query sees, or a ``PromptGroups`` layout;
    ``cache`` holds the keys/values of earlier positions and receives this call's. ``few_rows_fast``
    (sampling only) computes matmuls of at most ``FEW_ROWS`` rows as ``W @ x.T``: faster, other rounding.
    ``fused`` (no grad) runs each layer's concatenated q/k/v and gate/up weights; ``rotary`` is this call's
    slice of a ``rotary_table``.
    """
    body = model.model
    config = model.config
    batch, length = input_ids.shape
    past = cache.length if cache is not None else 0
    mask = _attention_mask(attention_mask, length, past + length, input_ids.device)
    hidden = body.embed_tokens(input_ids)
    if rotary is None:
        cos, sin = body.rotary_emb(hidden, position_ids)
        rotary = cos.unsqueeze(1), _signed(sin).unsqueeze(1)
    rotate = _rotary(*rotary)
    heads = config.num_attention_heads  # read once: a config attribute goes through transformers' __getattribute__
    for index, layer in enumerate(body.layers):  # slicing a ModuleList builds a new one: 26 us per call
        attn, mlp = layer.self_attn, layer.mlp
        dim = attn.head_dim
        x = _rms_norm(hidden, layer.input_layernorm)
        if fused is not None:
            qkv = linear(x, fused.qkv[index], fused.qkv_bias[index], few_rows_fast)
            qkv = qkv.view(batch, length, -1, dim).transpose(1, 2)  # (B, H + 2 KVH, L, D)
            kv_heads = (qkv.size(1) - heads) // 2
            qk, v = qkv[:, : heads + kv_heads], qkv[:, heads + kv_heads :]
            qk = rotate(qk)  # elementwise: the same numbers as q and k apart
            q, k = qk[:, :heads], qk[:, heads:]
        else:
            q = _project(x, attn.q_proj, few_rows_fast).view(batch, length, -1, dim).transpose(1, 2)
            k = _project(x, attn.k_proj, few_rows_fast).view(batch, length, -1, dim).transpose(1, 2)
            v = _project(x, attn.v_proj, few_rows_fast).view(batch, length, -1, dim).transpose(1, 2)
            q, k = rotate(q), rotate(k)
        if cache is not None:
            k, v = cache.append(index, k, v, past)
        if isinstance(mask, PromptGroups):
            out = _attend_groups(q, k, v, mask, attn.scaling, attn.num_key_value_groups)
        else:
            out = _attend(q, k, v, mask, attn.scaling, attn.num_key_value_groups)
        if fused is not None:
            hidden = hidden + linear(out, fused.o[index], fused.o_bias[index], few_rows_fast)
        else:
            hidden = hidden + _project(out, attn.o_proj, few_rows_fast)
        x = _rms_norm(hidden, layer.post_attention_layernorm)
        if fused is not None:
            gate, up = linear(x, fused.gate_up[index], None, few_rows_fast).chunk(2, dim=-1)
            hidden = hidden + linear(F.silu(gate) * up, fused.down[index], fused.down_bias[index], few_rows_fast)
        else:
            gate = _project(x, mlp.gate_proj, few_rows_fast)
            up = _project(x, mlp.up_proj, few_rows_fast)
            hidden = hidden + _project(F.silu(gate) * up, mlp.down_proj, few_rows_fast)
    if cache is not None:
        cache.length = past + length
    if logits_at is not None:  # the final norm is per position: only the kept ones
        hidden = hidden.reshape(batch * length, -1).index_select(0, logits_at)
    hidden = _rms_norm(hidden, body.norm)
    if logits_at is None and logits_to_keep:
        hidden = hidden[:, -logits_to_keep:]
    if head_in_fp32():
        with torch.autocast(hidden.device.type, enabled=False):
            if fused is not None:
                return linear(hidden.float(), fused.head, fused.head_bias, few_rows_fast)
            return _project(hidden.float(), model.lm_head, few_rows_fast)
    if fused is not None:
        return linear(hidden, fused.head, fused.head_bias, few_rows_fast)
    return _project(hidden, model.lm_head, few_rows_fast)


class StaticDecodeStep:
    """One decoding step in which no shape, address or Python number depends on the step, so that a CUDA graph
    can capture it once and replay it for every step (``cuda_graph_decoder``).

    Why: on a GPU a decoding step of a small model is kernel launches, not arithmetic: SmolLM2-135M at batch 4
    decodes in about 13.5 ms a step on an H200 through ``forward`` (results/gpu), about 400 launches and their
    Python, where reading its weights takes 0.1 ms. A replayed graph launches them all at once.

    What changes against ``forward`` with a growing cache: the step's token and number live in fixed tensors
    (``feed``); its keys and values go to the cache at ``write_at``; attention runs over the whole preallocated
    cache under a mask of the positions written so far (the prompt's real tokens, then every fed step), the
    unwritten ones zeroed (a masked score takes no weight, and 0 x a stale NaN would still poison the sum); RoPE
    is the step's row of the rotary table. Same products, attention over more keys with zero weight: the logits
    agree with the growing cache's to float rounding (tested on the CPU, where it runs eagerly)."""

    def __init__(self, model, fused: Optional[FusedProjections], cache: KVCache, first_position: torch.Tensor,
                 key_real: torch.Tensor, prompt_length: int, rotary: tuple[torch.Tensor, torch.Tensor]):
        """``cache`` holds the prompts, fanned out with its capacity; ``key_real`` (B, capacity) marks the prompts'
        real tokens and every generated position; ``rotary`` is ``rotary_table`` of the generated positions."""
        device = first_position.device
        self.model, self.fused, self.cache = model, fused, cache
        self.first_position = first_position
        self.tokens = torch.zeros(first_position.size(0), 1, dtype=torch.long, device=device)
        self.step = torch.zeros(1, dtype=torch.long, device=device)
        self.position = torch.full((1,), prompt_length, dtype=torch.long, device=device)  # the fed tokens' cache slot
        self.key_real = key_real.bool()
        self.key_index = torch.arange(key_real.size(1), device=device)
        self.prompt_length = prompt_length
        self.cos, self.signed_sin = rotary
        for keys, values in zip(cache.keys, cache.values):
            keys[:, :, cache.length:].zero_()
            values[:, :, cache.length:].zero_()
        cache.write_at = self.position  # from here on the cache is this step's alone

    def feed(self, step: int, tokens: torch.Tensor) -> None:
        """The tokens (B, 1) sampled at ``step``: the next ``__call__`` runs them."""
        self.tokens.copy_(tokens)
        self.step.fill_(step)
        self.position.fill_(self.prompt_length + step)

    def __call__(self) -> torch.Tensor:
        """Logits (B, V) after the fed tokens."""
        mask = (self.key_real & (self.key_index <= self.position))[:, None, None, :]  # (B, 1, 1, capacity)
        rotary = (self.cos.index_select(2, self.step), self.signed_sin.index_select(2, self.step))
        logits = forward(self.model, self.tokens, self.first_position, mask, self.cache, few_rows_fast=True,
                         fused=self.fused, rotary=rotary)
        return logits[:, -1, :]


def cuda_graph_decoder(static: StaticDecodeStep):
    """``decode(step, tokens) -> logits (B, V)`` replaying ``static`` captured as one CUDA graph. The logits are
    one buffer that the next step overwrites. The capture's warm-up step writes the first generated position,
    which step 0 writes again before anything reads it."""
    warm_up = torch.cuda.Stream()
    warm_up.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm_up):  # kernels chosen and workspaces allocated outside the capture
        static.feed(0, static.tokens)
        static()
    torch.cuda.current_stream().wait_stream(warm_up)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        logits = static()

    def decode(step: int, tokens: torch.Tensor) -> torch.Tensor:
        static.feed(step, tokens)
        graph.replay()
        return logits

    return decode
