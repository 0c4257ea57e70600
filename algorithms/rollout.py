"""Shared sampling and per-token log-probs: the parts that must be identical for a fair comparison.

Mask convention (stated once, used by every loss): a completion's mask is 1 on its tokens up to and
including the first EOS, and 0 on everything after it. A completion with no EOS within
``max_new_tokens`` is *truncated*; it keeps mask 1 on all its tokens unless the caller masks it out
(DAPO's overlong filtering, ``Rollout.loss_mask(mask_truncated=True)``).

Sampling encodes each distinct prompt once and shares its KV cache across the G completions of its
group (preallocated buffers with ``fast_llama``'s forward for Llama models; transformers' cache, static
for long completions, otherwise), then decodes token by token and stops as soon as every sequence has
ended. Log-probs encode each prompt once too (``per_token_logps``'s ``group_size``): packed with its G
completions' real tokens into one sequence (``PACKED_MAX_LENGTH``), or through its KV cache where that saves work
(``SHARED_PROMPT_MIN_WORK``), so the G identical prompts of a group are not run G times, in the update's
forward and backward as well. Log-probs are computed from logits divided by the sampling temperature,
as TRL does, so that old/ref/current log-probs all describe the distribution that was sampled.
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

import torch
import torch.nn.functional as F

from algorithms import fast_llama


@dataclass
class Rollout:
    """G completions for each of n prompts, ordered group by group (B = n * G)."""

    prompts: list[str]  # (B,) each prompt repeated G times
    completions: list[str]  # (B,) text before the first EOS (special tokens kept)
    prompt_ids: torch.Tensor  # (B, P) left-padded
    prompt_mask: torch.Tensor  # (B, P)
    completion_ids: torch.Tensor  # (B, T) right-padded with pad_token_id
    completion_mask: torch.Tensor  # (B, T) the mask convention above
    truncated: torch.Tensor  # (B,) bool: no EOS within max_new_tokens
    group_size: int
    sampling_logps: Optional[torch.Tensor] = None  # (B, T) the sampler's own log-probs, when it recorded them
    # A minibatch of rows drawn across groups (``select(..., grouped=True)``): the rows come in runs of one prompt,
    # of these lengths, so that log-probs still encode each prompt once. None: groups of ``group_size``.
    group_counts: Optional[tuple[int, ...]] = None

    @property
    def num_completions(self) -> int:
        return self.completion_ids.size(0)

    @property
    def tokens_generated(self) -> int:
        return int(self.completion_mask.sum())

    def loss_mask(self, mask_truncated: bool = False) -> torch.Tensor:
        """Mask for the loss; with ``mask_truncated`` a truncated completion contributes nothing."""
        if not mask_truncated:
            return self.completion_mask
        return self.completion_mask * (~self.truncated).unsqueeze(-1).to(self.completion_mask.dtype)

    def detached_copy(self) -> "Rollout":
        """The same rollout in ordinary tensors (e.g. out of ``torch.inference_mode``)."""
        return dataclasses.replace(self, **{f.name: getattr(self, f.name).clone() for f in dataclasses.fields(self)
                                            if isinstance(getattr(self, f.name), torch.Tensor)})

    def group_of_rows(self) -> torch.Tensor:
        """(B,) the group (prompt) each row belongs to."""
        device = self.completion_ids.device
        if self.group_counts is None:
            return torch.arange(self.num_completions, device=device).div(self.group_size, rounding_mode="floor")
        counts = torch.tensor(self.group_counts, device=device)
        return torch.repeat_interleave(torch.arange(counts.numel(), device=device), counts)

    def select(self, index: torch.Tensor, *, grouped: bool = False) -> "Rollout":
        """Sub-batch for minibatching (index into the B completions). With ``grouped``, ``index`` lists each
        group's rows together (a sorted random minibatch does): the sub-batch records its runs of one prompt
        (``group_counts``), so its log-probs encode each prompt once, as the whole batch's do."""
        idx = index.tolist()
        counts = None
        if grouped:
            groups = self.group_of_rows()[index]
            if groups.numel() and bool((groups[1:] < groups[:-1]).any()):
                raise ValueError("select(grouped=True) needs each group's rows together, in group order (sort the index)")
            counts = tuple(torch.unique_consecutive(groups, return_counts=True)[1].tolist())
        return Rollout(
            prompts=[self.prompts[i] for i in idx],
            completions=[self.completions[i] for i in idx],
            prompt_ids=self.prompt_ids[index],
            prompt_mask=self.prompt_mask[index],
            completion_ids=self.completion_ids[index],
            completion_mask=self.completion_mask[index],
            truncated=self.truncated[index],
            group_size=self.group_size,
            sampling_logps=None if self.sampling_logps is None else self.sampling_logps[index],
            group_counts=counts,
        )


def concat_rollouts(rollouts: Sequence[Rollout]) -> Rollout:
    """One rollout of several (same group size, whole groups), prompts re-padded on the left and completions on
    the right to the longest; the added padding is masked out (token id 0, sampler log-prob 0)."""
    if any(r.group_counts is not None for r in rollouts):
        raise ValueError("concat_rollouts takes whole groups, not grouped minibatches")
    P = max(r.prompt_ids.size(1) for r in rollouts)
    T = max(r.completion_ids.size(1) for r in rollouts)

    def cat(name: str, width: int, left: bool):
        parts = [getattr(r, name) for r in rollouts]
        return torch.cat([F.pad(x, (width - x.size(1), 0) if left else (0, width - x.size(1))) for x in parts])

    recorded = all(r.sampling_logps is not None for r in rollouts)
    return Rollout(
        prompts=[p for r in rollouts for p in r.prompts],
        completions=[c for r in rollouts for c in r.completions],
        prompt_ids=cat("prompt_ids", P, True),
        prompt_mask=cat("prompt_mask", P, True),
        completion_ids=cat("completion_ids", T, False),
        completion_mask=cat("completion_mask", T, False),
        truncated=torch.cat([r.truncated for r in rollouts]),
        group_size=rollouts[0].group_size,
        sampling_logps=cat("sampling_logps", T, False) if recorded else None,
    )


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every id that ends a completion: the tokenizer's EOS and the model's generation_config EOS ids."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if gen_eos is not None:
        ids.update(int(i) for i in (gen_eos if isinstance(gen_eos, Iterable) else [gen_eos]))
    if not ids:
        raise ValueError("the tokenizer has no EOS token: completions could never end")
    return sorted(ids)


