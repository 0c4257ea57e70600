"""``grpo-bench bench roof``: generation's decoded tokens/s against the roof the machine's measured memory
bandwidth and matmul rate allow (benchmarks/perf/roof.py). Wire in with ``add_bench_roof_parser(which)``."""

from __future__ import annotations

from benchmarks.perf.roof import RoofSettings, run_roof


def add_bench_roof_parser(which) -> None:
    defaults = RoofSettings()
    p = which.add_parser("roof", help="generation tokens/s against the roof of the measured bandwidth and FLOP rate")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=defaults.batch_sizes,
                   help=f"rows decoded together (default: {' '.join(map(str, defaults.batch_sizes))})")
    p.add_argument("--new-tokens", type=int, default=defaults.new_tokens, help=f"decoding steps per timed run (default: {defaults.new_tokens})")
    p.add_argument("--threads", type=int, default=defaults.threads, help="torch threads (default: 0, torch's own)")
    p.add_argument("--repeats", type=int, default=defaults.repeats, help=f"timed runs per measurement, the best kept (default: {defaults.repeats})")
    p.add_argument("--stream-mib", type=int, default=defaults.stream_mib, help=f"STREAM array size (default: {defaults.stream_mib})")
    p.add_argument("--model", default=defaults.model, help="a HF id or local directory (default: SmolLM2-135M-Instruct from its GGUF)")
    p.add_argument("--precisions", nargs="+", default=defaults.precisions,
                   help=f"sampling precisions to measure, of fp32 bf16 int8 (default: {' '.join(defaults.precisions)})")
    p.add_argument("--out", default=defaults.out, help=f"folder for roof.md and roof.json (default: {defaults.out})")
    p.set_defaults(handler=cmd_bench_roof)


def cmd_bench_roof(args) -> int:
    run_roof(RoofSettings(batch_sizes=args.batch_sizes, new_tokens=args.new_tokens, threads=args.threads,
                          repeats=args.repeats, stream_mib=args.stream_mib, model=args.model, precisions=args.precisions, out=args.out),
             command=args.command_line)
    return 0
