"""``grpo-bench bench precision``: every variant's training step at fp32, bf16 and bf16 with fp32 logits, side by
side (benchmarks/perf/precision.py). Wire in with ``add_bench_precision_parser(which)``."""

from __future__ import annotations

from benchmarks.cli.options import comma_list, seed_value
from benchmarks.perf.precision import PrecisionBenchSettings, run_precision_bench


def add_bench_precision_parser(which) -> None:
    defaults = PrecisionBenchSettings()
    p = which.add_parser("precision", help="each algorithm's training step at fp32, bf16 and bf16 with fp32 logits, "
                                           "per phase, side by side")
    p.add_argument("--matrix", default=defaults.matrix, help=f"matrix file whose variants are timed (default: {defaults.matrix})")
    p.add_argument("--task", default=None, help="the matrix's task label (default: its first)")
    p.add_argument("--variants", type=comma_list, default=None, help="comma-separated variants (default: all)")
    p.add_argument("--rounds", type=int, default=defaults.rounds, help=f"timed rounds after a warm-up (default: {defaults.rounds})")
    p.add_argument("--seed", type=seed_value, default=defaults.seed, help="seed of every side")
    p.add_argument("--threads", type=int, default=defaults.threads, help=f"torch threads (default: {defaults.threads}, a matrix cell's)")
    p.add_argument("--out", default=defaults.out, help=f"folder for precision.md and precision.json (default: {defaults.out})")
    p.add_argument("--resume", action="store_true", help="keep the variants OUT's precision.json measured with the same settings")
    p.set_defaults(handler=cmd_bench_precision)


def cmd_bench_precision(args) -> int:
    run_precision_bench(PrecisionBenchSettings(matrix=args.matrix, task=args.task, variants=args.variants,
                                               rounds=args.rounds, seed=args.seed, threads=args.threads, out=args.out,
                                               resume=args.resume), command=args.command_line)
    return 0
