"""``grpo-bench bench roof``: how close generation runs to what the machine allows.

A decoding step of a batch of B rows reads every weight of the model once (the output layer included)
and does about 2 x parameters x B floating-point operations. So its time is at least

    max(weight bytes / memory bandwidth, 2 x parameters x B / matmul FLOP/s)

and the *roof* is B tokens per that time: memory-bound at small B, compute-bound from the batch where the
two terms meet. Both rates are measured here, on the threads generation uses: the bandwidth with a
STREAM-like triad (a = b + s x c over arrays far larger than the caches; 3 arrays' bytes moved), the FLOP
rate with a large fp32 matrix product. The KV cache's reads and the sampling are left out of the roof,
so it is optimistic; a measured rate is the suite's own sampler (``algorithms.rollout.generate``, static KV
cache), decoding tokens per second with the prefill subtracted (a run of T new tokens minus a run of one).

Every time is the best of ``repeats``: on a shared machine, interference only ever adds time, so the
minimum is the measurement least disturbed by it.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Callable

from benchmarks.errors import UsageError
from benchmarks.io import atomic_write_text
from benchmarks.markdown import markdown_table


@dataclasses.dataclass
class RoofSettings:
    batch_sizes: list[int] = dataclasses.field(default_factory=lambda: [1, 4, 16, 32, 64])
    new_tokens: int = 64  # decoding steps per timed run
    threads: int = 0  # torch threads (0: torch's default, what the matrix's cells get on this machine)
    repeats: int = 3  # timed runs per measurement; the best is kept
    stream_mib: int = 256  # size of each STREAM array
    model: str = ""  # a Hugging Face id or local directory; "" is SmolLM2-135M-Instruct from its GGUF
    out: str = "results/perf"


def _best(fn: Callable[[], None], repeats: int) -> float:
    fn()  # warm-up: allocation, first-touch pages, kernel selection
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def memory_bandwidth(mib: int, repeats: int) -> float:
    """Bytes per second of a STREAM triad a = b + s * c (reads b and c, writes a)."""
    import torch

    n = mib * 2**20 // 4
    a, b, c = torch.empty(n), torch.rand(n), torch.rand(n)
    seconds = _best(lambda: torch.add(b, c, alpha=3.0, out=a), repeats)
    return 3 * n * 4 / seconds


def matmul_flops(size: int, repeats: int) -> float:
    """FLOP/s of an fp32 (size x size) @ (size x size) product."""
    import torch

    x, y = torch.rand(size, size), torch.rand(size, size)
    return 2 * size**3 / _best(lambda: torch.mm(x, y), repeats)


def decode_rate(model, tokenizer, batch: int, new_tokens: int, repeats: int) -> tuple[float, int]:
    """(decoded tokens per second, decoding steps) of the suite's sampler at ``batch`` rows, prefill excluded."""
    import torch

    from algorithms.rollout import generate

    prompts = ["Write a short story about a robot learning to paint."] * batch
    steps = {}

    def run(tokens: int) -> Callable[[], None]:
        def go() -> None:
            rollout = generate(model, tokenizer, prompts, 1, max_new_tokens=tokens, temperature=1.0,
                               generator=torch.Generator().manual_seed(0))
            steps[tokens] = rollout.completion_ids.size(1)
        return go

    long_s = _best(run(new_tokens), repeats)
    short_s = _best(run(1), repeats)
    steps = steps[new_tokens]
    if steps < 2 or long_s <= short_s:
        raise UsageError(f"batch {batch}: every row ended before a second token; raise --new-tokens")
    return batch * (steps - 1) / (long_s - short_s), steps


def run_roof(settings: RoofSettings, command: str) -> dict:
    import torch

    from tasks.smollm import load_causal_lm

    if not settings.batch_sizes or min(settings.batch_sizes) < 1 or settings.new_tokens < 2 or settings.repeats < 1:
        raise UsageError("--batch-sizes must be >= 1, --new-tokens >= 2 and --repeats >= 1")
    if settings.threads:
        torch.set_num_threads(settings.threads)
    threads = torch.get_num_threads()
    bandwidth = memory_bandwidth(settings.stream_mib, settings.repeats)
    flops = matmul_flops(2048, settings.repeats)
    model, tokenizer = load_causal_lm(settings.model or None)
    params = sum(p.numel() for p in model.parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    rows = []
    for batch in settings.batch_sizes:
        step_s = max(weight_bytes / bandwidth, 2 * params * batch / flops)
        roof = batch / step_s
        rate, steps = decode_rate(model, tokenizer, batch, settings.new_tokens, settings.repeats)
        bound = "memory" if weight_bytes / bandwidth >= 2 * params * batch / flops else "compute"
        rows.append({"batch": batch, "decode_steps": steps, "tokens_per_s": rate, "roof_tokens_per_s": roof,
                     "share_of_roof": rate / roof, "bound": bound})
        print(f"batch {batch:3d}: {rate:8.1f} tokens/s, roof {roof:8.1f} ({bound}-bound): {rate / roof:.0%}", flush=True)
    result = {"command": command, "threads": threads, "memory_bandwidth_bytes_per_s": bandwidth,
              "matmul_flops_per_s": flops, "model": settings.model or "SmolLM2-135M-Instruct (GGUF, fp32)",
              "parameters": params, "weight_bytes": weight_bytes, "new_tokens": settings.new_tokens,
              "repeats": settings.repeats, "rows": rows}
    out = Path(settings.out)
    atomic_write_text(out / "roof.json", json.dumps(result, indent=2) + "\n")
    atomic_write_text(out / "roof.md", render(result))
    print(f"wrote {out / 'roof.md'}, {out / 'roof.json'}")
    return result


def render(result: dict) -> str:
    rows = result["rows"]
    at16 = [r for r in rows if r["batch"] >= 16]
    best = max(at16 or rows, key=lambda r: r["share_of_roof"])
    lines = ["# Generation against its roof", "",
             f"**Decoding at batch {best['batch']} runs at {best['share_of_roof']:.0%} of its roof "
             f"({best['tokens_per_s']:.0f} of {best['roof_tokens_per_s']:.0f} tokens/s); "
             f"measured bandwidth {result['memory_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s, matmul "
             f"{result['matmul_flops_per_s'] / 1e9:.0f} GFLOP/s on {result['threads']} thread(s).**", "",
             f"{result['model']}: {result['parameters'] / 1e6:.1f} M parameters, "
             f"{result['weight_bytes'] / 2**20:.0f} MiB of weights read per decoding step. Roof per step: "
             "max(weight bytes / bandwidth, 2 x parameters x batch / matmul rate); the KV cache and sampling are "
             f"left out, so the roof is optimistic. Measured: the suite's sampler, {result['new_tokens']} new tokens "
             f"minus one (the prefill), best of {result['repeats']}.", "",
             markdown_table(["batch", "decoded tokens/s", "roof tokens/s", "bound", "share of roof"],
                            [[r["batch"], f"{r['tokens_per_s']:.1f}", f"{r['roof_tokens_per_s']:.1f}", r["bound"],
                              f"{r['share_of_roof']:.0%}"] for r in rows]),
             "", f"Regenerate: `{result['command']}`"]
    return "\n".join(lines) + "\n"