def completion_mask_from_ids(completion_ids: torch.Tensor, eos_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) ids -> (mask up to and including the first EOS, truncated flags (B,))."""
    is_eos = torch.isin(completion_ids, torch.tensor(list(eos_ids), device=completion_ids.device))
    has_eos = is_eos.any(dim=1)
    first_eos = torch.where(has_eos, is_eos.int().argmax(dim=1), completion_ids.size(1))  # (B,)
    positions = torch.arange(completion_ids.size(1), device=completion_ids.device)
    mask = (positions.unsqueeze(0) <= first_eos.unsqueeze(1)).long()
    return mask, ~has_eos


def _positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that skip left padding (what HF generate computes)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def tokenize_prompts(tokenizer, prompts: Sequence[str], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompt ids and mask. Prompts arrive fully formatted (chat template already applied)."""
    saved_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        enc = tokenizer(list(prompts), return_tensors="pt", padding=True, add_special_tokens=False)
    finally:
        tokenizer.padding_side = saved_side
    return enc["input_ids"].to(device), enc["attention_mask"].to(device)


# Below this vocabulary size torch.multinomial's one exponential draw per entry is cheaper than a
# cumulative sum, and the toy tasks' seeded runs (results/cpu, ...) stay exactly as they were recorded.
INVERSE_CDF_MIN_VOCAB = 4096
# Below this completion length a DynamicCache's per-step concatenation is cheaper than allocating a
# static one (pizza, 12 tokens: 12.6 vs 15.6 ms per generate call; GSM8K, 256 tokens: static wins).
STATIC_CACHE_MIN_NEW_TOKENS = 64


# ``share_prefix``: the prompts' common leading tokens (a chat template's system turn) are encoded once when at least
# this many; fewer are not worth a second forward call.
SHARED_PREFIX_MIN_TOKENS = 8


def shared_prefix_length(ids: torch.Tensor, mask: torch.Tensor) -> int:
    """How many leading real tokens every left-padded row of ``ids`` (n, P) has in common, leaving each row at least
    one token of its own (the first next-token logits come from a row's last prompt token)."""
    lengths = mask.sum(1).tolist()
    rows = [ids[i, ids.size(1) - n:].tolist() for i, n in enumerate(lengths)]
    common = 0
    for column in zip(*rows):
        if any(token != column[0] for token in column):
            break
        common += 1
    return min(common, min(lengths) - 1)


def _prefill_shared(model, fused, unique_ids: torch.Tensor, unique_mask: torch.Tensor, common: int,
                    cache: "fast_llama.KVCache") -> tuple[torch.Tensor, torch.Tensor]:
    """Encode the ``common`` leading tokens every prompt shares once, copy their keys and values to every row, then
    encode each row's own tokens after them, left-padded to the longest: the cache holds [prefix][padding][own
    tokens] with the positions each token has in its prompt. Returns (the last prompt token's logits (n, 1, V), the
    layout's attention mask (n, common + longest own part))."""
    n = unique_ids.size(0)
    lengths = unique_mask.sum(1)
    prefix = unique_ids[:1, unique_ids.size(1) - int(lengths[0]):][:, :common]
    positions = torch.arange(common, device=unique_ids.device)[None]
    fast_llama.forward(model, prefix, positions, None, cache, logits_to_keep=1, fused=fused)
    cache.batch_repeat_interleave(n)
    own = int(lengths.max()) - common
    # Each row's tokens after the prefix, left-padded to the longest (a shorter row's last ``own`` columns also hold
    # some of its prefix: masked here, never encoded twice).
    columns = torch.arange(own, device=unique_ids.device)[None]
    own_mask = (columns >= (own - (lengths - common))[:, None]).to(unique_mask.dtype)
    own_ids = unique_ids[:, unique_ids.size(1) - own:] * own_mask
    mask = torch.cat([unique_mask.new_ones(n, common), own_mask], dim=1)
    logits = fast_llama.forward(model, own_ids, _positions(own_mask) + common, mask, cache, logits_to_keep=1, fused=fused)
    return logits, mask


# On a GPU, a lean model's decoding steps replay one CUDA graph (fast_llama.StaticDecodeStep) from this many
# new tokens (capturing it runs a warm-up step and the capture, once per generate call).
CUDA_GRAPH_MIN_NEW_TOKENS = 16


def sample_categorical(probs: torch.Tensor, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """One index per row of ``probs`` (B, V): exact ancestral sampling, seeded by ``generator``.

    For large vocabularies the row's CDF is inverted with one uniform number: ``torch.multinomial``
    draws one exponential number per vocabulary entry instead, 6.3M draws per step at 128 rows x 49k
    tokens, 110 ms on a 2-core CPU (this: 5 ms), half as long as the model's own matmuls. A token's
    interval in the float32 running sum is its probability to within one rounding of that sum (6e-8).
    """
    if probs.size(-1) < INVERSE_CDF_MIN_VOCAB:
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    cdf = probs.float().cumsum(dim=-1)  # (B, V)
    u = torch.rand(probs.size(0), 1, generator=generator, device=probs.device) * cdf[:, -1:]
    # right=True: a token with zero probability has an empty interval [cdf[i-1], cdf[i]) and is never drawn.
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=probs.size(-1) - 1)


