"""``grpo-bench bench grpo-vs-trl`` / ``rloo-vs-trl``: one GRPO / RLOO step of this suite against TRL's trainer,
TRL at its defaults and at its fastest setting side by side."""

from __future__ import annotations

import argparse

from benchmarks.cli.bench_executors import add_executors_parser
from benchmarks.cli.bench_lora import add_bench_lora_parser
from benchmarks.cli.bench_precision import add_bench_precision_parser
from benchmarks.cli.bench_revisions import add_bench_revisions_parser
from benchmarks.cli.bench_roof import add_bench_roof_parser
from benchmarks.cli.options import comma_list, seed_value
from benchmarks.perf.grpo_vs_trl import PerfSettings, default_workloads, run_bench, workloads_of


def _common(p, algo: str) -> None:
    choices = workloads_of(algo)
    default = ",".join(default_workloads(algo))
    p.add_argument("--workloads", default=default, help=f"comma-separated, from: {', '.join(choices)} (default: {default})")
    p.add_argument("--pairs", type=int, default=PerfSettings.pairs,
                   help="timed rounds (ours, TRL default, TRL fastest) per workload after one warm-up round (>= 5)")
    p.add_argument("--allow-few-pairs", action="store_true", help=argparse.SUPPRESS)  # for quick tests
    p.add_argument("--memory", action=argparse.BooleanOptionalAction, default=PerfSettings.memory,
                   help="measure each side's peak memory in its own subprocess (two optimizer updates)")
    p.add_argument("--max-new-tokens", type=int, default=PerfSettings.max_new_tokens,
                   help="override every workload's completion cap (quick runs)")
    p.add_argument("--seed", type=seed_value, default=PerfSettings.seed, help="seed of every side and of the prompt draws")
    p.add_argument("--device", default=PerfSettings.device, help="cpu, cuda or auto (cuda results go to results/gpu)")
    p.add_argument("--out", default=PerfSettings.out, help="output folder (default: results/perf, or results/gpu on CUDA)")
    p.add_argument("--model", default=PerfSettings.model,
                   help="hub id or local directory in place of the workloads' model (tasks that take one)")
    p.add_argument("--random-weights", action="store_true",
                   help="--model's architecture and tokenizer with seeded random weights (timing where its weights "
                        "cannot go; completions then seldom end before their cap)")
    again = p.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true",
                       help="keep OUT's measured workloads (same settings) and measure the planned ones it lacks")
    again.add_argument("--overwrite", action="store_true", help="replace OUT's report (else an existing one is refused)")
    p.add_argument("--rerender", action="store_true",
                   help="measure nothing: write OUT's report markdown (and the README section) again from its json")
    p.set_defaults(handler=cmd_bench, algo=algo)


def add_bench_parser(sub) -> None:
    bench = sub.add_parser("bench", help="performance benchmarks")
    which = bench.add_subparsers(dest="bench_command", required=True, parser_class=type(bench))
    p = which.add_parser("grpo-vs-trl", help="time one GRPO step of this suite against TRL's GRPOTrainer")
    _common(p, "grpo")
    p.add_argument("--bf16-steps", type=int, default=2, help="timed steps of our bf16-autocast step (0: skip)")
    p.add_argument("--scaling-steps", type=int, default=1, help="timed steps per scaling point, after one warm-up (0: skip)")
    p.add_argument("--readme", default=PerfSettings.readme, help="README whose 'perf' section is regenerated ('' to skip)")
    p = which.add_parser("rloo-vs-trl", help="time one RLOO step of this suite against TRL's RLOOTrainer")
    _common(p, "rloo")
    p.add_argument("--readme", default=PerfSettings.readme, help="README whose 'perf-rloo' section is regenerated ('' to skip)")
    p.set_defaults(bf16_steps=PerfSettings.bf16_steps, scaling_steps=PerfSettings.scaling_steps)  # RLOO's report has neither part
    add_executors_parser(which)
    add_bench_lora_parser(which)
    add_bench_roof_parser(which)
    add_bench_revisions_parser(which)
    add_bench_precision_parser(which)


def cmd_bench(args) -> int:
    settings = PerfSettings(
        algo=args.algo, workloads=comma_list(args.workloads), pairs=args.pairs,
        allow_few_pairs=args.allow_few_pairs, memory=args.memory, max_new_tokens=args.max_new_tokens, seed=args.seed,
        device=args.device, out=args.out, bf16_steps=args.bf16_steps, scaling_steps=args.scaling_steps,
        readme=args.readme, model=args.model, random_weights=args.random_weights, rerender=args.rerender,
        resume=args.resume, overwrite=args.overwrite)
    run_bench(settings, command=args.command_line)
    return 0
