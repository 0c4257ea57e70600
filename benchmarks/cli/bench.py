"""``grpo-bench bench grpo-vs-trl`` / ``rloo-vs-trl``: one GRPO / RLOO step of this suite against TRL's trainer,
TRL at its defaults and at its fastest setting side by side."""

from __future__ import annotations

import argparse

from benchmarks.cli.bench_executors import add_executors_parser
from benchmarks.cli.bench_lora import add_bench_lora_parser
from benchmarks.perf.grpo_vs_trl import workloads_of


def _common(p, algo: str) -> None:
    choices = workloads_of(algo)
    default = ",".join(choices) if algo == "grpo" else next(iter(choices))
    p.add_argument("--workloads", default=default, help=f"comma-separated, from: {', '.join(choices)} (default: {default})")
    p.add_argument("--pairs", type=int, default=5,
                   help="timed rounds (ours, TRL default, TRL fastest) per workload after one warm-up round (>= 5)")
    p.add_argument("--allow-few-pairs", action="store_true", help=argparse.SUPPRESS)  # for quick tests
    p.add_argument("--memory", action=argparse.BooleanOptionalAction, default=True,
                   help="measure each side's peak memory in its own subprocess (two optimizer updates)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="override every workload's completion cap (quick runs)")
    p.add_argument("--seed", type=int, default=0, help="seed of every side and of the prompt draws")
    p.add_argument("--device", default="cpu", help="cpu, cuda or auto (cuda results go to results/gpu)")
    p.add_argument("--out", default=None, help="output folder (default: results/perf, or results/gpu on CUDA)")
    p.set_defaults(handler=cmd_bench, algo=algo)


def add_bench_parser(sub) -> None:
    bench = sub.add_parser("bench", help="performance benchmarks")
    which = bench.add_subparsers(dest="bench_command", required=True, parser_class=type(bench))
    p = which.add_parser("grpo-vs-trl", help="time one GRPO step of this suite against TRL's GRPOTrainer")
    _common(p, "grpo")
    p.add_argument("--bf16-steps", type=int, default=2, help="timed steps of our bf16-autocast step (0: skip)")
    p.add_argument("--scaling-steps", type=int, default=1, help="timed steps per scaling point, after one warm-up (0: skip)")
    p.add_argument("--readme", default="README.md", help="README whose 'perf' section is regenerated ('' to skip)")
    p = which.add_parser("rloo-vs-trl", help="time one RLOO step of this suite against TRL's RLOOTrainer")
    _common(p, "rloo")
    p.add_argument("--readme", default="README.md", help="README whose 'perf-rloo' section is regenerated ('' to skip)")
    add_executors_parser(which)
    add_bench_lora_parser(which)


def _given_flags(args) -> list[str]:
    """The flags as given, for the report's "Regenerate:" line."""
    flags = []
    for key in ("workloads", "pairs", "max_new_tokens", "bf16_steps", "scaling_steps", "seed", "device"):
        if getattr(args, key, None) is not None:
            flags += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    if not args.memory:
        flags.append("--no-memory")
    return flags


def cmd_bench(args) -> int:
    from benchmarks.perf.grpo_vs_trl import run_bench

    args.argv = _given_flags(args)
    run_bench(args)
    return 0
