"""int8 sampling: W8A8 dynamic quantisation of a linear layer, as rollout engines run it.

Scheme (vLLM's "W8A8 dynamic per-token", SmoothQuant without the smoothing; Xiao et al. 2023):

    W ~ s_w * Q_w,  s_w[n] = max_k |W[n, k]| / 127          (one scale per output row, symmetric, once per rollout)
    x ~ s_x * Q_x,  s_x[m] = max_k |x[m, k]| / 127          (one scale per token, at every call)
    y[m, n] = s_x[m] * s_w[n] * sum_k Q_x[m, k] Q_w[n, k] + b[n]

with Q = round(v / s) in [-127, 127] and the integer sum accumulated exactly in int32 (``torch._int_mm``).
The weight is quantised when a rollout starts (the policy changes every update), so quantising costs one
pass over the weights per ``generate`` call. What it changes is measured, not assumed: the sampler's
distribution moves away from the trainer's (``grpo-bench bench roof`` gives the KL per token), and GRPO's
truncated importance-sampling correction (``importance_sampling_correction``) reweights the loss by the
trainer/sampler ratio of each sampled token, as it does for a bf16 sampler.

Why int8 on a CPU: a decoding step of a few dozen rows through a 135M model runs x86's fp32 GEMM far below
its large-matrix rate (the weights stream from memory once per step); the int8 product (VNNI) moves a
quarter of the bytes and multiplies four times the lanes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

INT8_MAX = 127
TINY = 1e-12  # a row of zeros gets a positive scale: its codes are 0 and so is its product


@dataclass(frozen=True)
class Int8Weight:
    """A linear layer's weight (N, K) as int8 codes with one fp32 scale per output row."""

    codes: torch.Tensor  # (N, K) int8
    scale: torch.Tensor  # (N,) fp32

    @property
    def out_features(self) -> int:
        return self.codes.size(0)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 codes, fp32 scale (..., 1)) of ``x`` with one symmetric scale per row of its last dimension."""
    scale = x.abs().amax(dim=-1, keepdim=True).float().clamp_min(TINY) / INT8_MAX
    return torch.round(x.float() / scale).to(torch.int8), scale


ROWS_PER_BLOCK = 1024  # a block of a 576-wide weight is 2.4 MB: each pass over it stays in cache


def quantize_weight(*parts: torch.Tensor) -> Int8Weight:
    """The int8 weight of ``parts`` stacked by rows (q, k and v: the fused projection), quantised a block of
    rows at a time (the same codes as ``quantize_rows`` of the whole, without its full-size temporaries)."""
    width = parts[0].size(1)
    rows = sum(part.size(0) for part in parts)
    codes = torch.empty(rows, width, dtype=torch.int8, device=parts[0].device)
    scale = torch.empty(rows, dtype=torch.float32, device=parts[0].device)
    start = 0
    for part in parts:
        for block in part.detach().split(ROWS_PER_BLOCK):
            end = start + block.size(0)
            block_codes, block_scale = quantize_rows(block)
            codes[start:end], scale[start:end] = block_codes, block_scale.squeeze(-1)
            start = end
    return Int8Weight(codes=codes, scale=scale)


def dequantize(weight: Int8Weight) -> torch.Tensor:
    """The fp32 weight (N, K) an ``Int8Weight`` stands for."""
    return weight.codes.float() * weight.scale[:, None]


def int8_linear(x: torch.Tensor, weight: Int8Weight, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``x @ W.T + b`` (..., N) with ``x`` quantised per token and ``W`` per row, products summed in int32."""
    rows = x.reshape(-1, x.size(-1))  # (M, K)
    codes, scale = quantize_rows(rows)  # (M, K) int8, (M, 1)
    out = torch._int_mm(codes, weight.codes.t()).float().mul_(scale).mul_(weight.scale)  # (M, N), rescaled in place
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight.out_features)