def _fan_out(model, prefilled: DynamicCache, group_size: int, max_length: int, max_new_tokens: int):
    """The prefilled cache repeated G times, in a preallocated StaticCache when the model allows it.

    A DynamicCache concatenates every layer's keys and values at each decoding step, which on CPU
    cost more than the matmuls at 32+ rows and 256 new tokens; a static one writes in place. Short
    completions, bf16 autocast, and models whose layers are not all plain full-attention ones (sliding
    windows, linear attention), keep the dynamic cache. Either way the logits agree to float rounding.
    """
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer

    static = None
    # Under autocast, keys come out of RoPE in float32 and values in bf16, while a StaticCache holds one dtype.
    autocast = torch.is_autocast_enabled(next(model.parameters()).device.type)
    if max_new_tokens >= STATIC_CACHE_MIN_NEW_TOKENS and not autocast:
        try:
            static = StaticCache(config=model.config, max_cache_len=max_length)
        except Exception:  # configs without a text decoder's cache layout
            static = None
    if static is None or len(static.layers) != len(prefilled.layers) or any(
        type(layer) is not StaticLayer for layer in static.layers
    ):
        prefilled.batch_repeat_interleave(group_size)
        return prefilled
    for layer, filled in zip(static.layers, prefilled.layers):
        layer.update(filled.keys.repeat_interleave(group_size, dim=0), filled.values.repeat_interleave(group_size, dim=0))
    return static


def _prefill(model, lean: Optional[tuple], unique_ids: torch.Tensor, unique_mask: torch.Tensor, group_size: int,
             max_new_tokens: int, share_prefix: bool = False):
    """Encode each prompt once and fan its KV cache out to the G members of its group; with ``share_prefix`` (lean
    models) the leading tokens all prompts share are encoded once for all (``_prefill_shared``).

    Returns the first next-token logits (B, V) and ``decode(step, tokens (B, 1)) -> logits (B, V)``, which
    feeds the tokens sampled at ``step`` (0, 1, ...); it keeps the cache, positions and attention mask.
    ``lean`` is ``_lean_sampler``'s (Llama, prepared weights): Llama-architecture models take the lean forward
    of ``fast_llama`` (transformers' logits to the last bits: its sampling kernels round differently); with
    None the model runs transformers' own forward and cache.
    """
    positions = _positions(unique_mask)
    first_position = positions[:, -1:].repeat_interleave(group_size, dim=0) + 1  # (B, 1)
    common = shared_prefix_length(unique_ids, unique_mask) if share_prefix and lean is not None and unique_ids.size(0) > 1 else 0
    layout = unique_mask
    if lean is not None:
        model, fused = lean
        cache = fast_llama.KVCache(model.config.num_hidden_layers)
        if common >= SHARED_PREFIX_MIN_TOKENS:
            logits, layout = _prefill_shared(model, fused, unique_ids, unique_mask, common, cache)
        else:
            logits = fast_llama.forward(model, unique_ids, positions, unique_mask, cache, logits_to_keep=1, fused=fused)
    prompt_length = layout.size(1)
    capacity = prompt_length + max_new_tokens
    attention = layout.repeat_interleave(group_size, dim=0)  # (B, P)
    # The whole mask up front: step s attends to the prompt and the s + 1 tokens fed so far (a slice, not a cat).
    attention = torch.cat([attention, attention.new_ones(attention.size(0), max_new_tokens)], dim=1)  # (B, P + T)
    if lean is not None:
        cache.fan_out(group_size, capacity)
        padded = not bool(layout.all())  # without padding no step needs a mask
        # RoPE of every position decoding can reach, computed once and sliced per step.
        cos, signed_sin = fast_llama.rotary_table(model, first_position + torch.arange(max_new_tokens, device=first_position.device))
        if unique_ids.device.type == "cuda" and max_new_tokens >= CUDA_GRAPH_MIN_NEW_TOKENS:
            decode = fast_llama.cuda_graph_decoder(fast_llama.StaticDecodeStep(
                model, fused, cache, first_position, attention, prompt_length, (cos, signed_sin)))
        else:
            decode = _LeanDecode(model, fused, cache, first_position, attention if padded else None, prompt_length,
                                 cos, signed_sin)
    else:
        from transformers import DynamicCache

        out = model(input_ids=unique_ids, attention_mask=unique_mask, position_ids=positions,
                    past_key_values=DynamicCache(), use_cache=True, logits_to_keep=1)
        logits = out.logits
        hf_cache = _fan_out(model, out.past_key_values, group_size, capacity, max_new_tokens)

        def decode(step, tokens):
            return model(input_ids=tokens, attention_mask=attention[:, : prompt_length + step + 1],
                         position_ids=first_position + step, past_key_values=hf_cache, use_cache=True).logits[:, -1, :]
    return logits[:, -1, :].float().repeat_interleave(group_size, dim=0), decode


class _LeanDecode:
    """One decoding step of the lean forward over the rows still decoding: ``decode(step, tokens (R, 1)) -> logits
    (R, V)``. ``keep(rows)`` drops every other row from the cache, the mask, the positions and the rotary table, so
    later steps compute only the rows kept (``generate``'s ``drop_finished``)."""

    def __init__(self, model, fused, cache: "fast_llama.KVCache", first_position: torch.Tensor,
                 attention: Optional[torch.Tensor], prompt_length: int, cos: torch.Tensor, signed_sin: torch.Tensor):
        self.model, self.fused, self.cache, self.prompt_length = model, fused, cache, prompt_length
        self.first_position, self.attention, self.cos, self.signed_sin = first_position, attention, cos, signed_sin

    def __call__(self, step: int, tokens: torch.Tensor) -> torch.Tensor:
        mask = self.attention[:, : self.prompt_length + step + 1] if self.attention is not None else None
        rotary = (self.cos[:, :, step:step + 1], self.signed_sin[:, :, step:step + 1])
        return fast_llama.forward(self.model, tokens, self.first_position + step, mask, self.cache, few_rows_fast=True,
                                  fused=self.fused, rotary=rotary)[:, -1, :]

    def keep(self, rows: torch.Tensor) -> None:
        self.cache.keep_rows(rows)
        self.first_position = self.first_position.index_select(0, rows)
        self.cos, self.signed_sin = self.cos.index_select(0, rows), self.signed_sin.index_select(0, rows)
        if self.attention is not None:
            self.attention = self.attention.index_select(0, rows)


