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

Precisions. ``fp32`` is what training samples with; ``bf16`` samples under autocast (``sampling_precision
= "bf16"``), its roof from the bf16 weight bytes and a bf16 matrix product; ``int8`` is the suite's int8
sampler (``sampling_precision = "int8"``: W8A8 dynamic quantisation, ``algorithms/quantize.py``), its roof
from int8 weight bytes and the faster of two int8 products on this machine (``torch._int_mm``, which the
sampler runs, and fbgemm's prepacked dynamic linear). A faster sampler only pays if it samples nearly the
same distribution: for each lower precision the report gives the KL divergence from the fp32 next-token
distribution and how often the two agree on the most likely token, over the positions of the model's own
greedy fp32 continuations of the prompts.

On a CUDA GPU (``--device cuda``) the same roof comes from the card's measured bandwidth (the triad on the
device) and its matrix product, and a second bound is measured: the *launch floor*. A decoding step of a 135M
model is a few hundred small kernels, each reading little, so a GPU step is set by launching them rather than by
the bytes; the sampler replays the step as one captured CUDA graph (``fast_llama.cuda_graph_decoder``). The
floor is the replay time of a captured graph of as many kernels doing no work (a one-element add each), the
kernels per step counted by the profiler over two sampler runs that differ only in their new tokens (graph
replays, sampling included); the eager path's count is recorded beside it as a check that the profiler saw the
graph's kernels. int8 sampling is the CPU's only (fbgemm and ``torch._int_mm`` on the CPU).

Every time is the best of ``repeats``: on a shared machine, interference only ever adds time, so the
minimum is the measurement least disturbed by it.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Callable, Optional

import torch

from algorithms import fast_llama
from algorithms.rollout import CUDA_GRAPH_MIN_NEW_TOKENS, _positions, generate
from benchmarks.errors import UsageError
from benchmarks.harness.measure import device_name, requested_device
from benchmarks.io import atomic_write_text
from benchmarks.markdown import markdown_table
from benchmarks.study import StudySettings, option
from tasks.smollm import load_causal_lm

CPU = torch.device("cpu")


@dataclasses.dataclass
class RoofSettings(StudySettings):
    batch_sizes: list[int] = dataclasses.field(default_factory=lambda: [1, 4, 16, 32, 64],
                                               metadata={"help": "rows decoded together"})
    new_tokens: int = dataclasses.field(default=64, metadata={"help": "decoding steps per timed run"})
    # 0: torch's default, what the matrix's cells get on this machine
    threads: int = option("threads", shown="0, torch's own")
    repeats: int = dataclasses.field(default=3, metadata={"help": "timed runs per measurement, the best kept"})
    stream_mib: int = dataclasses.field(default=256, metadata={"help": "STREAM array size"})
    model: str = dataclasses.field(default="", metadata={
        "help": "a HF id or local directory (default: SmolLM2-135M-Instruct from its GGUF)"})
    precisions: Optional[list[str]] = dataclasses.field(default=None, metadata={
        "help": "sampling precisions to measure, of fp32 bf16 int8 (int8 on the CPU only; default: all three on the "
                "CPU, fp32 and bf16 on CUDA)"})
    device: str = option("device")
    out: str = option("out", None, shown="results/perf, or results/gpu on CUDA")  # roof.md and roof.json


PRECISIONS = ("fp32", "bf16", "int8")
PROMPTS = ("Write a short story about a robot learning to paint.", "What is 17 + 25? Think step by step.",
           "List three uses of a paperclip.", "Explain why the sky is blue in two sentences.")


def _best(fn: Callable[[], None], repeats: int, device: torch.device = CPU) -> float:
    """The least wall-clock time of ``repeats`` calls of ``fn`` after one warm-up, each to its device's finish."""
    finish = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()  # warm-up: allocation, first-touch pages, kernel selection
    finish()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        finish()
        times.append(time.perf_counter() - start)
    return min(times)


def memory_bandwidth(mib: int, repeats: int, device: torch.device = CPU) -> float:
    """Bytes per second of a STREAM triad a = b + s * c (reads b and c, writes a) on ``device``."""
    n = mib * 2**20 // 4
    a, b, c = torch.empty(n, device=device), torch.rand(n, device=device), torch.rand(n, device=device)
    seconds = _best(lambda: torch.add(b, c, alpha=3.0, out=a), repeats, device)
    return 3 * n * 4 / seconds


