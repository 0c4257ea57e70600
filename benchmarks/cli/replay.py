"""``grpo-bench replay STORE``: does a stored cell reproduce at its recorded commit and at HEAD? The engine is
benchmarks/matrix/replay.py; this module turns the flags into its arguments. ``replay --help`` imports neither torch
nor the store: the engine is imported by the handler, marked "heavy"."""

from __future__ import annotations

from benchmarks.cli.options import at_least_one, seed_value
from benchmarks.study import writable

HELP = "re-run stored cells of a result store at their recorded commit and at HEAD: do they reproduce bit for bit?"


def add_replay_parser(sub, name: str) -> None:
    p = sub.add_parser(name, help=HELP)
    p.add_argument("store", help="a matrix directory with its result store (DIR/results.parquet)")
    p.add_argument("--cells", type=at_least_one, default=None, metavar="K",
                   help="how many of the store's complete cells to replay, drawn at random (--seed)")
    p.add_argument("--cell", action="extend", nargs="+", default=None, metavar="NAME",
                   help="replay these cells (their paths in the store, as addition/grpo/seed7) instead of --cells")
    p.add_argument("--seed", type=seed_value, default=0, help="seed of the draw of --cells (default: 0)")
    p.add_argument("--at", choices=("recorded", "head", "both"), default="both",
                   help="run each cell at its recorded commit (a temporary git worktree), at HEAD, or both "
                        "(default: both)")
    p.add_argument("--out", default=None, help="the markdown page to write, its JSON beside it (default: "
                                               "results/replay/NAME.md, NAME the store's folder under results/)")
    p.set_defaults(handler=cmd_replay)


def cmd_replay(args) -> int:
    from benchmarks.errors import UsageError
    from benchmarks.matrix.replay import default_out, replay  # heavy: torch

    if args.cell and args.cells is not None:
        raise UsageError("--cells K draws cells at random, --cell NAME names them: give one of the two")
    out = writable(args.out or default_out(args.store), "--out")
    report = replay(args.store, count=args.cells, names=args.cell, seed=args.seed, at=args.at, out=out,
                    command=args.command_line, log=lambda line: print(line, flush=True))
    print(report["headline"])
    print(f"wrote {out} and {out.with_suffix('.json')}")
    return 0