# ``drop_finished`` compacts the decoding batch once at most this share of its rows is still decoding: each compaction
# copies the cache once, so it waits for enough finished rows to pay for the copy.
DROP_FINISHED_SHARE = 0.75


def generate(
    model,
    tokenizer,
    prompts: Sequence[str],
    group_size: int,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    generator: Optional[torch.Generator] = None,
    record_logps: bool = False,
    int8: bool = False,
    share_prefix: bool = False,
    drop_finished: bool = False,
) -> Rollout:
    """Sample ``group_size`` completions for every prompt (temperature 0 means greedy). With
    ``record_logps`` the rollout keeps the sampler's own log-prob of each sampled token (``sampling_logps``,
    from the logits it sampled from, divided by the temperature), to measure and correct the mismatch with
    the trainer's log-probs (a different precision, a different kernel). ``int8`` samples from the policy's
    W8A8 quantisation (``algorithms.quantize``), made once for this call; ``check_int8_sampling`` says when
    a model allows it. ``share_prefix`` encodes the leading tokens every prompt shares (a chat template's system
    turn) once for all of them, on Llama-architecture models: the same distribution, other rounding, less work.
    ``drop_finished`` (greedy decoding only) stops computing the rows that have finished: where a few long
    completions would keep a whole batch decoding, only they go on. The same tokens to rounding (the products run
    over fewer rows); on the lean forward without a CUDA graph, elsewhere every row decodes to the end."""
    if drop_finished and temperature != 0:
        raise ValueError("drop_finished is for greedy decoding (temperature 0): dropping rows would change which "
                         "random numbers the rows still sampling draw")
    if drop_finished and record_logps:
        raise ValueError("drop_finished does not record the sampler's log-probs: a dropped row has no logits to read")
    # inference_mode skips autograd's bookkeeping per op (13% of a pizza decoding step); its tensors
    # cannot enter a graph later (the update's embedding saves its indices), so they leave as copies.
    with torch.inference_mode():
        rollout = _sample(model, tokenizer, prompts, group_size, max_new_tokens=max_new_tokens,
                          temperature=temperature, generator=generator, record_logps=record_logps, int8=int8,
                          share_prefix=share_prefix, drop_finished=drop_finished)
    return rollout.detached_copy()


def check_int8_sampling(model) -> None:
    """Raise ValueError unless ``generate(..., int8=True)`` can sample from ``model``: a Llama-architecture
    model that ``fast_llama`` runs (LoRA adapters folded in), on the CPU, where ``torch._int_mm`` takes any
    shape (CUDA's needs more than 16 rows; a GPU's rollout engine has int8 kernels of its own)."""
    if fast_llama.llama_of(model) is None:
        raise ValueError(f"int8 sampling needs a Llama-architecture policy with sdpa attention; "
                         f"{type(model).__name__} is not one (use sampling_precision bf16 or same)")
    device = next(model.parameters()).device
    if device.type != "cpu":
        raise ValueError(f"int8 sampling runs on the CPU; the policy is on {device} (use sampling_precision bf16)")


def _lean_sampler(model, device: torch.device, batch: int, int8: bool = False):
    """(the Llama ``fast_llama`` runs, its prepared decoding weights) for ``model``, or None for transformers'
    forward. Under autocast the weights are cast once here, not by autocast at every step; on a CPU with
    oneDNN they are packed for ``batch``-row products (``fast_llama.PackedWeight``). A LoRA policy samples
    only through prepared weights (its adapters folded in), never through its projections' own."""
    if int8:
        check_int8_sampling(model)
    llama = fast_llama.llama_of(model)
    if llama is None:
        return None
    dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None
    fused = fast_llama.sampling_weights(llama, batch, dtype, int8=int8)
    if fused is None and int8:
        raise ValueError("int8 sampling needs every layer's q/k/v projections all biased or all without bias")
    if fused is None and llama is not model:
        return None
    return llama, fused


