"""``grpo-bench bench lora``: parameter, gradient, optimizer and peak memory of GRPO on GSM8K with and without
LoRA, ours and TRL's GRPOTrainer (benchmarks/perf/lora.py). Wire in with ``add_bench_lora_parser(which)``,
where ``which`` is the ``bench`` subcommand's sub-parsers."""

from __future__ import annotations

from pathlib import Path

from benchmarks.cli.options import comma_list
from benchmarks.errors import UsageError
from benchmarks.perf.lora import SIDES, Settings, run_bench


def add_bench_lora_parser(which) -> None:
    defaults = Settings()
    p = which.add_parser("lora", help="GRPO on GSM8K with and without LoRA, ours and TRL's: bytes and peak memory")
    p.add_argument("--steps", type=int, default=defaults.steps, help=f"GRPO steps per side (default: {defaults.steps})")
    p.add_argument("--group-size", type=int, default=defaults.group_size, help=f"G (default: {defaults.group_size})")
    p.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens,
                   help=f"completion cap (default: {defaults.max_new_tokens})")
    p.add_argument("--lora-r", type=int, default=defaults.lora_r, help=f"LoRA rank (default: {defaults.lora_r}, TRL's)")
    p.add_argument("--sides", default=",".join(SIDES), help=f"comma-separated, from: {', '.join(SIDES)} (default: all)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or auto (default: cpu)")
    p.add_argument("--out", default="results/lora", help="folder for report.md and results.json (default: results/lora)")
    p.set_defaults(handler=cmd_bench_lora)


def cmd_bench_lora(args) -> int:
    sides = comma_list(args.sides)
    unknown = [s for s in sides if s not in SIDES]
    if unknown or not sides:
        raise UsageError(f"--sides: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(SIDES)}")
    if args.steps < 1 or args.group_size < 2 or args.max_new_tokens < 1 or args.lora_r < 1:
        raise UsageError("--steps >= 1, --group-size >= 2, --max-new-tokens >= 1 and --lora-r >= 1, please")
    settings = Settings(steps=args.steps, group_size=args.group_size, max_new_tokens=args.max_new_tokens,
                        lora_r=args.lora_r, device=args.device)
    report = run_bench(settings, Path(args.out), sides)
    print((Path(args.out) / "report.md").read_text())
    return 0 if report["sides"] else 1