def matmul_flops(size: int, repeats: int, precision: str = "fp32", device: torch.device = CPU) -> float:
    """FLOP/s of a (size x size) @ (size x size) product at ``precision`` on ``device``: fp32, bf16, or int8 (the
    CPU's: the faster of ``torch._int_mm`` on int8 codes and fbgemm's dynamic linear, which quantises its input
    per call)."""
    if device.type != "cpu":
        x, y = (torch.rand(size, size, device=device) for _ in range(2))
        if precision == "bf16":
            x, y = x.bfloat16(), y.bfloat16()
        return 2 * size**3 / _best(lambda: torch.mm(x, y), repeats, device)
    x, y = torch.rand(size, size), torch.rand(size, size)
    if precision == "bf16":
        x, y = x.bfloat16(), y.bfloat16()
    if precision == "int8":
        codes_x, codes_y = (torch.randint(-127, 128, (size, size), dtype=torch.int8) for _ in range(2))
        linear = _quantized(torch.nn.Sequential(torch.nn.Linear(size, size, bias=False)))[0]
        with torch.inference_mode():
            seconds = min(_best(lambda: torch._int_mm(codes_x, codes_y), repeats), _best(lambda: linear(x), repeats))
        return 2 * size**3 / seconds
    return 2 * size**3 / _best(lambda: torch.mm(x, y), repeats)


def _quantized(model):
    """A copy of ``model`` with every ``nn.Linear`` dynamically quantised to int8 (per output row)."""
    import copy
    import warnings

    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():  # torch.ao's quantised tensors are deprecated for torchao; the op still runs
        warnings.simplefilter("ignore")
        return quantize_dynamic(copy.deepcopy(model).eval(), {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8)


def _context(precision: str, device: torch.device = CPU):
    """The context the sampler runs in at ``precision``: autocast for bf16."""
    import contextlib

    return torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()


def weight_bytes_read(model, precision: str) -> int:
    """Bytes of weights one decoding step reads: every parameter but the input embedding (a lookup), whose
    tied output layer is counted once; matrices at the precision's width (bf16 2, int8 1), vectors in fp32."""
    embedding = model.get_input_embeddings().weight
    tied = model.get_output_embeddings() is not None and model.get_output_embeddings().weight is embedding
    width = {"fp32": 4, "bf16": 2, "int8": 1}[precision]
    total = 0
    for p in model.parameters():
        if p is embedding and not tied:
            continue
        total += p.numel() * (width if p.dim() == 2 else 4)
    return total


def agreement_with_fp32(model, tokenizer, precision: str, new_tokens: int = 32, device: torch.device = CPU) -> dict:
    """KL(fp32 || precision) of the next-token distributions and how often their argmax agrees, over the
    positions of the fp32 model's greedy continuations of ``PROMPTS`` (prompt and continuation)."""
    with torch.inference_mode():
        rollout = generate(model, tokenizer, list(PROMPTS), 1, max_new_tokens=new_tokens, temperature=0)
        ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1)
        mask = torch.cat([rollout.prompt_mask, rollout.completion_mask], dim=1)
        reference = model(input_ids=ids, attention_mask=mask, position_ids=_positions(mask)).logits.float()
        if precision == "int8":  # what the int8 sampler computes: fast_llama over the quantised weights
            llama = fast_llama.llama_of(model)  # a LoRA policy's Llama, its adapters folded into the weights
            int8 = fast_llama.FusedProjections.of(llama, int8=True)
            other = fast_llama.forward(llama, ids, _positions(mask), mask, fused=int8).float()
        else:
            with _context(precision, device):
                other = model(input_ids=ids, attention_mask=mask, position_ids=_positions(mask)).logits.float()
    real = mask.bool()
    log_p, log_q = reference.log_softmax(-1)[real], other.log_softmax(-1)[real]
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    return {"positions": int(real.sum()), "kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
            "argmax_agreement": float((log_p.argmax(-1) == log_q.argmax(-1)).float().mean())}


def _short_run(device: torch.device) -> int:
    """New tokens of the run whose time is subtracted: one (the prefill) on the CPU; on CUDA as many as the
    sampler needs to replay its captured graph, so that the capture is in both runs and cancels."""
    return CUDA_GRAPH_MIN_NEW_TOKENS if device.type == "cuda" else 1