def _sample(model, tokenizer, prompts, group_size, *, max_new_tokens, temperature, generator, record_logps=False,
            int8=False, share_prefix=False, drop_finished=False) -> Rollout:
    device = next(model.parameters()).device
    eos_ids = eos_token_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    unique_ids, unique_mask = tokenize_prompts(tokenizer, prompts, device)  # (n, P)

    lean = _lean_sampler(model, device, unique_ids.size(0) * group_size, int8)  # its forward has no dropout (it declines models that would use any)
    fast = lean is not None
    was_training = model.training
    if not fast:
        model.eval()  # no dropout while sampling
    next_logits, decode = _prefill(model, lean, unique_ids, unique_mask, group_size, max_new_tokens, share_prefix)  # (B, V)
    batch = next_logits.size(0)

    eos_tensor = torch.tensor(eos_ids, device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    tokens, sampled_logps = [], []
    decoding = None  # with drop_finished, once compacted: the rows (B) whose logits next_logits holds
    for step in range(max_new_tokens):
        scaled = next_logits if temperature in (0, 1.0) else next_logits / temperature
        if temperature > 0:
            token = sample_categorical(torch.softmax(scaled, dim=-1), generator)  # (B,)
        elif decoding is None:
            token = next_logits.argmax(dim=-1)
        else:  # finished rows are padding below whatever they hold
            token = torch.full((batch,), pad_id, dtype=torch.long, device=device).index_copy_(0, decoding, next_logits.argmax(dim=-1))
        token = token.masked_fill(finished, pad_id)
        tokens.append(token)
        if record_logps:
            sampled_logps.append(selective_log_softmax(scaled, token).masked_fill(finished, 0.0))
        finished |= (token == eos_ids[0]) if len(eos_ids) == 1 else torch.isin(token, eos_tensor)
        if step == max_new_tokens - 1 or bool(finished.all()):
            break
        if drop_finished and isinstance(decode, _LeanDecode):
            rows = torch.arange(batch, device=device) if decoding is None else decoding
            going = ~finished.index_select(0, rows)
            if int(going.sum()) <= DROP_FINISHED_SHARE * rows.numel():
                kept = going.nonzero().squeeze(-1)
                decode.keep(kept)
                decoding = rows.index_select(0, kept)
        fed = token if decoding is None else token.index_select(0, decoding)
        next_logits = decode(step, fed.unsqueeze(-1)).float()
    if not fast:
        model.train(was_training)

    completion_ids = torch.stack(tokens, dim=1)  # (B, T)
    completion_mask, truncated = completion_mask_from_ids(completion_ids, eos_ids)
    completion_ids = torch.where(completion_mask.bool(), completion_ids, torch.full_like(completion_ids, pad_id))
    # The text is everything before the first EOS, special tokens kept, so a reward sees what was sampled.
    lengths = (completion_mask.sum(1) - (~truncated).long()).tolist()
    texts = tokenizer.batch_decode([row[:n] for row, n in zip(completion_ids.tolist(), lengths)], skip_special_tokens=False)
    return Rollout(
        prompts=[p for p in prompts for _ in range(group_size)],
        completions=texts,
        prompt_ids=unique_ids.repeat_interleave(group_size, dim=0),
        prompt_mask=unique_mask.repeat_interleave(group_size, dim=0),
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        truncated=truncated,
        group_size=group_size,
        sampling_logps=torch.stack(sampled_logps, dim=1) if record_logps else None,  # (B, T)
    )


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits)[..., index] without materialising the full (B, T, V) log-prob tensor twice."""
    picked = torch.gather(logits, -1, index.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def _shared_prompt(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, group_size: int) -> bool:
    """Whether every group of ``group_size`` consecutive rows holds one prompt (as a Rollout does)."""
    if group_size < 2 or prompt_ids.size(0) % group_size:
        return False
    ids = prompt_ids.view(-1, group_size, prompt_ids.size(1))
    mask = prompt_mask.view(-1, group_size, prompt_mask.size(1))
    return bool((ids == ids[:, :1]).all() and (mask == mask[:, :1]).all())


def _prompt_runs(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, group_size: int,
                 group_counts: Optional[Sequence[int]] = None) -> Optional[torch.Tensor]:
    """(n,) the lengths of the runs of consecutive rows that hold one prompt, when the rows come that way and some
    prompt holds two or more (its encoding can be shared); else None. ``group_counts`` names the runs of a grouped
    minibatch (``Rollout.select(..., grouped=True)``); without it the runs are the groups of ``group_size``."""
    rows = prompt_ids.size(0)
    if group_counts is None:
        if not _shared_prompt(prompt_ids, prompt_mask, group_size):
            return None
        return torch.full((rows // group_size,), group_size, dtype=torch.long, device=prompt_ids.device)
    counts = torch.tensor(list(group_counts), dtype=torch.long, device=prompt_ids.device)
    if int(counts.sum()) != rows or not bool((counts > 0).all()) or int(counts.max()) < 2:
        return None
    first = (counts.cumsum(0) - counts).repeat_interleave(counts)  # each row's run's first row
    if not bool((prompt_ids == prompt_ids[first]).all() and (prompt_mask == prompt_mask[first]).all()):
        return None
    return counts


# Through the KV cache (rows too long to pack, or models fast_llama does not cover), encoding a group's
# prompt once saves G - 1 passes over it and costs a second forward call (and its backward), about 1 ms
# of per-op overhead on a 2-layer model on CPU: for the pizza model (0.13M parameters, 12-token prompt,
# G = 8) one full forward + backward takes 3.6 ms, the cached one 4.5 ms; for SmolLM2 on GSM8K (135M,
# ~150-token prompts, G = 4) it skips 450 positions of a 135M model.
# Cached when parameters x repeated prompt tokens reach this (pizza: 1e7, SmolLM2/GSM8K: 6e10).
SHARED_PROMPT_MIN_WORK = 1 << 27


_parameter_counts: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # walking parameters(): 0.1 ms a call


def _prefix(mask: torch.Tensor) -> bool:
    """Whether each row's real tokens come first, then only padding (as sampling and tokenising make them)."""
    lengths = mask.sum(1, keepdim=True)
    return bool((mask.bool() == (torch.arange(mask.size(1), device=mask.device) < lengths)).all())


def _sharing_pays(model, prompt_mask: torch.Tensor, group_size: int) -> bool:
    repeated_prompt_tokens = (group_size - 1) * int(prompt_mask[::group_size].sum())
    try:
        parameters = _parameter_counts[model]
    except (KeyError, TypeError):
        parameters = sum(p.numel() for p in model.parameters())
        with contextlib.suppress(TypeError):  # objects that cannot be weakly referenced are counted each time
            _parameter_counts[model] = parameters
    return parameters * repeated_prompt_tokens >= SHARED_PROMPT_MIN_WORK


# Rows longer than this take the KV-cache route. A packed row's attention runs per completion
# (fast_llama.PromptGroups), so both routes score the same pairs; they differ in the copies each layer makes
# and in the packed row's single call. SmolLM2 forward + backward, one thread beside a running matrix:
# L = 661 (a GSM8K prompt, G = 4, 128 tokens) packed 12.0 s, cached 11.4 s; L = 1681 (G = 8, 192 tokens)
# packed 36 s, cached 31 s. On quiet cores, when the packed row's attention scored all L x L pairs:
# L = 644 packed 4.7 s, cached 5.2 s; L = 1664 packed 31 s, cached 25 s.
PACKED_MAX_LENGTH = 1024


