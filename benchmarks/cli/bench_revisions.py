"""``grpo-bench bench revisions``: one GRPO step at several git revisions, side by side (benchmarks/perf/revisions.py).
Wire in with ``add_bench_revisions_parser(which)``."""

from __future__ import annotations

from benchmarks.cli.options import comma_list, seed_value
from benchmarks.perf.revisions import RevisionSettings, run_revisions


def add_bench_revisions_parser(which) -> None:
    defaults = RevisionSettings(revisions=[])
    p = which.add_parser("revisions", help="one GRPO step at several git revisions, side by side: what each change bought")
    p.add_argument("revisions", nargs="+", help="git revisions (commits, tags, branches), the baseline first")
    p.add_argument("--workloads", default=",".join(defaults.workloads),
                   help=f"comma-separated grpo-vs-trl workloads (default: {','.join(defaults.workloads)})")
    p.add_argument("--rounds", type=int, default=defaults.rounds, help=f"timed steps per revision after a warm-up (default: {defaults.rounds})")
    p.add_argument("--seed", type=seed_value, default=defaults.seed, help="seed of every worker and of the prompt draws")
    p.add_argument("--threads", type=int, default=defaults.threads, help="torch threads per worker (default: 0, torch's own)")
    p.add_argument("--device", default=defaults.device, help="cpu, cuda or auto")
    p.add_argument("--repo", default=defaults.repo, help="the git checkout the revisions belong to (default: .)")
    p.add_argument("--out", default=defaults.out, help=f"folder for revisions.md and revisions.json (default: {defaults.out})")
    p.set_defaults(handler=cmd_bench_revisions)


def cmd_bench_revisions(args) -> int:
    run_revisions(RevisionSettings(revisions=args.revisions, workloads=comma_list(args.workloads),
                                   rounds=args.rounds, seed=args.seed, threads=args.threads, device=args.device,
                                   repo=args.repo, out=args.out), command=args.command_line)
    return 0