def _sampler_run(model, tokenizer, batch: int, tokens: int, precision: str, device: torch.device, steps: dict):
    """A call of the suite's sampler at ``batch`` rows of one prompt, ``tokens`` new tokens, seeded; it records
    the decoding steps it took in ``steps[tokens]``."""
    prompts = ["Write a short story about a robot learning to paint."] * batch

    def go() -> None:
        with _context(precision, device):
            rollout = generate(model, tokenizer, prompts, 1, max_new_tokens=tokens, temperature=1.0,
                               generator=torch.Generator(device=device).manual_seed(0), int8=precision == "int8")
        steps[tokens] = rollout.completion_ids.size(1)
    return go


def decode_rate(model, tokenizer, batch: int, new_tokens: int, repeats: int, precision: str = "fp32",
                device: torch.device = CPU) -> tuple[float, int]:
    """(decoded tokens per second, decoding steps) of the suite's sampler at ``batch`` rows and ``precision``,
    prefill excluded (so is the int8 sampler's quantisation of the weights, once per call like the prefill, and
    on CUDA the graph's capture): a run of ``new_tokens`` minus a run of ``_short_run``'s."""
    steps: dict[int, int] = {}
    short = _short_run(device)
    long_s = _best(_sampler_run(model, tokenizer, batch, new_tokens, precision, device, steps), repeats, device)
    short_s = _best(_sampler_run(model, tokenizer, batch, short, precision, device, steps), repeats, device)
    taken, subtracted = steps[new_tokens], steps[short]
    if taken <= subtracted:
        raise UsageError(f"batch {batch}: every row ended within {subtracted} token(s); raise --new-tokens")
    if long_s <= short_s:
        raise UsageError(f"batch {batch}: {taken} tokens took no longer than {subtracted} (timer noise); raise "
                         "--new-tokens or --repeats")
    return batch * (taken - subtracted) / (long_s - short_s), taken