def _packed_completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask,
                              counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(R, V) logits of the positions that predict completion tokens, and (B, T) the row of them that
    predicts each completion token; each group's prompt and its G completions packed into one sequence:
    [prompt, completion 1, ..., completion G] (each completion's real tokens without its last, which predicts
    nothing: the padding after an ended completion is never computed), one forward call for all of it
    (``fast_llama`` models). A padding token's row is its group's first (finite, and masked by every caller).
    ``counts`` (n,) are the groups' sizes, the rows group by group; a grouped minibatch's groups differ in size,
    and the smaller ones are laid out as the largest with completions of no positions.

    Its attention (``fast_llama.PromptGroups``) makes it the same function as G separate forwards of
    prompt + completion: a prompt position sees the earlier prompt, a completion position the whole
    prompt and its own earlier tokens; every completion's positions continue from the prompt's. The prompt
    is encoded once and, unlike the KV-cache route, in the same call as the completions: for the 2-layer
    pizza model one forward + backward takes 2.1 ms instead of 3.2 ms for the 8 full sequences. Only
    floating-point order differs from the full forward (log-probs within ~5e-7 for pizza; tested).
    Completion masks must be a prefix of real tokens (as sampling and tokenising make them).
    """
    batch, T = completion_ids.shape
    n = counts.numel()
    device = prompt_ids.device
    starts = counts.cumsum(0) - counts  # (n,) each group's first row
    unique_ids, unique_mask = prompt_ids[starts], prompt_mask[starts]  # (n, P)
    P = unique_ids.size(1)
    inputs = _inputs_per_completion(completion_mask)  # (B,)
    step = torch.arange(T - 1, device=device)
    real_input = step < inputs[:, None]  # (B, T - 1)
    group = torch.repeat_interleave(torch.arange(n, device=device), counts)  # (B,) each completion's row
    slot = torch.arange(batch, device=device) - starts[group]  # (B,) its place in its group
    per_group = inputs.new_zeros(n, int(counts.max()))
    per_group[group, slot] = inputs
    offsets = (per_group.cumsum(1) - per_group)[group, slot]  # where each completion starts after its prompt
    length = _packed_length(prompt_mask, completion_mask, counts)
    row = group[:, None].expand(batch, T - 1)[real_input]
    column = (P + offsets[:, None] + step)[real_input]
    prompt_positions = _positions(unique_mask)
    input_ids = unique_ids.new_zeros(n, length)  # the rows' trailing padding: any token, never attended to
    input_ids[:, :P] = unique_ids
    input_ids[row, column] = completion_ids[:, :-1][real_input]
    positions = torch.zeros_like(input_ids)
    positions[:, :P] = prompt_positions
    positions[row, column] = prompt_positions[row, -1] + 1 + step.expand(batch, T - 1)[real_input]
    layout = fast_llama.PromptGroups.of(unique_mask, per_group, length)
    # Rows kept: each group's last prompt position (it predicts token 0 of all G), then every real input.
    keep = torch.cat([torch.arange(n, device=device) * length + P - 1, row * length + column])
    logits = fast_llama.forward(fast_llama.llama_of(model), input_ids, positions, layout, logits_at=keep)
    row_of = group[:, None].repeat(1, T)
    row_of[:, 1:][real_input] = n + torch.arange(int(real_input.sum()), device=device)
    return logits, row_of


def _completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask, group_size: int) -> torch.Tensor:
    """(B, T, V) logits predicting each completion token: position t predicts completion token t.

    With ``group_size`` > 1 the G identical prompts of a group go through the model once: the prompt's
    KV cache (still in the autograd graph) is repeated G times and the completions attend to it, as in
    sampling. The result is the same function of the weights as one forward of each full sequence, and
    its gradient is the same sum over the G completions; only the floating-point order differs (~1e-6),
    while the prompt's share of the compute falls by a factor G. Llama-architecture models run
    ``fast_llama.forward``, whose logits and gradients equal transformers' bit for bit (tested; at bf16 on a
    CPU, attention's backward runs at fp32 there).
    """
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    positions = _positions(attention_mask)
    P, T = prompt_ids.size(1), completion_ids.size(1)
    llama = fast_llama.llama_of(model)
    fast = llama is not None

    def run(input_ids, mask, position_ids, cache=None, logits_to_keep=0):
        if fast:
            return fast_llama.forward(llama, input_ids, position_ids, mask, cache, logits_to_keep=logits_to_keep)
        return model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, past_key_values=cache,
                     use_cache=cache is not None, logits_to_keep=logits_to_keep).logits

    if group_size < 2:
        logits = run(torch.cat([prompt_ids, completion_ids], dim=1), attention_mask, positions, logits_to_keep=T + 1)
        return logits[:, :-1, :]  # (B, T, V)
    unique_ids, unique_mask = prompt_ids[::group_size], prompt_mask[::group_size]  # (n, P)
    if fast:
        cache = fast_llama.KVCache(model.config.num_hidden_layers)
    else:
        from transformers import DynamicCache

        cache = DynamicCache()
    first = run(unique_ids, unique_mask, _positions(unique_mask), cache, logits_to_keep=1)
    cache.batch_repeat_interleave(group_size)
    first = first.repeat_interleave(group_size, dim=0)  # (B, 1, V) predicts token 0
    if T == 1:
        return first
    rest = run(completion_ids[:, :-1], attention_mask[:, :-1], positions[:, P:-1], cache)  # (B, T-1, V)
    return torch.cat([first, rest], dim=1)


def _inputs_per_completion(completion_mask: torch.Tensor) -> torch.Tensor:
    """(B,) each completion's real tokens but its last: the positions of it a packed row holds."""
    return (completion_mask.sum(1) - 1).clamp(min=0)


def _packed_length(prompt_mask: torch.Tensor, completion_mask: torch.Tensor, counts: torch.Tensor) -> int:
    """The packed rows' length: a prompt, then each of its run's (``counts``) completions' real tokens but its last."""
    inputs = _inputs_per_completion(completion_mask)
    runs = torch.repeat_interleave(torch.arange(counts.numel(), device=inputs.device), counts)
    return prompt_mask.size(1) + int(inputs.new_zeros(counts.numel()).index_add_(0, runs, inputs).max())


