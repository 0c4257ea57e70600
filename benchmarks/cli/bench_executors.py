"""``grpo-bench bench executors FILE``: the matrix executors side by side (benchmarks/perf/executors.py)."""

from __future__ import annotations

from benchmarks.cli.options import seed_value
from benchmarks.perf.executors import ARMS, DEFAULT_JOBS, run_bench_executors


def add_executors_parser(which) -> None:
    e = which.add_parser("executors", help="a matrix in fresh processes one at a time and N at once, then in N warm "
                                           "workers: the warm start and the parallelism, each on its own")
    e.add_argument("file", help="matrix file (TOML), e.g. benchmarks/matrices/scaleout.toml")
    e.add_argument("--out", default="results/executors", help="folder for executors.md/json and every arm's run (default: results/executors)")
    e.add_argument("--jobs", type=int, default=DEFAULT_JOBS,
                   help=f"N: cells at once in the fresh-N and warm-N arms, each on cores // N torch threads (default: {DEFAULT_JOBS})")
    e.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS),
                   help="the arms to run (default: all): " + "; ".join(
                       f"{name}: {arm.what.format(n='N')}" for name, arm in ARMS.items()))
    e.add_argument("--seeds", type=seed_value, nargs="+", default=None,
                   help="run only the matrix's cells of these seeds (default: every seed)")
    e.add_argument("--spread-from", default=None, metavar="DIR",
                   help="a finished run of the same matrix (e.g. results/cpu): a cell whose accuracy differs between "
                        "the arms is judged against its variant's standard deviation over seeds there")
    e.add_argument("--rerender", action="store_true",
                   help="do not run: re-read the finished comparison in --out and write its report again")
    e.add_argument("--readme", default=None, help="README whose 'executors' section is regenerated")
    e.add_argument("--section", default="executors", help="name of the README section to regenerate (default: executors)")
    e.set_defaults(handler=cmd_bench_executors)


def cmd_bench_executors(args) -> int:
    result = run_bench_executors(args.file, args.out, jobs=args.jobs, arms=args.arms, readme=args.readme, seeds=args.seeds,
                                 section=args.section, spread_from=args.spread_from, rerender=args.rerender)
    return 0 if all(r["counts"]["failed"] == 0 for r in result["runs"].values()) else 1