def kernels_per_step(model, tokenizer, batch: int, new_tokens: int, precision: str, device: torch.device) -> dict:
    """CUDA kernels (memory copies and sets included) one decoding step launches, counted by the profiler as the
    difference between two sampler runs that differ only in their new tokens, per step: on the graph path (its
    replays and the sampling between them) and on the eager path (below ``CUDA_GRAPH_MIN_NEW_TOKENS`` new tokens,
    the lean forward launched kernel by kernel). Nearly the same kernels: the eager count checks that the
    profiler saw the graph's."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    def count(tokens: int) -> tuple[int, int]:
        steps: dict[int, int] = {}
        run = _sampler_run(model, tokenizer, batch, tokens, precision, device, steps)
        run()  # the graph's capture and the kernels' first choices outside the profile
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run()
            torch.cuda.synchronize()
        return sum(1 for e in prof.events() if e.device_type == DeviceType.CUDA), steps[tokens]

    counts = {}
    for path, (short, long) in {"graph": (CUDA_GRAPH_MIN_NEW_TOKENS, max(new_tokens, 2 * CUDA_GRAPH_MIN_NEW_TOKENS)),
                                "eager": (2, CUDA_GRAPH_MIN_NEW_TOKENS - 1)}.items():
        (few, few_steps), (many, many_steps) = count(short), count(long)
        counts[path] = (many - few) / (many_steps - few_steps) if many_steps > few_steps else float("nan")
    return counts


def launch_floor_seconds(kernels: int, repeats: int, device: torch.device) -> float:
    """Seconds of one replay of a captured CUDA graph of ``kernels`` kernels that do no work (a one-element add
    each, in a chain as a step's kernels are): what launching a step's kernels costs however little they do."""
    x = torch.zeros(1, device=device)
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        x.add_(1)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(max(kernels, 1)):
            x.add_(1)
    return _best(graph.replay, max(repeats, 10), device)


def products_alone_rate(model, batch: int, repeats: int, precision: str = "fp32",
                        device: torch.device = CPU) -> float | None:
    """Tokens/s of a decoding step's matrix products alone at ``batch`` rows: every weight the sampler reads
    (per layer the fused q/k/v, o, gate/up and down, then the output layer), in its order, through its own
    kernels, on random inputs, and nothing else (None: a model fast_llama does not run). Beside the decode
    rate it splits the gap to the roof: the products (the kernels at this row count, weights streamed from
    memory) against everything else a step does (attention over the cache, norms, sampling, Python)."""
    llama = fast_llama.llama_of(model)
    if llama is None:
        return None
    dtype = torch.bfloat16 if precision == "bf16" else None
    with torch.inference_mode():
        products = fast_llama.sampling_weights(llama, batch, dtype, int8=precision == "int8").in_reading_order()
        width = [fast_llama.in_features(w) for w, _ in products]
        inputs = [torch.randn(batch, 1, k, dtype=dtype or torch.float32, device=device) for k in width]

        def step() -> None:
            for (weight, bias), x in zip(products, inputs):
                fast_llama.linear(x, weight, bias, few_rows_fast=True)

        return batch / _best(step, repeats, device)


def run_roof(settings: RoofSettings, command: str) -> dict:
    if not settings.batch_sizes or min(settings.batch_sizes) < 1 or settings.new_tokens < 2 or settings.repeats < 1:
        raise UsageError("--batch-sizes must be >= 1, --new-tokens >= 2 and --repeats >= 1")
    device = requested_device(settings.device)
    cuda = device.type == "cuda"
    asked = settings.precisions if settings.precisions is not None else (
        ["fp32", "bf16"] if cuda else list(PRECISIONS))
    unknown = sorted(set(asked) - set(PRECISIONS))
    if unknown or not asked:
        raise UsageError(f"--precisions takes {', '.join(PRECISIONS)}; got {', '.join(unknown) or 'none'}")
    if cuda and "int8" in asked:
        raise UsageError("--precisions int8 is the CPU's sampler only; on CUDA measure fp32 and bf16")
    if cuda and settings.new_tokens < 2 * CUDA_GRAPH_MIN_NEW_TOKENS:
        raise UsageError(f"--new-tokens must be >= {2 * CUDA_GRAPH_MIN_NEW_TOKENS} on CUDA (the run subtracted "
                         f"takes {CUDA_GRAPH_MIN_NEW_TOKENS}, the fewest the sampler replays its graph for)")
    if settings.threads:
        torch.set_num_threads(settings.threads)
    threads = torch.get_num_threads()
    bandwidth = memory_bandwidth(settings.stream_mib, settings.repeats, device)
    model, tokenizer = load_causal_lm(settings.model or None)
    model.to(device).eval()
    params = sum(p.numel() for p in model.parameters())
    rows, flops_by_precision, agreement = [], {}, {}
    fp32_rate: dict[int, float] = {}
    precisions = sorted(set(asked), key=PRECISIONS.index)
    for precision in precisions:
        flops = flops_by_precision[precision] = matmul_flops(8192 if cuda else 2048, settings.repeats, precision, device)
        weight_bytes = weight_bytes_read(model, precision)
        if precision != "fp32":
            agreement[precision] = agreement_with_fp32(model, tokenizer, precision, device=device)
        for batch in settings.batch_sizes:
            memory_s, compute_s = weight_bytes / bandwidth, 2 * params * batch / flops
            roof = batch / max(memory_s, compute_s)
            rate, steps = decode_rate(model, tokenizer, batch, settings.new_tokens, settings.repeats, precision, device)
            products = products_alone_rate(model, batch, settings.repeats, precision, device)
            if precision == "fp32":
                fp32_rate[batch] = rate
            bound = "memory" if memory_s >= compute_s else "compute"
            row = {"precision": precision, "batch": batch, "decode_steps": steps, "tokens_per_s": rate,
                   "roof_tokens_per_s": roof, "share_of_roof": rate / roof, "bound": bound,
                   "weight_bytes": weight_bytes, "products_alone_tokens_per_s": products,
                   "speed_vs_fp32": rate / fp32_rate[batch] if batch in fp32_rate else None}
            if cuda:
                row.update(_launch_floor(model, tokenizer, batch, rate, precision, settings, device))
            rows.append(row)
            print(f"{precision} batch {batch:3d}: {rate:8.1f} tokens/s, roof {roof:8.1f} ({bound}-bound): {rate / roof:.0%}"
                  + (f"; {row['step_over_floor']:.1f}x its launch floor" if cuda else ""), flush=True)
    result = {"command": command, "device": device_name(device), "threads": threads,
              "memory_bandwidth_bytes_per_s": bandwidth,
              "matmul_flops_per_s": flops_by_precision, "model": settings.model or "SmolLM2-135M-Instruct (GGUF, fp32)",
              "parameters": params, "new_tokens": settings.new_tokens, "repeats": settings.repeats, "rows": rows,
              "agreement_with_fp32": agreement}
    out = Path(settings.out or ("results/gpu" if cuda else "results/perf"))
    atomic_write_text(out / "roof.json", json.dumps(result, indent=2) + "\n")
    atomic_write_text(out / "roof.md", render(result))
    print(f"wrote {out / 'roof.md'}, {out / 'roof.json'}")
    return result


def _launch_floor(model, tokenizer, batch: int, rate: float, precision: str, settings: RoofSettings,
                  device: torch.device) -> dict:
    """A CUDA row's kernels a step (graph and eager path), its launch floor in tokens/s and the step's multiple of it."""
    counted = kernels_per_step(model, tokenizer, batch, settings.new_tokens, precision, device)
    seen = [v for v in counted.values() if v == v]  # NaN: a path whose rows all ended at once
    if not seen:
        raise UsageError(f"batch {batch}: every row ended before the kernels could be counted; raise --new-tokens")
    floor = batch / launch_floor_seconds(round(max(seen)), settings.repeats, device)
    return {"kernels_per_step": counted["graph"], "kernels_per_step_eager": counted["eager"],
            "launch_floor_tokens_per_s": floor, "step_over_floor": floor / rate}


def _lower_precision_lines(rows: list[dict], batch: int) -> list[str]:
    """For each precision but fp32, at ``batch``: its rate, its speed against fp32's and its share of its own
    roof and of fp32's (a lower precision moves the roof: beating fp32's roof is the point of it)."""
    fp32 = next((r for r in rows if r["precision"] == "fp32" and r["batch"] == batch), None)
    lines = []
    for row in rows:
        if row["precision"] == "fp32" or row["batch"] != batch or fp32 is None:
            continue
        lines += [f"**{row['precision']} decoding at batch {batch}: {row['tokens_per_s']:.0f} tokens/s, "
                  f"{row['tokens_per_s'] / fp32['tokens_per_s']:.2f}x fp32's, {row['share_of_roof']:.0%} of its own roof "
                  f"({row['roof_tokens_per_s']:.0f} tokens/s) and {row['tokens_per_s'] / fp32['roof_tokens_per_s']:.0%} "
                  "of fp32's.**", ""]
    return lines


def _products_cells(row: dict) -> list[str]:
    products = row.get("products_alone_tokens_per_s")
    if not products:
        return ["", "", ""]
    return [f"{products:.1f}", f"{products / row['roof_tokens_per_s']:.0%}", f"{row['tokens_per_s'] / products:.0%}"]


def _floor_lines(rows: list[dict]) -> list[str]:
    """On CUDA: each precision's step against its launch floor at batch 64 (else the largest measured), and a
    warning where the profiler counted far fewer kernels on the graph path than on the eager one."""
    lines = []
    for precision in dict.fromkeys(r["precision"] for r in rows if "launch_floor_tokens_per_s" in r):
        measured = [r for r in rows if r["precision"] == precision and "launch_floor_tokens_per_s" in r]
        r = next((m for m in measured if m["batch"] == 64), measured[-1])
        lines += [f"**{precision} at batch {r['batch']}: a decoding step takes {r['step_over_floor']:.1f}x its launch "
                  f"floor ({r['tokens_per_s']:.0f} tokens/s against the floor's {r['launch_floor_tokens_per_s']:.0f}; "
                  f"{r['kernels_per_step']:.0f} kernels a step) and reaches {r['share_of_roof']:.1%} of its roof.**", ""]
    if any(r.get("kernels_per_step", 0) < 0.5 * r.get("kernels_per_step_eager", 0) for r in rows):
        lines += ["The profiler counted fewer than half the eager path's kernels on the graph path (it did not see "
                  "the replayed graph's kernels): the floor is built from the eager count.", ""]
    return lines


def _floor_cells(row: dict) -> list[str]:
    if "launch_floor_tokens_per_s" not in row:
        return []
    return [f"{row['kernels_per_step']:.0f} / {row['kernels_per_step_eager']:.0f}",
            f"{row['launch_floor_tokens_per_s']:.0f}", f"{row['step_over_floor']:.1f}x"]


def render(result: dict) -> str:
    rows = result["rows"]
    fp32 = [r for r in rows if r["precision"] == "fp32"] or rows
    at16 = [r for r in fp32 if r["batch"] >= 16]
    best = max(at16 or fp32, key=lambda r: r["share_of_roof"])
    rates = ", ".join(f"{p} {v / 1e9:.0f}" for p, v in result["matmul_flops_per_s"].items())
    floors = any("launch_floor_tokens_per_s" in r for r in rows)
    where = result.get("device") if floors else f"{result['threads']} thread(s)"
    subtracted = (f"{CUDA_GRAPH_MIN_NEW_TOKENS} (the prefill and the graph's capture)" if floors else "one (the prefill)")
    lines = ["# Generation against its roof", "",
             f"**{best['precision']} decoding at batch {best['batch']} runs at {best['share_of_roof']:.0%} of its roof "
             f"({best['tokens_per_s']:.0f} of {best['roof_tokens_per_s']:.0f} tokens/s); measured bandwidth "
             f"{result['memory_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s, matmul GFLOP/s {rates}, on "
             f"{where}.**", "",
             *_floor_lines(rows),
             *_lower_precision_lines(rows, best["batch"]),
             f"{result['model']}: {result['parameters'] / 1e6:.1f} M parameters. Roof per step: max(weight bytes read / "
             "bandwidth, 2 x parameters x batch / the precision's matmul rate), the weight bytes at the precision's "
             "width; the KV cache and sampling are left out, so the roof is optimistic. Measured: the suite's "
             f"sampler, {result['new_tokens']} new tokens minus {subtracted}, best of {result['repeats']}; "
             "bf16 under autocast, int8 the suite's W8A8 sampler (its weights quantised once per call, like the "
             "prefill left out of the rate).", "",
             "Products alone: the same step's matrix products and nothing else, through the sampler's kernels on "
             "random inputs; the share of the roof they reach is what the kernels allow at that batch, and the "
             "step's time beyond them is attention over the cache, norms, sampling and Python.", "",
             *(["Launch floor (CUDA): the replay time of a captured graph of as many kernels as a decoding step "
                "launches (counted by the profiler over two runs that differ in their new tokens, graph replays and "
                "sampling included; the eager path's count beside it), each doing no work: batch / that time is the "
                "most tokens/s launching alone allows. Step / floor: how many times the floor a step takes.", ""]
               if floors else []),
             markdown_table(["precision", "batch", "weights read", "decoded tokens/s", "roof tokens/s", "bound",
                             "share of roof", "products alone tokens/s", "products' share of roof",
                             "share of step in products", "speed vs fp32"]
                            + (["kernels a step (graph / eager)", "launch floor tokens/s", "step / floor"] if floors else []),
                            [[r.get("precision", "fp32"), r["batch"],
                              f"{r['weight_bytes'] / 2**20:.0f} MiB" if "weight_bytes" in r else "",
                              f"{r['tokens_per_s']:.1f}", f"{r['roof_tokens_per_s']:.1f}", r["bound"],
                              f"{r['share_of_roof']:.0%}", *_products_cells(r),
                              "" if r.get("speed_vs_fp32") is None else f"{r['speed_vs_fp32']:.2f}x", *_floor_cells(r)]
                             for r in rows])]
    agreement = result.get("agreement_with_fp32") or {}
    if agreement:
        lines += ["", "Does the faster sampler sample the same distribution? Against fp32, over the positions of its "
                  "greedy continuations of the prompts (a sampler far from the trainer's distribution makes the "
                  "importance-sampling correction mask or truncate most tokens):", "",
                  markdown_table(["precision", "positions", "KL from fp32, mean nats/token", "KL max",
                                  "same most likely token"],
                                 [[p, a["positions"], f"{a['kl_mean']:.4f}", f"{a['kl_max']:.3f}",
                                   f"{a['argmax_agreement']:.1%}"] for p, a in agreement.items()])]
    lines += ["", f"Regenerate: `{result['command']}`"]
    return "\n".join(lines) + "\n"