def _layout(model, prompt_ids, prompt_mask, completion_mask, group_size: int,
            group_counts: Optional[Sequence[int]] = None) -> tuple[str, Optional[torch.Tensor]]:
    """How per_token_logps runs the batch: "packed", "cached" (a group's prompt once, through its KV cache) or
    "full" (every row whole); with the groups' sizes where a prompt is encoded once (``_prompt_runs``). A grouped
    minibatch's groups of unequal size are packed, or else run whole."""
    counts = _prompt_runs(prompt_ids, prompt_mask, group_size, group_counts)
    if counts is not None:
        if (_prefix(completion_mask) and fast_llama.llama_of(model) is not None
                and _packed_length(prompt_mask, completion_mask, counts) <= PACKED_MAX_LENGTH):
            return "packed", counts
        if group_counts is None and _sharing_pays(model, prompt_mask, group_size):
            return "cached", counts
    return "full", None


def positions_processed(model, rollout: Rollout) -> int:
    """Positions one log-prob forward of ``rollout`` runs through ``model`` (the packed rows' trailing padding
    included): what its FLOPs scale with."""
    prompt_ids, prompt_mask, completion_mask = rollout.prompt_ids, rollout.prompt_mask, rollout.completion_mask
    layout, counts = _layout(model, prompt_ids, prompt_mask, completion_mask, rollout.group_size, rollout.group_counts)
    rows, T = completion_mask.shape
    if layout == "packed":
        return counts.numel() * _packed_length(prompt_mask, completion_mask, counts)
    if layout == "cached":
        return counts.numel() * prompt_ids.size(1) + rows * (T - 1)
    return rows * (prompt_ids.size(1) + T)


def per_token_logps(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    group_size: int = 1,
    entropy_grad: bool = False,
    with_sum_pi_squared: bool = False,
    group_counts: Optional[Sequence[int]] = None,
):
    """(B, T) log pi(o_t | q, o_<t) of each completion token (logits / temperature, as sampled).

    Gradients flow iff the caller is not under ``torch.no_grad()``. With ``with_entropy`` also
    returns the (B, T) entropy of each next-token distribution, detached unless ``entropy_grad`` (an
    entropy bonus in the loss). With ``with_sum_pi_squared`` also (last) the (B, T) sum over the
    vocabulary of pi(v)^2, detached (the optimal token baseline's score norm). With ``group_size`` G > 1
    and rows grouped by prompt (G consecutive rows share one prompt), each prompt is encoded once:
    packed with its G completions into one row (``_packed_completion_logits``) when that row is short,
    else through a KV cache where that saves more than it costs (``SHARED_PROMPT_MIN_WORK``). ``group_counts``:
    the rows come in runs of one prompt of these sizes (a grouped minibatch), packed the same way.
    """
    logits, row_of = completion_outputs(model, prompt_ids, prompt_mask, completion_ids, completion_mask,
                                        group_size=group_size, group_counts=group_counts)
    return logps_from_logits(logits, row_of, completion_ids, temperature=temperature, with_entropy=with_entropy,
                             entropy_grad=entropy_grad, with_sum_pi_squared=with_sum_pi_squared)


def completion_outputs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, *, group_size: int = 1,
                       group_counts: Optional[Sequence[int]] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's outputs (R, V) at the positions that predict completion tokens, and (B, T) the row of them that
    predicts each token, in the layout ``per_token_logps`` picks: its log-probs read them through a vocabulary
    head, PPO's critic through a scalar one."""
    layout, counts = _layout(model, prompt_ids, prompt_mask, completion_mask, group_size, group_counts)
    if layout == "packed":
        return _packed_completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask, counts)
    logits = _completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask,
                                group_size if layout == "cached" else 1)  # (B, T, V)
    row_of = torch.arange(completion_ids.numel(), device=logits.device).view(completion_ids.shape)
    return logits.reshape(-1, logits.size(-1)), row_of


def logps_from_logits(logits: torch.Tensor, row_of: torch.Tensor, tokens: torch.Tensor, *, temperature: float = 1.0,
                      with_entropy: bool = False, entropy_grad: bool = False, with_sum_pi_squared: bool = False):
    """(B, T) log softmax(logits[row_of] / temperature)[tokens] from (R, V) logits, ``row_of`` (B, T) naming the row
    that predicts each token (a row may predict several: a packed group's last prompt position is normalised once);
    with ``with_entropy`` and ``with_sum_pi_squared`` also each token's row's entropy and sum of pi^2, as
    ``per_token_logps`` returns them. Chunked over rows (``_TokenLogps``) unless the entropy needs its graph."""
    scale = temperature if temperature > 0 and temperature != 1.0 else None
    if with_entropy and entropy_grad and torch.is_grad_enabled():
        return _logps_with_entropy_graph(logits, row_of, tokens, scale, with_sum_pi_squared)
    logps, entropy, sum_pi_squared = _TokenLogps.apply(logits, row_of.reshape(-1), tokens.reshape(-1), scale,
                                                       with_entropy, with_sum_pi_squared)
    outputs = [logps.view(tokens.shape)]
    if with_entropy:
        outputs.append(entropy[row_of])  # (B, T)
    if with_sum_pi_squared:
        outputs.append(sum_pi_squared[row_of])  # (B, T)
    return outputs[0] if len(outputs) == 1 else tuple(outputs)


# Elements of logits per chunk of rows in the log-prob tail (3 MB of fp32, 16 rows of a 49k vocabulary): each
# chunk's passes (scale, log-sum-exp, entropy; in the backward, the softmax) run on numbers still in cache,
# where the whole-tensor ops each streamed the (R, V) logits through memory and made a copy of them. GSM8K's
# 460 x 49152 logits, forward with entropy and backward, 2-core EPYC: 318 -> 96 ms, the same numbers bit for bit.
LOGPS_CHUNK_ELEMENTS = 16 * 49152


class _TokenLogps(torch.autograd.Function):
    """logps (N,) = log softmax(logits[rows] / scale)[tokens] for N (row, token) pairs of (R, V) logits, with
    each row's entropy and sum of pi^2 (R,) (detached; empty unless asked), a chunk of rows at a time.

    The ops are whole-tensor ones applied to row chunks (log-sum-exp, log-softmax, the backward's
    grad x exp(x - lse) and the accumulated scatter of the picked tokens' gradient), so every number equals
    ``logits[rows, tokens] - logsumexp(logits)[rows]``'s and its autograd gradient's (tested). Saves only the
    logits and the (R,) log-sum-exps."""

    @staticmethod
    def forward(ctx, logits, rows, tokens, scale, with_entropy, with_sum_pi_squared):
        R = logits.size(0)
        step = max(1, LOGPS_CHUNK_ELEMENTS // max(1, logits.size(1)))
        lse = logits.new_empty(R, dtype=torch.float32)
        entropy = logits.new_empty(R if with_entropy else 0, dtype=torch.float32)
        sum_pi_squared = logits.new_empty(R if with_sum_pi_squared else 0, dtype=torch.float32)
        for start in range(0, R, step):
            x = _scaled(logits[start:start + step], scale)
            lse[start:start + step] = torch.logsumexp(x, dim=-1)
            if with_entropy or with_sum_pi_squared:
                log_probs = F.log_softmax(x, dim=-1)
                if with_entropy:
                    entropy[start:start + step] = _entropy(log_probs)
                if with_sum_pi_squared:
                    sum_pi_squared[start:start + step] = _sum_pi_squared(log_probs)
        picked = _scaled(logits[rows, tokens], scale)
        ctx.save_for_backward(logits, lse, rows, tokens)
        ctx.scale, ctx.step = scale, step
        ctx.mark_non_differentiable(entropy, sum_pi_squared)
        return picked - lse[rows], entropy, sum_pi_squared

    @staticmethod
    def backward(ctx, grad, _entropy_grad, _sum_pi_squared_grad):
        logits, lse, rows, tokens = ctx.saved_tensors
        R, V = logits.shape
        # d logps_n / d x_r = onehot(token_n) - softmax(x_r) for r = rows_n; each row gets minus its tokens' summed grad
        row_grad = lse.new_zeros(R).index_put_((rows,), -grad, accumulate=True)
        # A (row, token) pair picked twice sums its grads first, as autograd's scatter into zeros does.
        flat, inverse = torch.unique(rows * V + tokens, return_inverse=True)
        picked_grad = grad.new_zeros(flat.numel()).index_put_((inverse,), grad, accumulate=True)
        grad_x = torch.empty(R, V, dtype=torch.float32, device=logits.device)
        for start in range(0, R, ctx.step):
            x = _scaled(logits[start:start + ctx.step], ctx.scale)
            grad_x[start:start + ctx.step] = row_grad[start:start + ctx.step, None] * (x - lse[start:start + ctx.step, None]).exp()
        grad_x.view(-1)[flat] += picked_grad
        if ctx.scale is not None:
            grad_x /= ctx.scale
        return grad_x.to(logits.dtype), None, None, None, None, None


def _scaled(logits: torch.Tensor, scale: Optional[float]) -> torch.Tensor:
    logits = logits.float()
    return logits if scale is None else logits / scale


def _logps_with_entropy_graph(logits, row_of, tokens, scale, with_sum_pi_squared):
    """``per_token_logps``'s outputs with the entropy in the autograd graph (an entropy bonus), whole-tensor."""
    x = _scaled(logits, scale)
    logps = x[row_of, tokens] - torch.logsumexp(x, dim=-1)[row_of]  # (B, T)
    log_probs = F.log_softmax(x, dim=-1)  # (R, V)
    outputs = [logps, _entropy(log_probs)[row_of]]
    if with_sum_pi_squared:
        outputs.append(_sum_pi_squared(log_probs.detach())[row_of])
    return tuple(outputs)


def _entropy(log_probs: torch.Tensor) -> torch.Tensor:
    return -(log_probs.exp() * log_probs).sum(-1)


def _sum_pi_squared(log_probs: torch.Tensor) -> torch.Tensor:
    return log_probs.mul(2).exp().sum(-1)


def rollout_logps(model, rollout: Rollout, *, temperature: float = 1.0, with_entropy: bool = False,
                  entropy_grad: bool = False, with_sum_pi_squared: bool = False):
    return per_token_logps(
        model,
        rollout.prompt_ids,
        rollout.prompt_mask,
        rollout.completion_ids,
        rollout.completion_mask,
        temperature=temperature,
        with_entropy=with_entropy,
        group_size=rollout.group_size,
        entropy_grad=entropy_grad,
        with_sum_pi_squared=with_sum_pi_squared,
        group_counts=rollout.group_counts,
    )


def rollout_from_text(tokenizer, prompts: Sequence[str], completions: Sequence[str], device, *,
                      group_size: int = 1) -> Rollout:
    """A Rollout of given (prompt, completion) texts, each completion closed with EOS: offline data
    (DPO's preference pairs) gets the same masks and log-prob code as sampled completions. ``group_size``: the rows
    come in runs of that many with one prompt (a DPO pair's chosen and rejected), whose log-probs encode it once."""
    prompt_ids, prompt_mask = tokenize_prompts(tokenizer, prompts, device)
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    rows = [ids + [eos] for ids in tokenizer(list(completions), add_special_tokens=False)["input_ids"]]
    T = max(len(r) for r in rows)
    completion_ids = torch.tensor([r + [pad] * (T - len(r)) for r in rows], device=device)
    completion_mask = torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in rows], device=device)
    return Rollout(
        prompts=list(prompts), completions=list(completions), prompt_ids=prompt_ids, prompt_mask=prompt_mask,
        completion_ids=completion_ids, completion_mask=completion_mask,
        truncated=torch.zeros(len(rows), dtype=torch.bool, device=device), group_size=group_size,
    )


def sequence_inputs(rollout: Rollout) -> dict[str, torch.Tensor]:
    """Model inputs for prompt + completion (what ``per_token_logps`` feeds the policy), for other heads (PPO's critic)."""
    attention_mask = torch.cat([rollout.prompt_mask, rollout.completion_mask], dim=1)
    return {
        "input_ids": torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1),
        "attention_mask": attention_mask,
        "position_ids": _positions(attention_mask),
    }
